#!/usr/bin/env python3
"""Two kvq eval runs of the same pairs, side by side: each pair's KLD (mean and max), perplexity
change and attention rel-L2 in both, and whether they agree within a tolerance (relative, or
absolute for values near zero). How the GPU engine is checked against the CPU path (the oracle),
and a 2-GPU run against a 1-GPU one.

    python experiments/eval/compare_evals.py cpu/eval.csv gpu/eval.csv --csv-out compare.csv

Exits 1 when a pair differs beyond the tolerance or the runs hold different pairs, 2 on bad input
(a file with no pairs, or with a pair listed twice).
"""
import argparse
import csv
import math
import sys

KEYS = ("kld_mean", "kld_max", "ppl_delta", "top1_agreement", "out_rel_l2_mean")


def read_rows(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"k_scheme", "v_scheme", *KEYS} - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path}: no column {', '.join(sorted(missing))} (expected kvq eval's eval.csv)")
        rows, lines = {}, {}
        for r in reader:
            pair = (r["k_scheme"], r["v_scheme"])
            if pair in rows:  # a dict would keep one silently: which of the two is the run's?
                raise ValueError(f"{path}: line {reader.line_num}: the pair K {pair[0]} / V {pair[1]} is listed "
                                 f"twice (first on line {lines[pair]}; expected kvq eval's eval.csv, one row per pair)")
            rows[pair], lines[pair] = r, reader.line_num
    if not rows:  # 0 of 0 pairs would "agree": a pass on nothing
        raise ValueError(f"{path}: no pairs (only a header): nothing to compare")
    return rows


def compare(a, b, rel, abs_tol, keys=("kld_mean",)):
    """One dict per pair of a: both values of every key, the worst relative difference of `keys`, ok."""
    out = []
    for pair, ra in a.items():
        rb = b.get(pair)
        if rb is None:
            out.append({"k_scheme": pair[0], "v_scheme": pair[1], "ok": False, "note": "missing from the second run"})
            continue
        row = {"k_scheme": pair[0], "v_scheme": pair[1], "ok": True, "note": ""}
        worst = 0.0
        for key in KEYS:
            x, y = float(ra[key]), float(rb[key])
            row[f"{key}_a"], row[f"{key}_b"] = x, y
            if key in keys:
                if math.isnan(x) or math.isnan(y):  # within no tolerance (a NaN compared as "not above" any)
                    row["ok"], row["note"] = False, f"{key}: {x:.6g} vs {y:.6g}"
                    worst = float("inf")
                    continue
                diff = 0.0 if x == y else abs(x - y)  # equal infinities agree
                if diff > max(abs_tol, rel * abs(x)):
                    row["ok"], row["note"] = False, f"{key}: {x:.6g} vs {y:.6g}"
                worst = max(worst, diff / abs(x) if x else (0.0 if diff == 0 else float("inf")))
        row["worst_rel_diff"] = worst
        out.append(row)
    for pair in b.keys() - a.keys():
        out.append({"k_scheme": pair[0], "v_scheme": pair[1], "ok": False, "note": "missing from the first run"})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="the first run's eval.csv (the reference: the CPU path, one GPU)")
    ap.add_argument("b", help="the second run's eval.csv")
    ap.add_argument("--rel", type=float, default=0.01, help="relative tolerance (default: %(default)s)")
    ap.add_argument("--abs", type=float, default=1e-7, dest="abs_tol", help="absolute tolerance (default: %(default)s)")
    ap.add_argument("--keys", default="kld_mean", help="columns held to the tolerance, comma-separated (of "
                                                        f"{', '.join(KEYS)}; default: %(default)s)")
    ap.add_argument("--csv-out", help="write the side-by-side table here")
    args = ap.parse_args(argv)
    for option, tol in (("--rel", args.rel), ("--abs", args.abs_tol)):
        if not (math.isfinite(tol) and tol >= 0):
            ap.error(f"{option} {tol:g}: expected a finite tolerance >= 0")
    keys = tuple(args.keys.split(","))
    if set(keys) - set(KEYS):
        ap.error(f"--keys {args.keys}: expected some of {', '.join(KEYS)}")
    try:
        rows = compare(read_rows(args.a), read_rows(args.b), args.rel, args.abs_tol, keys)
    except (OSError, ValueError) as e:
        print(f"compare_evals: error: {e}", file=sys.stderr)
        return 2
    for r in rows:
        if "kld_mean_a" in r:
            print(f"{'ok  ' if r['ok'] else 'DIFF'} {r['k_scheme']:<24} {r['v_scheme']:<22} KLD {r['kld_mean_a']:.6e} "
                  f"vs {r['kld_mean_b']:.6e} (worst rel diff {r['worst_rel_diff']:.2e}) {r['note']}")
        else:
            print(f"DIFF {r['k_scheme']:<24} {r['v_scheme']:<22} {r['note']}")
    bad = sum(not r["ok"] for r in rows)
    print(f"{len(rows) - bad} of {len(rows)} pairs agree within {args.rel:g} relative or {args.abs_tol:g} absolute "
          f"({', '.join(keys)})")
    if args.csv_out:
        columns = sorted({c for r in rows for c in r}, key=lambda c: (c not in ("k_scheme", "v_scheme", "ok"), c))
        with open(args.csv_out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns)
            w.writeheader()
            w.writerows(rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
