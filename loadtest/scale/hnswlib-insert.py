"""hnswlib's "1k into N" for sizes that ../shared/peers/bench.py does not take.

bench.py times 1,000 inserts into 10k, 30k and 100k only. This builds an
hnswlib index of each --sizes N with bench.py's own wrapper (same
parameters, 10k batches on --threads), then times adding the next 1,000
rows in one call, as bench.py and `index-bench --incremental-sizes` do.
With --repeats R it adds R such batches, each into the index the one
before it left, and reports their median (as `index-bench
--incremental-repeats R`; the base file needs N + R x 1,000 rows, e.g.
`make-million.sh --extra 16000`). With --interleave it builds every size
first and then adds round r's batch to each size in turn, and reports each
size's per-round ratio to the first size's (`ratio_to_first`), as
`index-bench --incremental-interleave` does.

  $py loadtest/scale/hnswlib-insert.py --base $MILLION/base.fvecs \
      --sizes 100000,1000000 --m 16 --ef-construction 100 --threads 2 --json hnswlib-insert.json

Prints and writes {"lib": "hnswlib", "incremental": [{"base", "added",
"ms_per_vector" (the median), "samples", "build_seconds",
"build_vectors_per_s", "index_rss_anon_bytes"}], "peak_rss_bytes"}.
`index_rss_anon_bytes` is what the process's RssAnon grew by while the
index was built: hnswlib's own memory for the graph and its copy of the
vectors, without the base file this script holds (as `index-bench`'s
`peak_rss_anon_bytes` leaves out the base file it maps).
"""
import argparse
import json
import os
import sys
import time

import numpy as np


def rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--added", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--metric", default="cosine")
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--ef-construction", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=10_000)
    ap.add_argument("--peers", default=os.path.join(os.environ.get("SHOAL_SHARED", os.path.join(here, "../../../shared")), "peers"))
    ap.add_argument("--interleave", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    sys.path.insert(0, a.peers)
    import bench  # ../shared/peers/bench.py: read_vecs, Hnswlib, peak_rss_anon

    base = bench.read_vecs(a.base, np.float32)
    dim = base.shape[1]
    sizes = []
    for size in [int(s) for s in a.sizes.split(",")]:
        if size + a.added * a.repeats > len(base):
            print(f"skipping {a.repeats} x {a.added} into {size}: the base file has {len(base)} vectors", file=sys.stderr)
        else:
            sizes.append(size)

    def build(size):
        before = rss_anon()
        ix = bench.Hnswlib(dim, a.metric, a.m, a.ef_construction, a.threads, size + a.added * a.repeats)
        t0 = time.perf_counter()
        for s in range(0, size, a.batch_size):
            e = min(size, s + a.batch_size)
            ix.add(base[s:e], np.arange(s, e))
        return {"size": size, "ix": ix, "build": time.perf_counter() - t0, "samples": [], "rss": rss_anon() - before}

    def insert(b, r):
        s = b["size"] + r * a.added
        t0 = time.perf_counter()
        b["ix"].add(base[s:s + a.added], np.arange(s, s + a.added))
        b["samples"].append(round((time.perf_counter() - t0) * 1000 / a.added, 4))

    def entry(b, first):
        size, build_s, samples = b["size"], b["build"], b["samples"]
        ms = float(np.median(samples))
        e = {"base": size, "added": a.added, "ms_per_vector": round(ms, 4), "samples": samples,
             "build_seconds": round(build_s, 3), "build_vectors_per_s": round(size / build_s, 1),
             "index_rss_anon_bytes": b["rss"]}
        note = ""
        if first is not None:
            ratios = [x / y for x, y in zip(samples, first)]
            e["ratio_to_first"] = {"median": round(float(np.median(ratios)), 4), "rounds": [round(x, 4) for x in ratios]}
            note = f"; {e['ratio_to_first']['median']:.3f}x the first size (median of the rounds' ratios)"
        print(f"hnswlib: built {size} in {build_s:.1f}s ({size / build_s:.0f}/s, {b['rss'] / 2**20:.0f} MiB RssAnon); {a.added} into {size}: {ms:.4f} ms/vector"
              f" (median of {a.repeats}: {samples}){note}", file=sys.stderr, flush=True)
        return e

    out = []
    if a.interleave:
        built = [build(size) for size in sizes]
        for r in range(a.repeats):
            for b in built:
                insert(b, r)
        out = [entry(b, built[0]["samples"]) for b in built]
    else:
        for size in sizes:
            b = build(size)
            for r in range(a.repeats):
                insert(b, r)
            out.append(entry(b, None))
            del b
    res = {"lib": "hnswlib", "params": {"m": a.m, "ef_construction": a.ef_construction, "threads": a.threads,
           "metric": a.metric, "batch_size": a.batch_size, "interleave": a.interleave}, "incremental": out, "peak_rss_bytes": bench.peak_rss_anon()}
    print(json.dumps(res, indent=2))
    if a.json:
        json.dump(res, open(a.json, "w"), indent=2)


if __name__ == "__main__":
    main()
