"""How often the fast integer coder meets an element near a half-step, replayed on the CPU (numpy).

The bench's input (bench_shapes.cpp random_bf16: an LCG, uniform in [-4, 4), bf16) and Gaussian bf16
with per-channel magnitudes; per-token groups of Hkv x 128 (Hkv 1 also stands for per-head rows),
int8 symmetric, int4 and int8 asymmetric, with fp16 scales. Prints the share of elements the nearness test
leaves unsure, how many of them lie exactly on a half-step, and the share of warps (32 lanes of
`lane_elems` elements) that met one.  python3 tie_replay.py
"""
import numpy as np


def bf16(f):
    b = f.astype(np.float32).view(np.uint32)
    b = ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)) << np.uint32(16)
    return b.view(np.float32)


def bench_input(n, seed=12345):
    a, c, mask = 1664525, 1013904223, 0xFFFFFFFF
    step_a, step_c = np.empty(4096, np.uint64), np.empty(4096, np.uint64)
    pa, pc = 1, 0
    for i in range(4096):  # the LCG's 1..4096-step jumps, to draw it block by block
        pa, pc = (pa * a) & mask, (pc * a + c) & mask
        step_a[i], step_c[i] = pa, pc
    out, state = np.empty(n, np.uint64), seed
    for blk in range(n // 4096):
        v = (step_a * np.uint64(state) + step_c) & np.uint64(mask)
        out[blk * 4096:(blk + 1) * 4096], state = v, int(v[-1])
    return bf16(((out >> np.uint64(8)).astype(np.float32) / np.float32(16777216.0) - np.float32(0.5)) * np.float32(8.0))


def replay(groups, lane_elems, label):
    f16 = lambda v: np.float32(np.float16(v))
    for name, levels in (("int8-sym", 0), ("int4-asym", 15), ("int8-asym", 255)):
        if levels:
            lo, hi = groups.min(1), groups.max(1)
            scale, v = f16((hi - lo) / np.float32(levels)), (groups - f16(lo)[:, None]).astype(np.float32)
        else:
            scale, v = f16(np.abs(groups).max(1) / np.float32(127)), groups
        inv = (np.float32(1) / scale).astype(np.float32)
        p = v.astype(np.float64) * inv.astype(np.float64)[:, None]  # the fma's exact product
        unsure = (0.5 - np.abs(p - np.round(p))) <= 2.0**-13
        exact = (v.astype(np.float64) / scale.astype(np.float64)[:, None]) % 1 == 0.5
        warps = unsure.reshape(-1, lane_elems).any(1).reshape(-1, 32).any(1)
        print(f"{label:<22} {name:<9}  unsure {unsure.mean():8.5f}  "
              f"of them exactly on a half-step {(unsure & exact).sum() / max(unsure.sum(), 1):6.3f}  "
              f"warps {warps.mean():6.3f}")


if __name__ == "__main__":
    rng = np.random.default_rng(1)
    for hkv, lane in ((1, 32), (8, 64)):
        replay(bench_input(1 << 22).reshape(-1, 128 * hkv), lane, f"bench Hkv {hkv}")
        magnitudes = np.exp(rng.normal(0, 1, size=128 * hkv)).astype(np.float32)
        replay(bf16(rng.normal(size=(32768, 128 * hkv)).astype(np.float32) * magnitudes), lane, f"gaussian Hkv {hkv}")
