"""kvq eval --runtime llama.cpp: a GGUF model's arithmetic as llama.cpp's CPU backend does it, where
the cost a llama.cpp user measures for a cache type depends on it.

llama.cpp multiplies a weight stored in a GGML type by an input it first converts to that type's
`vec_dot_type` (ggml-cpu's type traits): 8-bit blocks of 32 (q8_0, q8_1) for the legacy 4-, 5- and
8-bit types, iq4_nl, mxfp4 and nvfp4; 8-bit blocks of 256 (q8_K) for the k-quants and the other
i-quants; f16 / bf16 for those weights. So every q/k/v, output and FFN product and the classifier
sees 8-bit inputs, and any small change upstream (a cache type, flash attention on or off) moves
some of those codes to a neighbour, which spreads to the logits. On SmolLM2-135M (Q4_1) that noise
is ~3.5e-3 nats whatever the cache holds: llama.cpp's floor. kvq's exact runtime keeps float32 inputs
and measures the cache alone; this one measures what llama.cpp will report.

The reference is llama.cpp's default cache, f16 K and V (what llama-perplexity --kl-divergence
compares against). q8_0 and q8_1 inputs are kvq's q8_0 codec (ggml's reference rounding; q8_1's
block sum, which only the q4_1 / q5_1 dot reads, is taken exact); q8_K is ggml's
quantize_row_q8_K_ref (fp32 scale max / -127 for the element of largest magnitude, codes <= 127).
"""
import numpy as np

import kvq

REFERENCE = ("fp16", "fp16")  # llama.cpp's default -ctk / -ctv
RUNTIMES = ("exact", "llama.cpp")

# GGML weight type -> the input format of its dot product (ggml-cpu.c, type_traits_cpu[].vec_dot_type)
_Q8_0 = ("Q4_0", "Q5_0", "Q8_0", "IQ4_NL", "MXFP4", "NVFP4", "Q1_0", "Q2_0")
_Q8_K = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
         "IQ4_XS", "TQ1_0", "TQ2_0")
VEC_DOT_INPUT = {"F32": None, "F16": "fp16", "BF16": "bf16", "Q4_1": "q8_1", "Q5_1": "q8_1",
                 **{t: "q8_0" for t in _Q8_0}, **{t: "q8_K" for t in _Q8_K}}
BLOCK = {"q8_0": 32, "q8_1": 32, "q8_K": 256}


def q8_blocks(x):
    """x [..., n] through q8_0 / q8_1 (blocks of 32 along the last axis; n % 32 == 0), dequantized."""
    rows = np.ascontiguousarray(x, dtype=np.float32).reshape(1, 1, -1, x.shape[-1])
    return kvq.quantize(rows, "q8_0").dequantized.reshape(x.shape)


def q8_k_blocks(x):
    """x [..., n] through ggml's q8_K (blocks of 256; n % 256 == 0), dequantized."""
    b = np.asarray(x, dtype=np.float32).reshape(-1, 256)
    pick = np.abs(b).argmax(axis=1)  # the first element of largest magnitude, as ggml's loop keeps it
    peak = b[np.arange(len(b)), pick]
    zero = peak == 0
    iscale = np.where(zero, np.float32(0), np.float32(-127) / np.where(zero, np.float32(1), peak)).astype(np.float32)
    codes = np.minimum(np.rint(iscale[:, None] * b), 127)  # nearest_int: round half to even
    d = np.where(zero, np.float32(0), np.float32(1) / np.where(zero, np.float32(1), iscale)).astype(np.float32)
    return (codes * d[:, None]).astype(np.float32).reshape(x.shape)


def convert(x, fmt):
    """x [..., n] as llama.cpp hands it to a dot product with input format fmt (VEC_DOT_INPUT's values)."""
    if fmt is None:
        return x
    if fmt in ("fp16", "bf16"):
        return kvq.round_to_format(np.ascontiguousarray(x, dtype=np.float32), fmt)
    if x.shape[-1] % BLOCK[fmt]:
        raise ValueError(f"a {fmt} input of {x.shape[-1]} elements: not a multiple of its {BLOCK[fmt]}-element block")
    return q8_k_blocks(x) if fmt == "q8_K" else q8_blocks(x)


class MatmulInputs:
    """forward_sequence's convert_input for a GgufLlama: each product's input rounded by its weight's
    GGML type (GgufLlama.weight_types)."""

    def __init__(self, model):
        self.formats = {}
        for attr, types in model.weight_types().items():
            if attr.startswith("rms"):  # norm weights: element-wise, no product
                continue
            for layer, t in ([(None, types)] if isinstance(types, str) else enumerate(types)):
                if t not in VEC_DOT_INPUT:
                    where = attr if layer is None else f"layer {layer} {attr}"
                    raise ValueError(f"{model.path}: {where} is stored as {t}, a type --runtime llama.cpp does not know "
                                     f"(known: {', '.join(sorted(VEC_DOT_INPUT))})")
                self.formats[attr, layer] = VEC_DOT_INPUT[t]

    def __call__(self, x, attr, layer):
        return convert(x, self.formats[attr, layer])

    def describe(self):
        """{'q8_1': 210, ...}: how many weight products take each input format."""
        counts = {}
        for fmt in self.formats.values():
            counts[fmt or "fp32"] = counts.get(fmt or "fp32", 0) + 1
        return counts
