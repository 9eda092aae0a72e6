#!/usr/bin/env python3
"""Builds pypi-sample.bin.zst, the sample `shoalctl demo` ingests, from the
benchmark set in ../shared/datasets/pypi (run its make.sh first).

    python3 ops/demo-data/make-sample.py [--points 20000] [--queries 200]

Needs numpy (the dataset venv has it:
~/.cache/shoal-datasets/venv/bin/python) and the `zstd` command.
Deterministic: the first N base rows and the first Q query rows.
"""
import argparse, lzma, os, struct, subprocess, sys
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATASET = os.path.join(HERE, "..", "..", "..", "shared", "datasets", "pypi")
N_BASE = 120_000
MAX_SUMMARY = 300
# The repository keeps this one data file; 20 MB is its budget.
MAX_BYTES = 20_000_000


def read_fvecs(path, rows):
    raw = np.fromfile(path, dtype=np.int32)
    d = raw[0]
    return raw.reshape(-1, d + 1)[:rows, 1:].view(np.float32), int(d)


def text(s, limit):
    b = s.encode("utf-8")[:limit]
    return b.decode("utf-8", "ignore").encode("utf-8")


def record(out, id_, vec, name, summary):
    out += struct.pack("<Q", id_)
    # Half precision: the sample has to fit the repository (f32 embeddings
    # hardly compress); recall is measured against the same rounded vectors.
    out += vec.astype("<f2").tobytes()
    n, s = text(name, 1000), text(summary, MAX_SUMMARY)
    out += struct.pack("<H", len(n)) + n + struct.pack("<H", len(s)) + s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=20_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--dataset", default=DATASET)
    ap.add_argument("--out", default=os.path.join(HERE, "pypi-sample.bin.zst"))
    a = ap.parse_args()
    base, dim = read_fvecs(os.path.join(a.dataset, "base.fvecs"), a.points)
    query, _ = read_fvecs(os.path.join(a.dataset, "query.fvecs"), a.queries)
    lines = lzma.open(os.path.join(a.dataset, "texts.tsv.xz"), "rt", encoding="utf-8").read().splitlines()
    def name_summary(row):
        name, _, summary = lines[row].partition("\t")
        return name, summary
    out = bytearray(b"SHOALDEMO1")
    out += struct.pack("<III", len(base), len(query), dim)
    for i, v in enumerate(base):
        record(out, i, v, *name_summary(i))
    for i, v in enumerate(query):
        record(out, N_BASE + i, v, *name_summary(N_BASE + i))
    z = subprocess.run(["zstd", "-19", "-q", "-c"], input=bytes(out), stdout=subprocess.PIPE, check=True).stdout
    with open(a.out, "wb") as f:
        f.write(z)
    print(f"{a.out}: {len(base)} points, {len(query)} queries, dim {dim}, "
          f"{len(out) / 2**20:.1f} MiB raw, {len(z):,} bytes ({len(z) / 2**20:.1f} MiB) compressed",
          file=sys.stderr)
    if len(z) >= MAX_BYTES:
        sys.exit(f"the sample must stay under {MAX_BYTES:,} bytes: lower --points")


if __name__ == "__main__":
    main()
