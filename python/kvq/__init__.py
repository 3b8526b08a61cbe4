"""kvq from Python: the CPU codec, kvq's exact fp64 attention and its error metrics (the C++
library itself, bound with nanobind, so results are bit for bit those of the `kvq` tools), and a
K/V cache that quantizes tokens as they are appended (`AppendQuantizer`).

    import numpy as np, kvq
    k = np.random.default_rng(0).standard_normal((1, 4, 256, 64), dtype=np.float32)   # [B, H, T, D]
    r = kvq.quantize(k, "int4-g32-asym")          # codes, scales, zero_points, dequantized
    o, lse = kvq.attention(q, k, v)               # fp64 reference, q [B, Hq, Tq, D]

Errors are kvq.InputError (a ValueError) or kvq.SchemeError with kvq's one-line messages.
kvq.gate (loaded on first use) runs kvq's decode gate on a kernel written elsewhere (docs/gate.md);
kvq.gpu runs kvq's GPU kernels on torch CUDA tensors (built when nvcc was found); kvq.ops registers
them as torch custom ops (torch.ops.kvq.quantize / decode) for CUDA graphs and torch.compile.
"""
from ._core import (Error, HeadError, InputError, OutputError, ProbabilityError, QuantizeResult, Scheme, SchemeError,
                    __version__, alibi_slopes, attention, bits_per_element, bytes_per_token_per_head, default_pairs,
                    dequantize, elements_per_group, fbgemm_rows, hadamard_rotate_back, head_errors, output_error, parse_scheme,
                    parse_scheme_list,
                    probability_error, quantize, quantized_length, round_to_format, scale_shape, sqnr_db)
from ._core import from_ggml_blocks, to_ggml_blocks  # llama.cpp's block layout of q8_0 ... nvfp4
from .streaming import AppendQuantizer, FloatStorage, cache_storage

__all__ = ["Error", "HeadError", "InputError", "OutputError", "ProbabilityError", "QuantizeResult", "Scheme",
           "SchemeError", "__version__", "alibi_slopes", "attention", "bits_per_element", "bytes_per_token_per_head",
           "default_pairs", "dequantize", "elements_per_group", "fbgemm_rows", "hadamard_rotate_back", "head_errors", "output_error", "parse_scheme",
           "parse_scheme_list", "probability_error", "quantize", "quantized_length", "round_to_format", "scale_shape", "sqnr_db", "AppendQuantizer",
           "FloatStorage", "cache_storage"]
__all__ += ["from_ggml_blocks", "to_ggml_blocks"]


def __getattr__(name):
    # kvq.gate and kvq.gate_examples load on first use: `python -m kvq.gate` then runs the module
    # without a second copy of it already imported by the package.
    if name in ("gate", "gate_examples", "gate_kvq", "gate_peers", "gpu", "llamacpp", "ops"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'kvq' has no attribute '{name}'")
