"""One launch of each quantize variant at kvq bench-quantize's shape (bf16 [128, Hkv, 8192, 128]), for a
profiler to attach to; kvq bench-quantize times them.

    ncu --section SpeedOfLight --section Occupancy -k regex:quantize \\
        python3 experiments/bench/profile_quantize.py --pairs 'int8-head:quantize-groupthread' q8_0
"""
import argparse

import torch

import kvq.gpu

DEFAULT = ["int8-head:quantize-groupthread", "int8-g32:quantize-groupthread", "int4-g32-asym:quantize-groupthread",
           "q8_0", "int8-token:quantize-tokenteam", "int4-token-asym:quantize-tokenteam",
           "int8-tensor:quantize-tensor2pass", "mxfp4", "nvfp4", "iq4_nl"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", nargs="+", default=DEFAULT, help="scheme[:variant] (no variant: kvq's choice)")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args()
    x = torch.randn(args.batch, args.heads, 8192, 128, device="cuda").to(torch.bfloat16)
    for pair in args.pairs:
        scheme, _, variant = pair.partition(":")
        torch.cuda.nvtx.range_push(pair)
        kvq.gpu.quantize(x, scheme, variant=variant or None)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print(pair, "done", flush=True)


if __name__ == "__main__":
    main()
