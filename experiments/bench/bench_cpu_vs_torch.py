#!/usr/bin/env python3
"""Times kvq's fp64 CPU reference beside PyTorch's CPU scaled_dot_product_attention (fp32) on the
DESIGN.md decode shapes, in one run on one machine, and prints the ratio.

    python experiments/bench/bench_cpu_vs_torch.py --kvq build/experiments/kvq --out results/bench-cpu

Needs torch (see experiments/bench/bench_cpu.sh, which makes the virtual environment).
"""
import argparse
import csv
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F


def time_sdpa(b, hq, hkv, t, d, min_reps, min_seconds):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(b, hq, 1, d, generator=g)
    k = torch.randn(b, hkv, t, d, generator=g)
    v = torch.randn(b, hkv, t, d, generator=g)
    with torch.inference_mode():
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # warm-up
        times = []
        start = time.perf_counter()
        while len(times) < min_reps or time.perf_counter() - start < min_seconds:
            t0 = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            times.append((time.perf_counter() - t0) * 1e3)
    del q, k, v
    times.sort()
    return times


def pct(sorted_ms, p):
    pos = p * (len(sorted_ms) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_ms) - 1)
    return sorted_ms[lo] + (pos - lo) * (sorted_ms[hi] - sorted_ms[lo])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvq", default="build/experiments/kvq", help="path of the kvq binary")
    ap.add_argument("--filter", default=".*", help="regex over shape labels, as kvq bench-cpu --filter")
    ap.add_argument("--min-reps", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--out", default="results/bench-cpu", help="directory for the CSVs")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    kvq_csv = os.path.join(args.out, "kvq_reference_cpu.csv")
    try:
        done = subprocess.run([args.kvq, "bench-cpu", "--filter", args.filter, "--min-reps", str(args.min_reps),
                               "--min-seconds", str(args.min_seconds), "--csv", kvq_csv])
    except OSError as e:
        ap.error(f"--kvq {args.kvq}: cannot run it ({e.strerror}); build kvq first (README)")
    if done.returncode != 0:  # kvq bench-cpu has said why (a filter, a count): its status, no traceback
        return done.returncode
    with open(kvq_csv) as f:
        kvq_rows = list(csv.DictReader(f))

    threads = int(kvq_rows[0]["threads"])
    torch.set_num_threads(threads)
    joined = []
    print(f"\ntorch {torch.__version__} scaled_dot_product_attention, fp32, {threads} threads")
    header = f"{'shape':<22} {'kvq fp64 ms':>12} {'torch fp32 ms':>14} {'ratio':>7}  (ratio = kvq / torch; <= 1: reference as fast or faster)"
    print(header)
    for r in kvq_rows:
        b, hq, hkv, t, d = (int(r[c]) for c in ("B", "HQ", "HKV", "T", "D"))
        ms = time_sdpa(b, hq, hkv, t, d, args.min_reps, args.min_seconds)
        torch_median = statistics.median(ms)
        ratio = float(r["median_ms"]) / torch_median
        label = f"{r['shape']}/B{b}/T{t}"
        print(f"{label:<22} {float(r['median_ms']):>12.3f} {torch_median:>14.3f} {ratio:>7.2f}", flush=True)
        joined.append({**{c: r[c] for c in ("shape", "B", "HQ", "HKV", "T", "D", "threads")},
                       "kvq_fp64_median_ms": r["median_ms"], "kvq_fp64_gflops": r["gflops"],
                       "torch_fp32_median_ms": f"{torch_median:.6f}",
                       "torch_fp32_p10_ms": f"{pct(ms, 0.1):.6f}", "torch_fp32_p90_ms": f"{pct(ms, 0.9):.6f}",
                       "torch_fp32_gflops": f"{4.0 * b * hq * t * d / (torch_median * 1e6):.4f}",
                       "ratio_kvq_over_torch": f"{ratio:.4f}", "torch_version": torch.__version__,
                       "cpu": r["cpu"], "kvq_commit": r["kvq_commit"]})
    out_csv = os.path.join(args.out, "cpu_reference_vs_torch.csv")
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(joined[0]))
        w.writeheader()
        w.writerows(joined)
    ratios = [float(j["ratio_kvq_over_torch"]) for j in joined]
    print(f"\ngeometric-mean ratio kvq/torch: {statistics.geometric_mean(ratios):.2f}; "
          f"worst {max(ratios):.2f}; wrote {out_csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
