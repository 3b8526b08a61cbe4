"""How often the integer coder's half-step (tie) path runs, by input (numpy only, CPU).

Two bf16 inputs: `kvq bench-quantize`'s (the LCG of bench_shapes.cpp, uniform in [-4, 4)) and
Gaussian rows of D = 128 whose scales spread over two decades, two outlier channels x8. For each
scheme: elements the biased code is not sure of (all of them exact ties here), warps (32 segments
of <= 32 elements, as quantize-groupthread lays them out) that meet one at chunk k, and the share
of groups whose fp16 scale has <= 4 significant bits and the share of the ties they hold.
    python ties_sim.py
"""
import numpy as np

B = 12582912.0  # the coder's rounding bias, 1.5 * 2^23


def to_bf16(f):
    b = f.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def bench_input(n=1 << 22):
    state, out = 12345, np.empty(n, np.uint32)
    for i in range(n):
        state = (state * 1664525 + 1013904223) & 0xFFFFFFFF
        out[i] = state
    return to_bf16(((out >> 8).astype(np.float64) / 16777216.0 - 0.5) * 8.0)


def gaussian_input(rows=32768, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 128)) * np.exp(rng.uniform(np.log(0.05), np.log(5), (rows, 1)))
    x[:, [3, 77]] *= 8
    return to_bf16(x.ravel())


def coded(g, asym, bits):
    """Groups g (one a row) as the coder sees them: whether each element's biased code is sure, the fp16
    scale, the values it divides, and whether the scale is short (<= 4 significant bits)."""
    f32 = lambda a: np.asarray(a, np.float64).astype(np.float32).astype(np.float64)
    f16 = lambda a: np.asarray(a, np.float64).astype(np.float32).astype(np.float16).astype(np.float64)
    if asym:
        zero = f16(g.min(1))
        s = f16(f32(f32(g.max(1) - g.min(1)) / ((1 << bits) - 1)))
        v = f32(g - zero[:, None])
    else:
        s = f16(f32(np.abs(g).max(1) / ((1 << (bits - 1)) - 1)))
        v = g
    P = v * f32(1.0 / s)[:, None]  # exact in fp64; the fma rounds once
    n = f32(P + B) - B
    sure = f32(0.5 - np.abs(f32(P - n))) > 2.0**-13
    mant = (np.frexp(s)[0] * 2**11).astype(np.int64)
    return sure, s, v, (mant & -mant) >= 2**7


def report(x, G, asym, bits):
    g = x.reshape(-1, G)
    sure, s, v, short = coded(g, asym, bits)
    q = v / s[:, None]
    tie = q - np.floor(q) == 0.5
    seg = min(G, 32)
    chunks = sure.reshape(-1, 8).all(1).reshape(-1, seg // 8)
    warps = ~chunks[: chunks.shape[0] // 32 * 32].reshape(-1, 32, seg // 8).all(1)
    held = tie[short].sum() / max(tie.sum(), 1)
    print(f"  G={G:<4} {'asym' if asym else 'sym '} int{bits}: not sure {100 * (1 - sure.mean()):.3f} % of elements "
          f"(ties {100 * tie.mean():.3f} %), warps meeting one at chunk k "
          f"{' / '.join(f'{100 * w:.0f}' for w in warps.mean(0))} %, short scales {100 * short.mean():.1f} % "
          f"of groups holding {100 * held:.0f} % of the ties")


if __name__ == "__main__":
    for name, x in (("bench input (uniform [-4, 4))", bench_input()), ("Gaussian rows, varied scales", gaussian_input())):
        print(name)
        for G, asym, bits in ((128, False, 8), (128, True, 8), (32, False, 8), (1024, False, 8), (128, True, 4), (32, True, 4)):
            report(x, G, asym, bits)
