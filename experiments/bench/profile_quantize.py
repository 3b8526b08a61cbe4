"""Quantize kernels at kvq bench-quantize's shape (bf16 [128, Hkv, 8192, 128]) through kvq.gpu: one
launch of each for a profiler to attach to, or (--reps N) each timed with CUDA events beside a
device copy of the same input, as kvq bench-quantize does (bandwidth = bytes read + written, and the
fraction of the copy's). kvq bench-quantize is the reference run; this one needs only the Python
module (a quicker build) and takes any scheme / variant pair.

    ncu --section SpeedOfLight -k regex:quantize python3 experiments/bench/profile_quantize.py --pairs q8_0
    python3 experiments/bench/profile_quantize.py --reps 20 --pairs mxfp4 nvfp4 'int8-head:quantize-groupthread'
"""
import argparse
import statistics

import torch

import kvq.gpu

DEFAULT = ["int8-head:quantize-groupthread", "int8-g32:quantize-groupthread", "int4-g32-asym:quantize-groupthread",
           "q8_0", "int8-token:quantize-tokenteam", "int4-token-asym:quantize-tokenteam",
           "int8-tensor:quantize-tensor2pass", "mxfp4", "nvfp4", "iq4_nl"]


def median_us(fn, reps):
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def cache_bytes(c):
    return sum(t.numel() * t.element_size() for t in (c.data, c.scales, c.zero_points, c.tensor_scale) if t is not None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", nargs="+", default=DEFAULT, help="scheme[:variant] (no variant: kvq's choice)")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--reps", type=int, default=0, help="0: one launch each (for ncu); N: the median of N timed launches")
    args = ap.parse_args()
    x = torch.randn(args.batch, args.heads, 8192, 128, device="cuda").to(torch.bfloat16)
    in_bytes = x.numel() * x.element_size()
    copy_gbs = None
    if args.reps:
        y = torch.empty_like(x)
        copy_us = median_us(lambda: y.copy_(x), args.reps)
        copy_gbs = 2 * in_bytes / copy_us / 1e3
        del y
        print(f"device-to-device copy ({in_bytes / 2**30:.0f} GiB): {copy_gbs:.0f} GB/s (read + write), {copy_us:.1f} us")
        print(f"{'scheme':<22} {'variant':<22} {'median us':>10} {'GB/s':>7} {'% copy':>7}")
    for pair in args.pairs:
        scheme, _, variant = pair.partition(":")
        run = lambda: kvq.gpu.quantize(x, scheme, variant=variant or None)  # noqa: E731
        c = run()
        torch.cuda.synchronize()
        if not args.reps:
            print(pair, "done", flush=True)
            continue
        us = median_us(run, args.reps)
        gbs = (in_bytes + cache_bytes(c)) / us / 1e3
        print(f"{scheme:<22} {variant or '(kvq choice)':<22} {us:>10.1f} {gbs:>7.0f} {100 * gbs / copy_gbs:>6.1f}%", flush=True)


if __name__ == "__main__":
    main()
