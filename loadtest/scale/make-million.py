"""A deterministic 1M-point stand-in for real sentence embeddings (issue 22, "Scale").

The pypi set (../shared/datasets/pypi: 120,000 base + 1,000 query vectors,
384-d, all-MiniLM-L6-v2, cosine) does not reach a million points, so this
makes 1,001,000 base vectors out of it:

  each vector mixes 2 or 3 distinct pypi base vectors (half of them 2,
  half 3, chosen uniformly at random) with weights drawn from a symmetric
  Dirichlet(alpha = 5); the mixture is taken around the pypi mean vector
  mu: m = mu + s * sum_i w_i (x_i - mu), where s scales the mixed residual
  back to the weighted mean length of its parts' residuals; then m is
  normalised to unit length.

Why this recipe (docs/scale.md has the measurements):
- Not noisy copies of one vector: those would make tight clusters of
  near-duplicates (each pypi vector would have ~8 copies at 1M), and
  recall would measure how a library breaks ties inside them.
- alpha = 5 rather than 1 or 3: with Dirichlet(1) a fifth of the 2-part
  mixtures are dominated (weight > 0.9) by one part, i.e. near-copies
  again (near-duplicate rate of a 120k stand-in 11% against pypi's
  0.8%); with alpha = 3 the 1M set still had 5.7% near-duplicates and a
  median nearest-neighbour cosine of 0.82, where pypi's growth from 15k
  to 120k extrapolates to ~0.77 at 1M; alpha = 5 gives 0.95% and 0.78.
- Around the mean: a plain mixture of unit vectors pulls every point
  towards the common direction mu (pypi's |mu| is 0.35), so pairs
  become more alike (mean pairwise cosine 0.22 against pypi's 0.12) and
  the set loses contrast. Mixing the residuals and restoring their length
  keeps the pairwise cosines of real data (0.118 vs 0.120).

Queries are the 1,000 real pypi queries (summaries of other packages, not
in the base): a real search asks with a real embedding, and mixtures made
of query vectors are farther from everything than real queries are (their
parts are not in the base), which makes the set harder than real data.

Writes into --out (default $MILLION, else /work/scratch/million; refused
inside a git work tree):
  base.fvecs         1,001,000 x 384 float32 (the index is the first
                     1,000,000; the last 1,000 are for "1k into 1M")
  query.fvecs        the 1,000 pypi queries, unchanged
  groundtruth.ivecs  exact top-100 ids among the first 1,000,000 base
                     vectors for each query (faiss IndexFlatIP on unit
                     vectors), nearest first
  groundtruth-all.ivecs  the same over all 1,001,000 rows, for runs that
                     index the whole file (index-bench and bench.py
                     without --limit do: 14 of the 10,000 top-10 places
                     go to the last 1,000 rows)
  meta.json          recipe, seed, counts, sha256 of the files, and the
                     statistics that compare the stand-in with pypi
Idempotent: with all files present and the same recipe in meta.json it
only prints the statistics (--force to redo).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np

N_DEFAULT, EXTRA_DEFAULT, K_GT = 1_000_000, 1_000, 100
CHUNK = 100_000  # rows generated per RNG stream; part of the recipe


def read_vecs(path, dtype):
    raw = np.fromfile(path, dtype=np.int32)
    d = int(raw[0])
    return raw.reshape(-1, d + 1)[:, 1:].view(dtype).copy()


def vecs_rows(arr, dtype):
    arr = np.ascontiguousarray(arr, dtype=dtype)
    n, d = arr.shape
    out = np.empty((n, d + 1), dtype=dtype)
    out.view(np.int32)[:, 0] = d
    out[:, 1:] = arr
    return out


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def inside_git_tree(path):
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        p = os.path.dirname(p)
    r = subprocess.run(["git", "-C", p, "rev-parse", "--is-inside-work-tree"], capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip() == "true"


def mix_chunk(src, resid, rnorm, mu, rows, seed, chunk, alpha):
    """Rows of chunk `chunk`; its own RNG stream, so any chunk can be made alone."""
    rng = np.random.default_rng([seed, chunk])
    parts = rng.integers(2, 4, size=rows)  # 2 or 3
    # three distinct sources per row (the third is unused for 2-part rows)
    idx = rng.integers(0, len(src), size=(rows, 3))
    while True:  # redraw the rare repeats
        bad = (idx[:, 0] == idx[:, 1]) | (idx[:, 0] == idx[:, 2]) | (idx[:, 1] == idx[:, 2])
        if not bad.any():
            break
        idx[bad] = rng.integers(0, len(src), size=(int(bad.sum()), 3))
    w = rng.dirichlet([alpha] * 3, size=rows).astype(np.float32)
    w[parts == 2, 2] = 0.0
    w /= w.sum(axis=1, keepdims=True)
    out = np.zeros((rows, src.shape[1]), np.float32)
    target = np.zeros(rows, np.float32)
    for c in range(3):
        out += w[:, c : c + 1] * resid[idx[:, c]]
        target += w[:, c] * rnorm[idx[:, c]]
    out *= (target / np.linalg.norm(out, axis=1))[:, None]
    out += mu
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out, idx, parts


def percentiles(x):
    return {f"p{p}": round(float(v), 4) for p, v in zip((10, 50, 90), np.percentile(x, [10, 50, 90]))}


def neighbour_stats(name, base, queries, nn_sample, faiss, k=100, qD=None):
    """Query-to-base and base-to-base statistics of one set (cosine on unit vectors)."""
    ix = faiss.IndexFlatIP(base.shape[1])
    ix.add(base)
    if qD is None:
        qD, _ = ix.search(queries, k)
    dist = np.sqrt(np.maximum(2.0 - 2.0 * qD, 1e-12))  # Euclidean distance between unit vectors
    lid = -1.0 / np.mean(np.log(dist[:, : k - 1] / dist[:, k - 1 : k]), axis=1)  # MLE (Levina-Bickel)
    rs = np.random.default_rng(5).choice(len(base), nn_sample, replace=False)
    bD, bI = ix.search(base[rs], 2)
    nn = np.where(bI[:, 0] == rs, bD[:, 1], bD[:, 0])
    s = base[rs[:1000]]
    pc = (s @ s.T)[np.triu_indices(1000, 1)]
    out = {
        "base": len(base),
        "query_top1_cos": percentiles(qD[:, 0]),
        "query_top10_cos": percentiles(qD[:, 9]),
        "query_top100_cos": percentiles(qD[:, 99]),
        "query_lid_at_100_median": round(float(np.median(lid)), 1),
        "base_nn_cos": percentiles(nn),
        "base_near_duplicates_095": round(float(np.mean(nn > 0.95)), 4),
        "base_near_duplicates_099": round(float(np.mean(nn > 0.99)), 4),
        "base_nn_sample": nn_sample,
        "pairwise_cos_mean": round(float(pc.mean()), 4),
        "pairwise_cos_sd": round(float(pc.std()), 4),
    }
    q1, q10, bn = out["query_top1_cos"], out["query_top10_cos"], out["base_nn_cos"]
    log(f"{name:<28} n={len(base):>9,}  query top-1 cos p10/50/90 {q1['p10']:.3f}/{q1['p50']:.3f}/{q1['p90']:.3f}  "
        f"top-10 {q10['p10']:.3f}/{q10['p50']:.3f}/{q10['p90']:.3f}  LID {out['query_lid_at_100_median']}  "
        f"base NN cos p50 {bn['p50']:.3f}  near-dup >0.95 {out['base_near_duplicates_095']:.2%} "
        f">0.99 {out['base_near_duplicates_099']:.2%}  pairwise cos {out['pairwise_cos_mean']:.3f}±{out['pairwise_cos_sd']:.3f}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--dataset", default=os.environ.get("DATASET") or os.path.join(here, "../../../shared/datasets/pypi"),
                    help="the pypi set (base.fvecs, query.fvecs); default $DATASET, else ../shared/datasets/pypi")
    ap.add_argument("--out", default=os.environ.get("MILLION") or "/work/scratch/million")
    ap.add_argument("--n", type=int, default=N_DEFAULT, help="vectors the ground truth covers (the index)")
    ap.add_argument("--extra", type=int, default=EXTRA_DEFAULT, help="more vectors after them, for inserts")
    ap.add_argument("--seed", type=int, default=22)
    ap.add_argument("--alpha", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--check-rows", type=int, default=5, help="ground-truth rows checked by numpy brute force")
    ap.add_argument("--nn-sample", type=int, default=2000, help="base vectors whose nearest neighbour is measured")
    ap.add_argument("--no-stats", action="store_true", help="skip the comparison with pypi")
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()

    import faiss
    faiss.omp_set_num_threads(a.threads)
    out_dir = os.path.abspath(a.out)
    if inside_git_tree(out_dir):
        sys.exit(f"{out_dir} is inside a git work tree; write the 1.5 GB set elsewhere (--out or $MILLION)")
    os.makedirs(out_dir, exist_ok=True)
    recipe = {"generator": "loadtest/scale/make-million.py", "n": a.n, "extra": a.extra, "seed": a.seed,
              "alpha": a.alpha, "parts": "2 or 3 (uniform)", "chunk": CHUNK, "mixing": "around the pypi mean, "
              "residual rescaled to the weighted mean residual length, then unit length"}
    paths = {f: os.path.join(out_dir, f) for f in ("base.fvecs", "query.fvecs", "groundtruth.ivecs", "groundtruth-all.ivecs",
                                                   "meta.json")}
    if not a.force and all(os.path.exists(p) for p in paths.values()):
        meta = json.load(open(paths["meta.json"]))
        if meta.get("recipe") == recipe:
            log(f"{out_dir} is ready (same recipe); --force to redo")
            print(json.dumps(meta.get("stats", {}), indent=2))
            return

    t_all = time.time()
    src = read_vecs(os.path.join(a.dataset, "base.fvecs"), np.float32)
    queries = read_vecs(os.path.join(a.dataset, "query.fvecs"), np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    src /= np.linalg.norm(src, axis=1, keepdims=True)
    mu = src.mean(axis=0, dtype=np.float64).astype(np.float32)
    resid = src - mu
    rnorm = np.linalg.norm(resid, axis=1)
    log(f"pypi: {len(src):,} base, {len(queries):,} queries, dim {src.shape[1]}; |mean| {np.linalg.norm(mu):.3f}")

    # Base: generated chunk by chunk and written as it goes.
    total = a.n + a.extra
    dim = src.shape[1]
    base = np.empty((total, dim), np.float32)
    pair_keys = []
    t = time.time()
    tmp = paths["base.fvecs"] + ".tmp"
    with open(tmp, "wb") as f:
        for c, start in enumerate(range(0, total, CHUNK)):
            rows = min(CHUNK, total - start)
            m, idx, parts = mix_chunk(src, resid, rnorm, mu, rows, a.seed, c, a.alpha)
            base[start : start + rows] = m
            vecs_rows(m, np.float32).tofile(f)
            s = np.sort(idx[:, :2], axis=1).astype(np.int64)
            pair_keys.append(s[:, 0] * len(src) + s[:, 1])
    os.replace(tmp, paths["base.fvecs"])
    log(f"base.fvecs: {total:,} vectors in {time.time() - t:.1f}s")
    pk = np.concatenate(pair_keys)
    shared_pairs = int(len(pk) - len(np.unique(pk)))

    vecs_rows(queries, np.float32).tofile(paths["query.fvecs"])

    # Exact ground truth over the first n.
    t = time.time()
    ix = faiss.IndexFlatIP(dim)
    ix.add(base[: a.n])
    D, I = ix.search(queries, K_GT)
    del ix
    gt_secs = time.time() - t
    vecs_rows(I.astype(np.int32), np.int32).tofile(paths["groundtruth.ivecs"])
    log(f"groundtruth.ivecs: top-{K_GT} over {a.n:,} for {len(queries):,} queries in {gt_secs:.1f}s (faiss IndexFlatIP)")

    # A few rows by numpy brute force (ties may swap equal scores).
    rows = np.random.default_rng(a.seed + 1).choice(len(queries), a.check_rows, replace=False)
    checks = []
    for r in rows:
        sims = base[: a.n] @ queries[r]
        order = np.argsort(-sims, kind="stable")[:K_GT]
        same = int(np.sum(order == I[r]))
        score_err = float(np.max(np.abs(sims[order] - D[r])))
        checks.append({"query": int(r), "same_ids_in_place": same, "max_score_diff": score_err})
        if same < K_GT and not np.allclose(np.sort(sims[I[r]])[::-1], sims[order], atol=1e-5):
            sys.exit(f"ground truth row {r} disagrees with brute force: {same}/{K_GT} ids in place")
    log("brute-force check: " + ", ".join(f"row {c['query']}: {c['same_ids_in_place']}/{K_GT} ids in place, "
                                          f"scores within {c['max_score_diff']:.1e}" for c in checks))

    # How much the extra rows would change the top-10 of an index that holds all of the file.
    extra_sims = queries @ base[a.n :].T
    all_d = np.concatenate([D, extra_sims], axis=1)
    all_i = np.concatenate([I, np.broadcast_to(np.arange(a.n, total), extra_sims.shape)], axis=1)
    top = np.argsort(-all_d, axis=1, kind="stable")[:, :K_GT]
    gt_all = np.take_along_axis(all_i, top, axis=1).astype(np.int32)
    vecs_rows(gt_all, np.int32).tofile(paths["groundtruth-all.ivecs"])
    for c in checks:
        sims = base @ queries[c["query"]]
        c["all_rows_same_ids_in_place"] = int(np.sum(np.argsort(-sims, kind="stable")[:K_GT] == gt_all[c["query"]]))
    per_query = (extra_sims > D[:, 9:10]).sum(axis=1) if a.extra else np.zeros(len(queries))
    log(f"an index of all {total:,}: {int(per_query.sum())} of the {10 * len(queries):,} top-10 places would go to the "
        f"last {a.extra:,} rows ({int((per_query > 0).sum())} queries)")

    stats = {}
    if not a.no_stats:
        t = time.time()
        # How the neighbourhoods tighten as a set grows: pypi's prefixes
        # up to 120k, the stand-in's up to 1M.
        for size in (len(src) // 8, len(src) // 4, len(src) // 2, len(src)):
            stats[f"pypi_{size // 1000}k"] = neighbour_stats(f"pypi (real), first {size // 1000}k", src[:size], queries,
                                                             a.nn_sample, faiss)
        for size in (len(src), a.n // 4, a.n // 2):
            stats[f"standin_{size // 1000}k"] = neighbour_stats(f"stand-in, first {size // 1000}k", base[:size], queries,
                                                                a.nn_sample, faiss)
        stats[f"standin_{a.n // 1000}k"] = neighbour_stats(f"stand-in, first {a.n // 1000}k", base[: a.n], queries,
                                                           a.nn_sample, faiss, qD=D)
        stats["seconds"] = round(time.time() - t, 1)
    stats["mixtures_sharing_their_first_two_parts"] = shared_pairs
    stats["top10_places_taken_by_extra_rows"] = int(per_query.sum())
    stats["groundtruth_check"] = checks
    meta = {"recipe": recipe, "base": total, "indexed": a.n, "query": len(queries), "dim": dim, "metric": "cosine",
            "groundtruth_k": K_GT, "groundtruth_over": a.n, "queries_from": "pypi query.fvecs (real, unchanged)",
            "source": os.path.abspath(a.dataset), "groundtruth_seconds": round(gt_secs, 1),
            "sha256": {f: sha256(paths[f]) for f in ("base.fvecs", "query.fvecs", "groundtruth.ivecs", "groundtruth-all.ivecs")},
            "seconds": round(time.time() - t_all, 1), "stats": stats}
    json.dump(meta, open(paths["meta.json"], "w"), indent=2)
    log(f"done in {time.time() - t_all:.0f}s: {out_dir}")
    print(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
