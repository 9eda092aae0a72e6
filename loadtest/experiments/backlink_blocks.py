#!/usr/bin/env python3
"""How many bottom-layer link blocks does a 1k batch dirty, by id order?

An offline model for docs/engine.md, "The link log" (its figures are in
docs/benchmarks.md, "What a batch changes"): the base set is
given internal ids in batches of 10,000 (each batch ordered one of three
ways), then 1,000 new points arrive. Each new point's 13 exact nearest
neighbours (about the back links an insert adds) stand in for the lists
the batch changes; the script counts the distinct blocks of 15 lists (and
4 KiB pages of 30) that hold them.

    python3 loadtest/experiments/backlink_blocks.py ../shared/datasets/pypi/base.fvecs

Needs numpy. Takes about a minute.
"""
import sys

import numpy as np

K = 13          # back links per insert (measured: ~12.7k lists per 1k batch)
PER_BLOCK = 15  # codec::links0_block_nodes(32)
BATCH = 10_000

path = sys.argv[1] if len(sys.argv) > 1 else "../shared/datasets/pypi/base.fvecs"
raw = np.fromfile(path, dtype=np.int32)
dim = int(raw[0])
X = raw.reshape(-1, dim + 1)[:, 1:].copy().view(np.float32)
X /= np.linalg.norm(X, axis=1, keepdims=True)
rng = np.random.default_rng(1)
planes = rng.standard_normal((16, dim)).astype(np.float32)


def simhash_order(b):
    """What the engine does (src/locality.rs): 16 random hyperplanes
    through the batch's mean, sorted by the hash."""
    bits = ((b - b.mean(0)) @ planes.T > 0).astype(np.int64)
    return np.argsort((bits << np.arange(15, -1, -1)).sum(1), kind="stable")


def pca_tree_order(b, leaf=16):
    """A stronger order: split at the median of the first principal
    direction, recursively, down to leaves of 16."""
    out, stack = [], [np.arange(len(b))]
    while stack:
        s = stack.pop()
        if len(s) <= leaf:
            out.append(s)
            continue
        y = b[s] - b[s].mean(0)
        v = rng.standard_normal(dim).astype(np.float32)
        for _ in range(8):
            v = y.T @ (y @ v)
            v /= np.linalg.norm(v)
        o = np.argsort(y @ v, kind="stable")
        stack += [s[o[len(s) // 2:]], s[o[: len(s) // 2]]]
    return np.concatenate(out)


orders = {"input": lambda b: np.arange(len(b)), "simhash": simhash_order, "pca-tree": pca_tree_order}
for size in (10_000, 100_000):
    for name, order in orders.items():
        ids = np.empty(size, dtype=np.int64)
        for start in range(0, size, BATCH):
            o = order(X[start:start + BATCH])
            ids[start + o] = start + np.arange(len(o))
        sims = X[size:size + 1000] @ X[:size].T
        nearest = np.argpartition(-sims, K, axis=1)[:, :K]
        lists = np.unique(ids[nearest.ravel()])
        blocks = np.unique(lists // PER_BLOCK)
        total = -(-size // PER_BLOCK)
        print(f"1k into {size:>6}, {name:8}: {len(lists):6} lists in {len(blocks):5} of {total} blocks "
              f"({len(blocks) / total:.0%}), {len(np.unique(lists // (2 * PER_BLOCK)))} pages")
