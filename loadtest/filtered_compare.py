#!/usr/bin/env python3
"""Side by side: `shoal-loadtest filtered-bench --json` against the JSON of
`../shared/peers/filtered_bench.py` (Qdrant's engine, default and ACORN),
per case and per peer ef: the peer's recall and QPS, shoal's recall and QPS
at the same ef, and shoal's QPS at the cheapest of its efs whose recall is
equal or better than the peer's (the ratio the targets ask for).

    loadtest/filtered_compare.py shoal.json qdrant.json [--markdown]
"""
import json
import sys


def points(case, mode):
    return [(r["ef"], r["recall"], r["qps"]) for r in case.get(mode, [])]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    markdown = "--markdown" in sys.argv
    if len(args) != 2:
        sys.exit(__doc__)
    shoal, peer = (json.load(open(p)) for p in args)
    ours = {c["name"]: c for c in shoal["cases"]}
    rows, worst = [], {}
    for pc in peer["cases"]:
        name = pc["name"]
        if name not in ours:
            continue
        mine = points(ours[name], "search")
        plans = {r["ef"]: "+".join(sorted(r.get("plans", {}))) for r in ours[name]["search"]}
        for ef in sorted({p[0] for mode in ("search", "search_acorn") for p in points(pc, mode)}):
            best = None  # the peer's fastest mode at this ef
            for mode in ("search", "search_acorn"):
                for e, rec, qps in points(pc, mode):
                    if e == ef and (best is None or qps > best[2]):
                        best = (mode, rec, qps)
            mode, prec, pqps = best
            same = next(((r, q) for e, r, q in mine if e == ef), None)
            matched = [(q, e, r) for e, r, q in mine if r >= prec]
            at = max(matched) if matched else None
            ratio = at[0] / pqps if at else None
            worst[name] = min(worst.get(name, float("inf")), ratio if ratio is not None else 0.0)
            rows.append((name, pc["selectivity"], ef, "acorn" if mode == "search_acorn" else "default", prec, pqps,
                         same, plans.get(ef, ""), at, ratio))
    if markdown:
        print("| case | share | ef | Qdrant best mode | Qdrant recall | Qdrant QPS | shoal recall | shoal QPS | shoal plan "
              "| shoal QPS at ≥ Qdrant's recall (ef) | ratio |")
        print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for name, sel, ef, mode, prec, pqps, same, plan, at, ratio in rows:
        s_rec, s_qps = same if same else (float("nan"), float("nan"))
        at_s = f"{at[0]:.0f} (ef {at[1]})" if at else "not reached"
        r_s = f"{ratio:.2f}x" if ratio is not None else "-"
        if markdown:
            print(f"| {name} | {100 * sel:.2f}% | {ef} | {mode} | {prec:.3f} | {pqps:.0f} | {s_rec:.3f} | {s_qps:.0f} | {plan} "
                  f"| {at_s} | {r_s} |")
        else:
            print(f"{name:22s} {100 * sel:7.3f}% ef {ef:4d}  qdrant {mode:7s} {prec:.3f}@{pqps:7.0f}  "
                  f"shoal {s_rec:.3f}@{s_qps:7.0f} {plan:15s}  at>=recall {at_s:18s} {r_s}")
    print(file=sys.stderr)
    for name, w in worst.items():
        print(f"{name:22s} lowest ratio {w:.2f}x" + ("" if w >= 1.5 else "  (below 1.5x)"), file=sys.stderr)


if __name__ == "__main__":
    main()
