"""hnswlib side of the churn benchmark (`shoal-loadtest churn`).

Replays a churn plan (format shoal-churn-plan/1, written by the Rust side) on
hnswlib and measures, after the initial build (round 0) and after every round,
the same figures as shoal's churn run, plus those of a fresh hnswlib index built
from the same live set:

  python churn_hnswlib.py --base base.fvecs --query query.fvecs --plan plan.jsonl \
      --metric cosine --m 16 --ef-construction 100 --threads 2 --ef 64 --k 10 \
      [--queries 1000] [--fresh-every 1] [--json out.json]

Strategy: deletes are `mark_deleted(label)`; upserts of live labels are
`add_items` (hnswlib updates a live label in place, repairing its neighbours'
links); inserts are `add_items(..., replace_deleted=True)` on an index made
with `allow_replace_deleted=True`, so new points take over the slots of
deleted ones. `resize_index` is called only if the inserts outnumber the free
slots.

recall is recall@k at --ef against exact top-k (numpy brute force, in chunks)
over the live set with its current vectors; qps is single-thread, one
`knn_query` per query as in ../../../shared/peers/bench.py (only the query
calls are timed); build and apply use --threads. `tombstones` is
`get_current_count() - live`: slots held by deleted points not yet reused
(checked every round against `get_ids_list()`, which lists deleted labels
until their slot is taken over).

See README.md next to this file for the plan format.
"""
import argparse, json, os, sys, tempfile, time
import numpy as np

FORMAT = "shoal-churn-plan/1"
SPACES = {"cosine": "cosine", "dot": "ip", "euclidean": "l2"}


def read_vecs(path, dtype):
    raw = np.fromfile(path, dtype=np.int32)
    d = raw[0]
    return raw.reshape(-1, d + 1)[:, 1:].view(dtype).copy()


def normalise(v):
    n = np.linalg.norm(v, axis=1, keepdims=True)
    n[n == 0] = 1
    return (v / n).astype(np.float32, copy=False)


def entry_vectors(base, entries):
    """[id, a, b, w] entries -> (ids uint64, float32 vectors normalise(w*base[a] + (1-w)*base[b]))."""
    if not entries:
        return np.empty(0, np.uint64), np.empty((0, base.shape[1]), np.float32)
    ids = np.fromiter((e[0] for e in entries), dtype=np.uint64, count=len(entries))
    a = np.fromiter((e[1] for e in entries), dtype=np.int64, count=len(entries))
    b = np.fromiter((e[2] for e in entries), dtype=np.int64, count=len(entries))
    w = np.fromiter((e[3] for e in entries), dtype=np.float32, count=len(entries))
    if a.max() >= len(base) or b.max() >= len(base) or min(a.min(), b.min()) < 0:
        raise SystemExit(f"plan refers to a base row outside 0..{len(base) - 1}")
    wc = w[:, None]
    v = normalise(wc * base[a] + (np.float32(1) - wc) * base[b])
    one = w == 1
    v[one] = base[a[one]]
    return ids, v


class Live:
    """The live set with current vectors (the exact-search side), rows reused after deletes."""

    def __init__(self, dim, cap):
        self.vec = np.empty((cap, dim), np.float32)
        self.ids = np.zeros(cap, np.uint64)
        self.alive = np.zeros(cap, bool)
        self.row = {}          # id -> row
        self.free = []
        self.n = 0             # rows in use (high-water mark)
        self.ever = set()      # every id ever inserted

    def __len__(self):
        return len(self.row)

    def add(self, ids, vecs):
        for i, v in zip(ids.tolist(), vecs):
            if i in self.ever:
                raise SystemExit(f"plan inserts id {i}, which was used before")
            if self.free:
                r = self.free.pop()
            else:
                if self.n == len(self.vec):
                    cap = max(16, 2 * len(self.vec))
                    self.vec = np.resize(self.vec, (cap, self.vec.shape[1]))
                    self.ids = np.resize(self.ids, cap)
                    self.alive = np.concatenate([self.alive, np.zeros(cap - len(self.alive), bool)])
                r = self.n; self.n += 1
            self.vec[r] = v; self.ids[r] = i; self.alive[r] = True
            self.row[i] = r; self.ever.add(i)

    def update(self, ids, vecs):
        for i, v in zip(ids.tolist(), vecs):
            r = self.row.get(i)
            if r is None:
                raise SystemExit(f"plan upserts id {i}, which is not live")
            self.vec[r] = v

    def remove(self, ids):
        for i in ids:
            r = self.row.pop(i, None)
            if r is None:
                raise SystemExit(f"plan deletes id {i}, which is not live")
            self.alive[r] = False; self.free.append(r)

    def sorted_arrays(self):
        rows = np.flatnonzero(self.alive[: self.n])
        rows = rows[np.argsort(self.ids[rows], kind="stable")]
        return self.ids[rows], self.vec[rows]

    def exact_topk(self, query, metric, k, chunk_bytes=64 << 20):
        """Exact top-k labels of each query over the live rows, in chunks of rows."""
        nq = len(query)
        q = normalise(query) if metric == "cosine" else query
        best_s = np.full((nq, 0), -np.inf, np.float32); best_r = np.zeros((nq, 0), np.int64)
        step = max(1024, chunk_bytes // (4 * max(1, nq)))
        for s in range(0, self.n, step):
            e = min(self.n, s + step)
            x = self.vec[s:e]
            sc = q @ x.T                                   # cosine: live vectors are unit
            if metric == "euclidean":
                sc = 2 * sc - (x * x).sum(1)[None, :]      # -(|x|^2 - 2 q.x), |q|^2 dropped
            sc[:, ~self.alive[s:e]] = -np.inf
            kk = min(k, e - s)
            part = np.argpartition(-sc, kk - 1, axis=1)[:, :kk]
            cs = np.concatenate([best_s, np.take_along_axis(sc, part, 1)], 1)
            cr = np.concatenate([best_r, part + s], 1)
            kk = min(k, cs.shape[1])
            top = np.argpartition(-cs, kk - 1, axis=1)[:, :kk]
            best_s = np.take_along_axis(cs, top, 1); best_r = np.take_along_axis(cr, top, 1)
        return self.ids[best_r]


def new_index(hnswlib, a, dim, cap):
    ix = hnswlib.Index(space=SPACES[a.metric], dim=dim)
    ix.init_index(max_elements=cap, M=a.m, ef_construction=a.ef_construction, random_seed=1,
                  allow_replace_deleted=True)
    ix.set_num_threads(a.threads)
    return ix


def search(ix, query, k, ef):
    """Single-thread, one knn_query per query; returns (labels, qps)."""
    ix.set_ef(max(ef, k))
    out = np.empty((len(query), k), np.uint64)
    t0 = time.perf_counter()
    for i, q in enumerate(query):
        labels, _ = ix.knn_query(q[None, :], k=k, num_threads=1)
        out[i] = labels[0]
    return out, len(query) / (time.perf_counter() - t0)


def recall(got, gt):
    k = gt.shape[1]
    return sum(len(set(g.tolist()) & set(t.tolist())) for g, t in zip(got, gt)) / (k * len(gt))


def disk_bytes(ix):
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "ix.bin"); ix.save_index(p); return os.path.getsize(p)


def check_tombstones(ix, live, deleted_sample):
    """tombstones = get_current_count() - live; verify it against the labels hnswlib holds."""
    held = ix.get_ids_list()
    slots = ix.get_current_count()
    if len(held) != slots:
        raise SystemExit(f"hnswlib holds {len(held)} labels in {slots} slots")
    held = set(held)
    missing = [i for i in live.row if i not in held]
    if missing:
        raise SystemExit(f"{len(missing)} live ids missing from the index, e.g. {missing[:5]}")
    dead = held.difference(live.row)
    if len(dead) != slots - len(live):
        raise SystemExit(f"tombstone mismatch: {len(dead)} deleted labels held, {slots - len(live)} by count")
    for lab in list(dead)[:3] + [x for x in deleted_sample if x in dead][:3]:
        try:
            ix.get_items([lab])
            raise SystemExit(f"deleted label {lab} is still readable")
        except RuntimeError:
            pass
    return slots - len(live)


def check_vectors(ix, live, ids, metric):
    """Spot-check that the index holds the current vectors of a few written ids."""
    if len(ids) == 0:
        return
    pick = ids[:: max(1, len(ids) // 5)][:5]
    got = np.asarray(ix.get_items(pick.tolist()), np.float32)
    want = np.stack([live.vec[live.row[i]] for i in pick.tolist()])
    if metric == "cosine":
        want = normalise(want)
    if not np.allclose(got, want, atol=1e-5):
        raise SystemExit(f"index holds stale vectors for some of ids {pick.tolist()}")


def fmt_row(r):
    def f(x, spec, w):
        return format(x, spec).rjust(w) if x is not None else "-".rjust(w)
    mib = lambda x: x / (1 << 20) if x is not None else None
    return (f"{r['round']:>5} {r['live']:>8} {r['tombstones']:>6} {r['apply_seconds']:>9.2f} "
            f"{r['apply_ms_per_op']:>7.3f} {r['recall']:>7.4f} {f(r['fresh_recall'], '.4f', 7)} "
            f"{r['qps']:>7.0f} {f(r['fresh_qps'], '.0f', 7)} {mib(r['disk_bytes']):>8.1f} "
            f"{f(mib(r['fresh_disk_bytes']), '.1f', 8)} {f(r['fresh_build_seconds'], '.1f', 7)}")


HEADER = (f"{'round':>5} {'live':>8} {'tomb':>6} {'apply_s':>9} {'ms/op':>7} {'recall':>7} {'fresh':>7} "
          f"{'qps':>7} {'fresh':>7} {'disk_MiB':>8} {'fresh':>8} {'build_s':>7}")


def write_json(path, out):
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=2)
        os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True); ap.add_argument("--query", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--metric", default="cosine", choices=SPACES)
    ap.add_argument("--m", type=int, default=16); ap.add_argument("--ef-construction", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ef", type=int, default=64); ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--fresh-every", type=int, default=1,
                    help="measure a fresh build on rounds divisible by K and on the last round (0: never)")
    ap.add_argument("--json")
    a = ap.parse_args()
    import hnswlib
    try:
        from importlib.metadata import version
        hv = version("hnswlib")
    except Exception:
        hv = None

    wall0 = time.perf_counter()
    with open(a.plan, encoding="utf-8") as f:
        lines = [l for l in f if l.strip()]
    header = json.loads(lines[0])
    if header.get("format") != FORMAT:
        raise SystemExit(f"{a.plan}: format {header.get('format')!r}, expected {FORMAT!r}")
    round_lines = lines[1:]
    if header.get("rounds") is not None and header["rounds"] != len(round_lines):
        print(f"warning: header says {header['rounds']} rounds, plan has {len(round_lines)}", file=sys.stderr)
    last = len(round_lines)
    limit = int(header["limit"])

    base = read_vecs(a.base, np.float32)
    query = read_vecs(a.query, np.float32)[: a.queries]
    dim = base.shape[1]
    if header.get("dim") not in (None, dim):
        raise SystemExit(f"plan dim {header['dim']} != base dim {dim}")
    if limit > len(base):
        raise SystemExit(f"plan limit {limit} > {len(base)} base vectors")

    live = Live(dim, int(limit * 1.2) + 16)
    init_ids = np.arange(limit, dtype=np.uint64)
    live.add(init_ids, base[:limit])

    out = {"lib": "hnswlib", "hnswlib_version": hv,
           "strategy": "replace_deleted: deletes are mark_deleted (tombstones, still walked by searches); "
                       "upserts of live labels are add_items, updated in place (updatePoint repairs the "
                       "neighbours' links); inserts are add_items(replace_deleted=True) on an index made with "
                       "allow_replace_deleted=True, so new points take over deleted points' slots; "
                       "resize_index only when inserts outnumber free slots",
           "params": {"m": a.m, "ef_construction": a.ef_construction, "threads": a.threads,
                      "metric": a.metric, "space": SPACES[a.metric], "ef": a.ef, "k": a.k,
                      "fresh_every": a.fresh_every},
           "plan": {"path": a.plan, "format": header.get("format"), "seed": header.get("seed"),
                    "rounds": last},
           "limit": limit, "queries": len(query),
           "notes": "tombstones = get_current_count() - live (slots held by deleted points not yet reused), "
                    "verified against get_ids_list(); tombstones_after_deletes is the same count between the "
                    "round's deletes and its inserts. Round 0 is the initial build: its apply_* are the build "
                    "time and its fresh_* figures are its own. qps times only the knn_query calls.",
           "rounds": []}

    print(HEADER, flush=True)

    # Round 0: the initial build (it is a fresh build, so its fresh_* figures are its own).
    ix = new_index(hnswlib, a, dim, limit)
    t0 = time.perf_counter()
    ix.add_items(base[:limit], init_ids, num_threads=a.threads)
    build_s = time.perf_counter() - t0
    got, qps = search(ix, query, a.k, a.ef)
    disk = disk_bytes(ix)
    gt = live.exact_topk(query, a.metric, a.k)
    rec = recall(got, gt)
    r0 = {"round": 0, "deletes": 0, "upserts": 0, "inserts": limit, "live": len(live),
          "slots": ix.get_current_count(), "capacity": ix.get_max_elements(),
          "tombstones": check_tombstones(ix, live, []), "tombstones_after_deletes": 0, "resized": False,
          "apply_seconds": round(build_s, 3), "apply_ms_per_op": round(build_s * 1000 / limit, 4),
          "delete_ms_per_op": None, "upsert_ms_per_op": None, "insert_ms_per_op": round(build_s * 1000 / limit, 4),
          "recall": round(rec, 4), "qps": round(qps, 1), "disk_bytes": disk,
          "fresh_recall": round(rec, 4), "fresh_qps": round(qps, 1), "fresh_disk_bytes": disk,
          "fresh_build_seconds": round(build_s, 3)}
    out["rounds"].append(r0); print(fmt_row(r0), flush=True); write_json(a.json, out)

    for n, line in enumerate(round_lines, start=1):
        plan = json.loads(line)
        if plan.get("round") != n:
            raise SystemExit(f"plan line {n + 1}: round {plan.get('round')}, expected {n}")
        dels = [int(x) for x in plan.get("delete", [])]
        up_ids, up_vecs = entry_vectors(base, plan.get("upsert", []))
        in_ids, in_vecs = entry_vectors(base, plan.get("insert", []))
        for name, ids in (("delete", dels), ("upsert", up_ids.tolist()), ("insert", in_ids.tolist())):
            if len(set(ids)) != len(ids):
                raise SystemExit(f"round {n}: duplicate ids in {name}")

        # Mirror first (validates the plan), then apply to hnswlib with only that timed.
        live.remove(dels)
        live.update(up_ids, up_vecs)
        live.add(in_ids, in_vecs)

        t0 = time.perf_counter()
        for lab in dels:
            ix.mark_deleted(lab)
        t1 = time.perf_counter()
        if len(up_ids):
            ix.add_items(up_vecs, up_ids, num_threads=a.threads)
        t2 = time.perf_counter()
        slots = ix.get_current_count()
        tomb_mid = slots - (len(live) - len(in_ids))
        need = slots + max(0, len(in_ids) - tomb_mid)
        resized = need > ix.get_max_elements()
        if resized:
            ix.resize_index(need)
        if len(in_ids):
            ix.add_items(in_vecs, in_ids, num_threads=a.threads, replace_deleted=True)
        t3 = time.perf_counter()
        ops = len(dels) + len(up_ids) + len(in_ids)
        ms = lambda s, c: round(s * 1000 / c, 4) if c else None

        tomb = check_tombstones(ix, live, dels[:3])
        check_vectors(ix, live, up_ids, a.metric); check_vectors(ix, live, in_ids, a.metric)
        got, qps = search(ix, query, a.k, a.ef)
        disk = disk_bytes(ix)
        row = {"round": n, "deletes": len(dels), "upserts": len(up_ids), "inserts": len(in_ids),
               "live": len(live), "slots": ix.get_current_count(), "capacity": ix.get_max_elements(),
               "tombstones": tomb, "tombstones_after_deletes": tomb_mid, "resized": resized,
               "apply_seconds": round(t3 - t0, 3), "apply_ms_per_op": ms(t3 - t0, ops),
               "delete_ms_per_op": ms(t1 - t0, len(dels)), "upsert_ms_per_op": ms(t2 - t1, len(up_ids)),
               "insert_ms_per_op": ms(t3 - t2, len(in_ids)),
               "qps": round(qps, 1), "disk_bytes": disk,
               "fresh_recall": None, "fresh_qps": None, "fresh_disk_bytes": None, "fresh_build_seconds": None}
        fresh = None
        if (a.fresh_every > 0 and n % a.fresh_every == 0) or n == last:
            ids, vecs = live.sorted_arrays()
            fx = new_index(hnswlib, a, dim, len(ids))
            t0 = time.perf_counter()
            fx.add_items(vecs, ids, num_threads=a.threads)
            fb = time.perf_counter() - t0
            del vecs
            fgot, fqps = search(fx, query, a.k, a.ef)
            fdisk = disk_bytes(fx)
            del fx
            fresh = (fgot, fqps, fdisk, fb)
        gt = live.exact_topk(query, a.metric, a.k)   # after the timed parts: BLAS threads stay out of them
        row["recall"] = round(recall(got, gt), 4)
        if fresh:
            fgot, fqps, fdisk, fb = fresh
            row.update(fresh_recall=round(recall(fgot, gt), 4), fresh_qps=round(fqps, 1),
                       fresh_disk_bytes=fdisk, fresh_build_seconds=round(fb, 3))
        out["rounds"].append(row); print(fmt_row(row), flush=True)
        out["wall_seconds"] = round(time.perf_counter() - wall0, 1)
        write_json(a.json, out)

    out["wall_seconds"] = round(time.perf_counter() - wall0, 1)
    write_json(a.json, out)
    print(f"wall {out['wall_seconds']}s", flush=True)


if __name__ == "__main__":
    main()
