"""How many chunk slots quantize-tokenteam codes again by the residual, by input (numpy only, CPU).

A token of Hkv x 128 bf16 values is one group (int4-token-asym: fp16 scale (max - min) / 15, zero
min; int8-token: amax / 127), cut into chunks of 8 and owned by a team of L lanes that each hold K = 4
chunks (lane j: chunks j, j + L, ..); a warp holds 32 / L tokens. A warp with a short scale codes
every chunk by the residual (the vote). Elsewhere the warp codes by the biased fma and then again
either every chunk slot when any lane met a half-step (main before this change), or only the slots
k in which some lane did (this change). Inputs and the biased code's test: ../quantize-int8-residual/ties_sim.py.
    python token_retry_sim.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "quantize-int8-residual"))
from ties_sim import bench_input, coded, gaussian_input  # noqa: E402


def report(x, hkv, asym, bits):
    G = 128 * hkv
    sure, _, _, short = coded(x[: x.size // G * G].reshape(-1, G), asym, bits)
    chunks = sure.reshape(sure.shape[0], -1, 8).all(2)
    S, L = chunks.shape[1], 1
    while S > 4 * L:
        L *= 2
    K, per_warp = S // L, 32 // L
    T = chunks.shape[0] // per_warp * per_warp
    unsure = ~chunks[:T].reshape(-1, per_warp, K, L)  # chunk j + L k at [k, j]
    voted = short[:T].reshape(-1, per_warp).any(1)
    whole = K * unsure.reshape(unsure.shape[0], -1).any(1)
    slots = unsure.any(axis=(1, 3)).sum(1)
    name = f"int{bits}-token{'-asym' if asym else ''}"
    print(f"  {name:<16} Hkv {hkv}: {per_warp} tokens a warp, tokens meeting a half-step "
          f"{100 * unsure.any(axis=(2, 3)).mean():4.1f} %, warps voting the residual {100 * voted.mean():4.1f} %; "
          f"the others code again {whole[~voted].mean():.2f} slots of {K} (every slot) -> {slots[~voted].mean():.2f} (the slots met)")


if __name__ == "__main__":
    for name, x in (("bench input (uniform [-4, 4))", bench_input()), ("Gaussian rows, varied scales", gaussian_input())):
        print(name)
        for hkv, asym, bits in ((1, True, 4), (8, True, 4), (1, False, 8), (8, False, 8)):
            report(x, hkv, asym, bits)
