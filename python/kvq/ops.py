"""kvq's GPU kernels as torch custom ops (torch.library): `torch.ops.kvq.quantize` and
`torch.ops.kvq.decode`, with fake (meta) implementations, so that a serving loop can call them inside
CUDA graphs and under torch.compile without graph breaks. They run on the current stream.

    import torch, kvq.ops
    k = kvq.ops.quantize(k_bf16, "int8-head")               # a kvq.gpu.Cache of the op's tensors
    v = kvq.ops.quantize(v_bf16, "q4_0")
    o, lse = kvq.ops.decode(q, k, v, seq_lens=lens)          # O bf16 [B, Hq, D], LSE fp32 [B, Hq]

The ops take a cache as its tensors (codes or values, scales, zero points, nvfp4's tensor scale;
absent ones as empty tensors) and its storage name; kvq.ops.quantize / decode wrap them in
kvq.gpu.Cache terms. Results are those of kvq.gpu.quantize / decode bit for bit (the same launches).
Importing this module needs torch; the ops have CUDA implementations only.
"""
from typing import Optional, Tuple

import torch

from . import gpu

__all__ = ["quantize", "decode"]


def _none_if_empty(t):
    return None if t is None or t.numel() == 0 else t


def _empty_like_absent(x, dtype):
    return x.new_empty((0,), dtype=dtype)


def _quantized_shapes(x, scheme, layout):
    """(codes shape, scale count, scale dtype, zero count, has tensor scale) of kvq.gpu.quantize(x, scheme)."""
    from ._gpu import quantized_sizes
    B, H, T, D = (int(n) for n in x.shape)
    sizes = quantized_sizes(scheme, B, H, T, D, layout)
    dtype = gpu._scale_dtype(torch, scheme)
    item = torch.tensor([], dtype=dtype).element_size()
    codes = (B, T, H, sizes["row_bytes"]) if layout == "fbgemm" else (B, H, T, sizes["row_bytes"])
    return codes, sizes["scales"] // item, dtype, sizes["zeros"] // item, bool(sizes["tensor_scale"])


@torch.library.custom_op("kvq::quantize", mutates_args=(), device_types="cuda")
def _quantize(x: torch.Tensor, scheme: str, layout: str, variant: str) -> Tuple[torch.Tensor, torch.Tensor,
                                                                                 torch.Tensor, torch.Tensor]:
    c = gpu.quantize(x, scheme, layout=layout, variant=variant or None)
    dtype = gpu._scale_dtype(torch, scheme)
    absent = lambda d: _empty_like_absent(x, d)  # noqa: E731
    return (c.data, absent(dtype) if c.scales is None else c.scales, absent(dtype) if c.zero_points is None else c.zero_points,
            absent(torch.float32) if c.tensor_scale is None else c.tensor_scale)


@_quantize.register_fake
def _(x, scheme, layout, variant):
    codes, n_scales, dtype, n_zeros, has_tensor_scale = _quantized_shapes(x, scheme, layout)
    return (x.new_empty(codes, dtype=torch.uint8), x.new_empty((n_scales,), dtype=dtype),
            x.new_empty((n_zeros,), dtype=dtype), x.new_empty(() if has_tensor_scale else (0,), dtype=torch.float32))


@torch.library.custom_op("kvq::decode", mutates_args=(), device_types="cuda")
def _decode(q: torch.Tensor, k: torch.Tensor, k_scales: torch.Tensor, k_zeros: torch.Tensor, k_tensor_scale: torch.Tensor,
            v: torch.Tensor, v_scales: torch.Tensor, v_zeros: torch.Tensor, v_tensor_scale: torch.Tensor,
            seq_lens: Optional[torch.Tensor], k_storage: str, v_storage: str, layout: str, softmax_scale: float,
            variant: str) -> Tuple[torch.Tensor, torch.Tensor]:
    def cache(storage, data, scales, zeros, tensor_scale):
        return gpu.Cache(storage, data, _none_if_empty(scales), _none_if_empty(zeros), layout, _none_if_empty(tensor_scale))
    return gpu.decode(q, cache(k_storage, k, k_scales, k_zeros, k_tensor_scale),
                      cache(v_storage, v, v_scales, v_zeros, v_tensor_scale), seq_lens=seq_lens,
                      softmax_scale=softmax_scale or None, variant=variant or None)


@_decode.register_fake
def _(q, k, k_scales, k_zeros, k_tensor_scale, v, v_scales, v_zeros, v_tensor_scale, seq_lens, k_storage, v_storage,
      layout, softmax_scale, variant):
    return torch.empty_like(q), q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)


def quantize(x, scheme, *, layout="planar", variant=None):
    """kvq.gpu.quantize through the kvq::quantize op: a kvq.gpu.Cache whose tensors the op made."""
    codes, scales, zeros, tensor_scale = torch.ops.kvq.quantize(x, scheme, layout, variant or "")
    return gpu.Cache(scheme, codes, scales if scales.numel() else None, zeros if zeros.numel() else None,
                     "fbgemm" if layout == "fbgemm" else "bnsh", tensor_scale if tensor_scale.dim() == 0 else None)


def decode(q, k, v, *, seq_lens=None, softmax_scale=None, variant=None):
    """kvq.gpu.decode through the kvq::decode op: q bf16 [B, Hq, D] over k, v (kvq.gpu.Cache, or bf16 /
    fp16 tensors [B, Hkv, T, D]); returns (O bf16 [B, Hq, D], LSE fp32 [B, Hq])."""
    k, v = (c if isinstance(c, gpu.Cache) else gpu.raw(c) for c in (k, v))
    if k.layout != v.layout:
        raise gpu.InputError(f"kvq.ops.decode: K in layout {k.layout}, V in {v.layout}: one layout for both")

    def parts(c):
        absent = lambda d: _empty_like_absent(c.data, d)  # noqa: E731
        scale_dtype = c.scales.dtype if c.scales is not None else torch.float16
        return (c.data, absent(scale_dtype) if c.scales is None else c.scales,
                absent(scale_dtype) if c.zero_points is None else c.zero_points,
                absent(torch.float32) if c.tensor_scale is None else c.tensor_scale)

    return torch.ops.kvq.decode(q, *parts(k), *parts(v), seq_lens, k.storage, v.storage, k.layout,
                                float(softmax_scale or 0.0), variant or "")
