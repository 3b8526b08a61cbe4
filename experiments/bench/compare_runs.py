#!/usr/bin/env python3
"""No silent regressions: compares a device run's decode and quantize timings with the newest
committed run of every row on the same GPU model, and lists each row more than --threshold slower or
faster, with both commits, and whether the two runs' p10-p90 ranges are apart or overlap.

    python3 experiments/bench/compare_runs.py results/device/decode.csv results/device/quantize_bandwidth.csv \\
        --results experiments/results [--threshold 0.05] [--csv FILE]

A row is one timed case: decode (kvq bench / bench_peers.py schema) by shape, B, HQ, HKV, T, D,
kernel, K and V scheme, layout and split count; quantize (kvq bench-quantize) by B, HKV, T, D, input
dtype and values (--input), scheme, layout and variant. Where a decode row's split count came from a
heuristic that changed (one row for the case in each run), the rows are still compared and the
change is named.
The committed runs are every CSV of those schemas under --results whose gpu column names the same
GPU; of several, the newest (by the git commit time of the file, or of the row's commit) holds a
row's baseline. Rows that a file holds twice under one key (old files without a layout column held
planar and FBGEMM-row storages of a scheme alike) are ambiguous and not compared.

A copy of the tree without .git (a GPU machine's) cannot order the runs: write their commit times
beforehand, where git is, and carry the file along (it is git-ignored):

    python3 experiments/bench/compare_runs.py --results experiments/results --write-times experiments/results/.run_times.json

--times (default: <results>/.run_times.json) is read when git cannot date a file; runs dated by
neither are ordered by path, and the report says how many.
"""
import json
import argparse
import csv
import glob
import math
import os
import subprocess
import sys

DECODE_KEY = ("shape", "B", "HQ", "HKV", "T", "D", "kernel", "k_scheme", "v_scheme", "layout")
QUANTIZE_KEY = ("B", "HKV", "T", "D", "input_dtype", "input", "scheme", "layout", "variant", "tensor_scale")
# Columns that older runs lack, as those runs meant them.
KEY_DEFAULTS = {"tensor_scale": "computed", "input": "uniform"}


def schema(header):
    """'decode', 'quantize' or None, from a CSV header."""
    if {"kernel", "k_scheme", "v_scheme", "median_us", "gpu"} <= set(header):
        return "decode"
    if {"variant", "scheme", "input_dtype", "median_us", "gpu"} <= set(header):
        return "quantize"
    return None


def read_rows(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        kind = schema(reader.fieldnames or [])
        return kind, (list(reader) if kind else [])


def row_key(kind, row):
    fields = DECODE_KEY if kind == "decode" else QUANTIZE_KEY
    return (kind,) + tuple(row.get(f, "") or KEY_DEFAULTS.get(f, "") for f in fields)


def git_time(root, *args):
    try:
        out = subprocess.run(["git", "-C", root, "log", "-1", "--format=%ct", *args], capture_output=True, text=True,
                             timeout=30)
        return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def run_time(path, rows, root, times=None, results=None):
    """When a committed run was made: its file's last commit, else its rows' commit, else its entry in
    `times` ({path under results: unix time}), else 0 (unknown)."""
    t = git_time(root, "--", os.path.relpath(path, root))
    if t is None and rows and rows[0].get("commit"):
        t = git_time(root, rows[0]["commit"])
    if t is None and times and results:
        t = times.get(os.path.relpath(path, results))
    return t or 0


def csv_paths(results):
    return sorted(glob.glob(os.path.join(results, "**", "*.csv"), recursive=True))


def write_times(results, root, out):
    """Every committed run's time (git) into `out`, for trees without git."""
    times = {}
    for path in csv_paths(results):
        kind, rows = read_rows(path)
        if kind:
            t = run_time(path, rows, root)
            if t:
                times[os.path.relpath(path, results)] = t
    with open(out, "w") as f:
        json.dump(times, f, indent=0, sort_keys=True)
    return len(times)


def index(rows, kind):
    """{key: [rows]} with the split count kept per row."""
    out = {}
    for r in rows:
        out.setdefault(row_key(kind, r), []).append(r)
    return out


def baselines(results, gpu, exclude, root, times=None):
    """{key: (row, file)}: for every key, the row of the newest committed run on this GPU; and how many
    runs had no known time."""
    runs = []
    for path in csv_paths(results):
        if os.path.abspath(path) in exclude:
            continue
        kind, rows = read_rows(path)
        rows = [r for r in rows if r.get("gpu") == gpu and r.get("median_us")]
        if rows:
            runs.append((run_time(path, rows, root, times, results), path, kind, rows))
    undated = sum(1 for t, *_ in runs if t == 0)
    best = {}
    for _, path, kind, rows in sorted(runs):  # oldest first: newer runs overwrite
        for key, group in index(rows, kind).items():
            by_splits = {}
            for r in group:
                by_splits.setdefault(r.get("splits", ""), []).append(r)
            if any(len(g) > 1 for g in by_splits.values()):
                best[key] = ("ambiguous", path)
                continue
            best[key] = (group, path)
    return best, undated


def compare(new_rows, kind, base, threshold):
    """[(ratio, key, new row, old row, note)] for rows beyond the threshold; and counts."""
    flagged, compared, ambiguous, missing = [], 0, 0, 0
    for key, group in index(new_rows, kind).items():
        entry = base.get(key)
        if entry is None:
            missing += len(group)
            continue
        old_group, path = entry
        if old_group == "ambiguous":
            ambiguous += len(group)
            continue
        old_by_splits = {r.get("splits", ""): r for r in old_group}
        for row in group:
            old, note = old_by_splits.get(row.get("splits", "")), ""
            if old is None and len(group) == 1 and len(old_group) == 1:
                old = old_group[0]
                note = f"splits {old.get('splits')} -> {row.get('splits')}"
            if old is None:
                missing += 1
                continue
            compared += 1
            ratio = float(row["median_us"]) / float(old["median_us"])
            if abs(ratio - 1) > threshold:
                flagged.append((ratio, key, row, old, note, path))
    return flagged, compared, ambiguous, missing


def spread(row, old):
    """'apart' where the two runs' p10-p90 ranges do not meet (the whole spread moved), 'overlap' where
    they do (a median shift within the runs' own spread, which one round on another machine can show),
    '' where either row lacks them."""
    try:
        new_lo, new_hi, old_lo, old_hi = (float(r[c]) for r in (row, old) for c in ("p10_us", "p90_us"))
    except (KeyError, TypeError, ValueError):
        return ""
    return "overlap" if new_lo <= old_hi and old_lo <= new_hi else "apart"


def label(key, row):
    kind = key[0]
    if kind == "decode":
        storage = row["k_scheme"] if row["k_scheme"] == row["v_scheme"] else f"{row['k_scheme']}/{row['v_scheme']}"
        layout = f" [{row['layout']}]" if row.get("layout") and row["layout"] != "planar" else ""
        splits = f" splits={row['splits']}" if row.get("splits") not in (None, "", "0") else ""
        return f"decode {row['kernel']} {storage}{layout} {row['shape']}/B{row['B']}/T{row['T']}{splits}"
    given = " (given scale)" if row.get("tensor_scale") == "given" else ""
    values = f" {row['input']}" if row.get("input") not in (None, "", KEY_DEFAULTS["input"]) else ""
    return (f"quantize {row['variant']} {row['scheme']}{given} {row['layout']} {row['input_dtype']}{values} "
            f"B{row['B']} Hkv{row['HKV']}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="*", help="the new run's decode.csv / quantize_bandwidth.csv")
    ap.add_argument("--results", default="experiments/results", help="committed runs (default: %(default)s)")
    ap.add_argument("--threshold", type=float, default=0.05, help="relative change to report (default: %(default)s)")
    ap.add_argument("--csv-out", help="write every flagged row here")
    ap.add_argument("--times", help="committed runs' times for a tree without git (default: <results>/.run_times.json)")
    ap.add_argument("--write-times", metavar="FILE", help="write the committed runs' git times to FILE and exit")
    args = ap.parse_args(argv)
    if not args.csv and not args.write_times:
        ap.error("give the new run's CSV files (or --write-times FILE)")
    if not (math.isfinite(args.threshold) and args.threshold >= 0):  # NaN would flag nothing
        ap.error(f"--threshold {args.threshold:g}: expected a finite fraction >= 0 (0.05: 5 %)")
    try:  # the repository holding the committed runs, whose history orders them
        top = subprocess.run(["git", "-C", args.results, "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=30)
        root = top.stdout.strip() if top.returncode == 0 else args.results
    except (OSError, subprocess.TimeoutExpired):
        root = args.results
    if args.write_times:
        n = write_times(args.results, root, args.write_times)
        print(f"wrote {args.write_times}: {n} committed runs")
        return 0
    times_path = args.times or os.path.join(args.results, ".run_times.json")
    times = None
    if os.path.isfile(times_path):
        with open(times_path) as f:
            times = json.load(f)
    exclude = {os.path.abspath(p) for p in args.csv}
    lines, flagged_all = [], []
    for path in args.csv:
        if not os.path.isfile(path):
            print(f"compare_runs: error: {path}: no such file", file=sys.stderr)
            return 2
        kind, rows = read_rows(path)
        if kind is None:
            print(f"compare_runs: error: {path}: not a kvq bench or bench-quantize CSV", file=sys.stderr)
            return 2
        rows = [r for r in rows if r.get("median_us")]
        if not rows:
            lines.append(f"{path}: no timed rows")
            continue
        gpu = rows[0]["gpu"]
        base, undated = baselines(args.results, gpu, exclude, root, times)
        flagged, compared, ambiguous, missing = compare(rows, kind, base, args.threshold)
        flagged_all += flagged
        slower = sorted((f for f in flagged if f[0] > 1), key=lambda f: -f[0])
        faster = sorted((f for f in flagged if f[0] < 1), key=lambda f: f[0])
        lines.append(f"{kind} rows vs the newest committed run on {gpu}: {compared} compared, {len(slower)} more than "
                     f"{args.threshold:.0%} slower, {len(faster)} more than {args.threshold:.0%} faster "
                     f"({missing} without a committed row, {ambiguous} ambiguous there)")
        slower_spreads = [spread(row, old) for _, _, row, old, _, _ in slower]
        if any(slower_spreads):
            lines.append(f"  of the slower rows, {slower_spreads.count('apart')} with p10-p90 ranges apart from the "
                         f"committed run's (the others overlap it: a shift within the runs' spread)")
        if undated:
            lines.append(f"  warning: {undated} committed runs on {gpu} have no known time (no git here and no entry in "
                         f"{times_path}): among them the baseline is the last by path, not the newest")
        for title, group in (("slower", slower), ("faster", faster)):
            for ratio, key, row, old, note, old_path in group:
                moved = spread(row, old)
                lines.append(f"  [{title.upper()}] {label(key, row)}: {float(old['median_us']):.1f} -> "
                             f"{float(row['median_us']):.1f} us ({ratio - 1:+.1%}; {old.get('commit', '?')} "
                             f"{os.path.relpath(old_path, args.results)} -> {row.get('commit', '?')})"
                             + (f" [{note}]" if note else "")
                             + (f" [p10-p90 {moved}]" if moved else ""))
    print("\n".join(lines))
    if args.csv_out:
        with open(args.csv_out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["kind", "case", "old_us", "new_us", "ratio", "old_commit", "new_commit", "old_file", "note",
                        "p10_p90"])
            for ratio, key, row, old, note, old_path in flagged_all:
                w.writerow([key[0], label(key, row), old["median_us"], row["median_us"], f"{ratio:.4f}",
                            old.get("commit", ""), row.get("commit", ""), os.path.relpath(old_path, args.results), note,
                            spread(row, old)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
