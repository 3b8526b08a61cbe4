"""kvq's GPU kernels as torch custom ops (torch.library): `torch.ops.kvq.quantize` and
`torch.ops.kvq.decode`, with fake (meta) implementations, so that a serving loop can call them under
torch.compile without graph breaks, and decode inside a CUDA graph. They run on the current stream,
and take their memory from torch's allocator. quantize and append check their input for Inf / NaN
and wait for the answer, unless given a status (kvq.gpu.new_status()): then they wait on nothing,
record errors there for kvq.gpu.check_status, and can be captured in a CUDA graph.

    import torch, kvq.ops
    k = kvq.ops.quantize(k_bf16, "int8-head")               # a kvq.gpu.Cache of the op's tensors
    v = kvq.ops.quantize(v_bf16, "q4_0")
    o, lse = kvq.ops.decode(q, k, v, seq_lens=lens)          # O bf16 [B, Hq, D], LSE fp32 [B, Hq]

The ops take a cache as its tensors (codes or values, scales, zero points, nvfp4's tensor scale;
absent ones as empty tensors) and its storage name; kvq.ops.quantize / decode wrap them in
kvq.gpu.Cache terms. Results are those of kvq.gpu.quantize / decode bit for bit (the same launches).
Importing this module needs torch; the ops have CUDA implementations only.
"""
from typing import NamedTuple, Optional, Tuple

import torch

from . import gpu

__all__ = ["quantize", "decode", "decode_args", "empty_cache", "empty_paged_cache", "page_tokens_error", "append"]


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


@torch.library.custom_op("kvq::quantize", mutates_args=("status",), device_types="cuda")
def _quantize(x: torch.Tensor, scheme: str, layout: str, variant: str, tensor_scale: Optional[float],
              status: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    c = gpu.quantize(x, scheme, layout=layout, variant=variant or None, tensor_scale=tensor_scale, status=status)
    dtype = gpu._scale_dtype(torch, scheme)
    absent = lambda d: _empty_like_absent(x, d)  # noqa: E731
    return (c.data, absent(dtype) if c.scales is None else c.scales, absent(dtype) if c.zero_points is None else c.zero_points,
            absent(torch.float32) if c.tensor_scale is None else c.tensor_scale)


@_quantize.register_fake
def _(x, scheme, layout, variant, tensor_scale, status):
    codes, n_scales, dtype, n_zeros, has_tensor_scale = _quantized_shapes(x, scheme, layout)
    return (x.new_empty(codes, dtype=torch.uint8), x.new_empty((n_scales,), dtype=dtype),
            x.new_empty((n_zeros,), dtype=dtype), x.new_empty(() if has_tensor_scale else (0,), dtype=torch.float32))


@torch.library.custom_op("kvq::decode", mutates_args=(), device_types="cuda")
def _decode(q: torch.Tensor, k: torch.Tensor, k_scales: torch.Tensor, k_zeros: torch.Tensor, k_tensor_scale: torch.Tensor,
            v: torch.Tensor, v_scales: torch.Tensor, v_zeros: torch.Tensor, v_tensor_scale: torch.Tensor,
            seq_lens: Optional[torch.Tensor], k_storage: str, v_storage: str, layout: str, softmax_scale: float,
            variant: str, block_table: Optional[torch.Tensor], k_window: Optional[torch.Tensor] = None,
            v_window: Optional[torch.Tensor] = None,
            window_table: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    def cache(storage, data, scales, zeros, tensor_scale, window):
        return gpu.Cache(storage, data, _none_if_empty(scales), _none_if_empty(zeros), layout, _none_if_empty(tensor_scale),
                         window)
    return gpu.decode(q, cache(k_storage, k, k_scales, k_zeros, k_tensor_scale, k_window),
                      cache(v_storage, v, v_scales, v_zeros, v_tensor_scale, v_window), seq_lens=seq_lens,
                      softmax_scale=softmax_scale or None, variant=variant or None, block_table=block_table,
                      window_table=window_table)


@_decode.register_fake
def _(q, k, k_scales, k_zeros, k_tensor_scale, v, v_scales, v_zeros, v_tensor_scale, seq_lens, k_storage, v_storage,
      layout, softmax_scale, variant, block_table, k_window=None, v_window=None, window_table=None):
    return torch.empty_like(q), q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)


def quantize(x, scheme, *, layout="planar", variant=None, tensor_scale=None, status=None):
    """kvq.gpu.quantize through the kvq::quantize op: a kvq.gpu.Cache whose tensors the op made
    (tensor_scale: a calibrated tensor-wide scale, see kvq.gpu.quantize; status: see the module's note)."""
    codes, scales, zeros, tensor_scale = torch.ops.kvq.quantize(x, scheme, layout, variant or "",
                                                                None if tensor_scale is None else float(tensor_scale),
                                                                status)
    return gpu.Cache(scheme, codes, _none_if_empty(scales), _none_if_empty(zeros), "fbgemm" if layout == "fbgemm" else "bnsh",
                     tensor_scale if tensor_scale.dim() == 0 else None)


def decode_args(q, k, v, *, seq_lens=None, softmax_scale=None, variant=None, block_table=None, window_table=None):
    """The arguments of torch.ops.kvq.decode for kvq.ops.decode(q, k, v, ...): each Cache as its tensors
    (absent ones empty) and storage name (for torch.library.opcheck, or a caller of the op itself)."""
    k, v = (c if isinstance(c, gpu.Cache) else gpu.raw(c) for c in (k, v))
    if k.layout != v.layout:
        raise gpu.InputError(f"kvq.ops.decode: K in layout {k.layout}, V in {v.layout}: one layout for both")

    def parts(c):
        absent = lambda d: _empty_like_absent(c.data, d)  # noqa: E731
        scale_dtype = c.scales.dtype if c.scales is not None else torch.float16
        return (c.data, absent(scale_dtype) if c.scales is None else c.scales,
                absent(scale_dtype) if c.zero_points is None else c.zero_points,
                absent(torch.float32) if c.tensor_scale is None else c.tensor_scale)

    return (q, *parts(k), *parts(v), seq_lens, k.storage, v.storage, k.layout, float(softmax_scale or 0.0), variant or "",
            block_table, k.window, v.window, window_table)


def decode(q, k, v, *, seq_lens=None, softmax_scale=None, variant=None, block_table=None, window_table=None):
    """kvq.gpu.decode through the kvq::decode op: q bf16 [B, Hq, D] over k, v (kvq.gpu.Cache, or bf16 /
    fp16 tensors [B, Hkv, T, D]); paged caches (empty_paged_cache's) with block_table int32 [B, pages per
    sequence], and for +wW schemes window_table (the window pool's pages, the same shape). Returns (O
    bf16 [B, Hq, D], LSE fp32 [B, Hq])."""
    return torch.ops.kvq.decode(*decode_args(q, k, v, seq_lens=seq_lens, softmax_scale=softmax_scale, variant=variant,
                                             block_table=block_table, window_table=window_table))


RAW_STORAGES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class _Facts(NamedTuple):
    """What append needs of a storage, as plain values (torch.compile folds them to constants)."""
    raw: bool
    per_token: bool           # one parameter set per token (all heads): scales [.., T]
    per_tensor: bool          # no per-row parameters (scale-free FP8, a per-tensor scale)
    tensor_scale: bool        # takes a calibrated tensor_scale (nvfp4's s_t, a per-tensor scheme's scale)
    base: str                 # what quantize writes: the storage less its +w<W> window
    window: bool              # +w<W>: the raw tokens kept beside the codes (Cache.window)
    channel: bool             # chan-t<N>: a group is quantized from the window store once it fills
    storage: str              # the cache's storage name (a plain chan-t<N> cache is read as +w0)


@torch.compiler.assume_constant_result
def _facts(storage: str, name: str) -> _Facts:
    """The storage's facts if append can write it a token at a time (a raw bf16 / fp16 storage, or a
    scheme whose codes and parameters of a token depend on that token alone); else kvq.SchemeError
    naming why not."""
    if storage in RAW_STORAGES:
        return _Facts(True, False, False, False, storage, False, False, storage)
    from ._core import SchemeError, parse_scheme
    s = parse_scheme(storage)
    if s.granularity == "channel":
        if s.hadamard:
            raise SchemeError(f"{name}: {storage}: a chan-t<N> cache keeps its filling token group raw in a window, "
                              "and decode-tc does not read a rotated (+had) window")
        return _Facts(False, False, False, False, s.without_window.name, True, True,
                      s.name if s.window is not None else s.name + "+w0")
    if s.window is not None and s.hadamard:
        raise SchemeError(f"{name}: {storage}: decode-tc does not read a rotated (+had) window")
    if s.granularity == "tensor" and s.asymmetric:
        raise SchemeError(f"{name}: {storage}: a per-tensor zero point needs the whole cache, which appending does not have")
    per_tensor = s.granularity == "tensor"
    return _Facts(False, s.granularity == "token", per_tensor, s.format == "nvfp4" or (per_tensor and not s.scale_free),
                  s.without_window.name, s.window is not None, False, s.name)


def _check_tensor_scale(f, storage, tensor_scale, name):
    """nvfp4 and the per-tensor schemes with a scale append with a calibrated tensor_scale (a whole
    cache's amax is unknown while appending); the other storages take none."""
    if f.tensor_scale != (tensor_scale is not None):
        from ._core import SchemeError
        raise SchemeError(f"{name}: {storage}: " + (
            "appends with a calibrated tensor_scale (a float: nvfp4's s_t, a per-tensor scheme's scale)"
            if tensor_scale is None else "takes no tensor_scale (only nvfp4 and the per-tensor schemes with a scale do)"))


@torch.library.custom_op("kvq::append_rows", mutates_args=("dst_codes", "dst_scales", "dst_zeros", "status"),
                         device_types="cuda")
def _append_rows(src_codes: torch.Tensor, dst_codes: torch.Tensor, src_scales: Optional[torch.Tensor],
                 dst_scales: Optional[torch.Tensor], src_zeros: Optional[torch.Tensor], dst_zeros: Optional[torch.Tensor],
                 positions: torch.Tensor, block_table: Optional[torch.Tensor], page_tokens: int, param_heads: int,
                 status: torch.Tensor, check: bool) -> None:
    from ._gpu import append_rows
    append_rows(src_codes, dst_codes, src_scales, dst_scales, src_zeros, dst_zeros, positions, block_table, page_tokens,
                param_heads, status, check, gpu._stream(torch, src_codes))


@_append_rows.register_fake
def _(src_codes, dst_codes, src_scales, dst_scales, src_zeros, dst_zeros, positions, block_table, page_tokens, param_heads,
      status, check):
    return None


@torch.library.custom_op("kvq::flush_channel_groups", mutates_args=("codes", "scales", "zeros", "status"),
                         device_types="cuda")
def _flush_channel_groups(x: torch.Tensor, storage: str, codes: torch.Tensor, scales: torch.Tensor,
                          zeros: Optional[torch.Tensor], window: torch.Tensor, positions: torch.Tensor,
                          block_table: Optional[torch.Tensor], window_table: Optional[torch.Tensor], page_tokens: int,
                          status: torch.Tensor, check: bool) -> None:
    from ._gpu import flush_channel_groups
    flush_channel_groups(x, storage, codes, scales, zeros, window, positions, block_table, window_table, page_tokens,
                         status, gpu._stream(torch, x))
    if check:
        gpu.check_status(status, "kvq.ops.append")


@_flush_channel_groups.register_fake
def _(x, storage, codes, scales, zeros, window, positions, block_table, window_table, page_tokens, status, check):
    return None


def page_tokens_error(page_tokens):
    """The rule kvq's paged decode (decode_support) holds pages of `page_tokens` tokens to, where they
    break it; else ""."""
    if page_tokens < 16 or page_tokens & (page_tokens - 1):
        return "kvq's paged decode reads pages of a power of two >= 16 tokens"
    return ""


def _check_counts(name, **counts):
    """InputError naming the first of `counts` (a cache's sizes) below 1, before anything is allocated."""
    for what, n in counts.items():
        if n < 1:
            raise gpu.InputError(f"{name}: {what} = {n}, expected >= 1")


def empty_cache(scheme, batch, heads, capacity, head_dim, *, device="cuda", tensor_scale=None):
    """A K or V cache of `capacity` tokens in `scheme` (a token-local scheme, or raw "bf16" / "fp16":
    see append), every slot zero: the tensors kvq.ops.quantize would give for [batch, heads, capacity,
    head_dim]. nvfp4 and the per-tensor schemes with a scale (fp8-e4m3-tensor, int8-tensor, ...) need
    a calibrated tensor_scale (a whole cache's amax is not known while appending). +w<W> schemes: a
    bf16 window of every slot beside the codes (Cache.window; decode reads its last W tokens).
    chan-t<N>[+w<W>] (KIVI): a token group's codes and per-channel parameters are written when it fills
    and the window has passed it; until then its tokens are read raw from the window store, so a plain
    chan-t<N> cache is named and read as chan-t<N>+w0."""
    f = _facts(scheme, "kvq.ops.empty_cache")
    _check_tensor_scale(f, scheme, tensor_scale, "kvq.ops.empty_cache")
    _check_counts("kvq.ops.empty_cache", heads=heads, capacity=capacity, head_dim=head_dim)
    if batch < 0:
        raise gpu.InputError(f"kvq.ops.empty_cache: batch = {batch}, expected >= 0")
    zeros = torch.zeros(batch, heads, capacity, head_dim, dtype=RAW_STORAGES.get(scheme, torch.bfloat16), device=device)
    if f.raw:
        return gpu.Cache(scheme, zeros)
    c = quantize(zeros, f.base, tensor_scale=tensor_scale)
    return gpu.Cache(f.storage, c.data, c.scales, c.zero_points, c.layout, c.tensor_scale, zeros if f.window else None)


def empty_paged_cache(scheme, pages, page_tokens, heads, head_dim, *, device="cuda", tensor_scale=None,
                      window_pages=None, params_in_page=False, layout="nhd"):
    """A paged K or V cache (a token-local scheme or raw "bf16" / "fp16", see append): a pool of `pages`
    pages of `page_tokens` tokens (a power of two >= 16), every slot zero. Codes (values) [pages, P,
    heads, row bytes (D)]: layout "nhd" stores them so (vLLM's and FlashInfer's NHD pools), "hnd" stores
    each page head-major, [pages, heads, P, row] (FlashInfer's HND, TensorRT-LLM's blocks), and the Cache
    holds its [pages, P, heads, row] view, which append and decode read through its strides. HND keeps a
    head's rows of a page together: in pages of 16, int8-head and fp8-e4m3 decodes at B >= 8 take a
    median 1.03x (max 1.06x) the contiguous cache's time from HND pools, 1.05x (max 1.15-1.17x) from NHD
    ones (H200, experiments/results/nvidia-h200/paged-decode-8bit/). Scales and zero points are
    head-major in their page ([pages, heads, P, groups]; per token [pages, P]) in both: a kvq.gpu.Cache
    of layout "paged", which append and decode take with the block table. +w<W> schemes: a pool of `window_pages` (default
    `pages`) bf16 pages [window_pages, P, heads, D] (in `layout`'s order) for the window's raw tokens
    (Cache.window), which append and decode take with a window_table: a sequence needs pages only for the
    window's tokens, ceil(W / P) + 1 at most at a time (a ring of pages), not for its whole length.
    params_in_page: one pool, each page its codes then its scales then its zero points (kvq.gpu.one_pool:
    views of the same shapes), instead of a pool each."""
    f = _facts(scheme, "kvq.ops.empty_paged_cache")
    _check_tensor_scale(f, scheme, tensor_scale, "kvq.ops.empty_paged_cache")
    _check_counts("kvq.ops.empty_paged_cache", pages=pages, heads=heads, head_dim=head_dim)
    if page_tokens_error(page_tokens):  # asked before any allocation
        raise gpu.InputError(f"kvq.ops.empty_paged_cache: pages of {page_tokens} tokens: "
                             f"{page_tokens_error(page_tokens)}")
    if window_pages is not None and window_pages < 1:
        raise gpu.InputError(f"kvq.ops.empty_paged_cache: window_pages = {window_pages}, expected >= 1")
    if layout not in ("nhd", "hnd"):
        raise gpu.InputError(f"kvq.ops.empty_paged_cache: layout {layout!r}, expected 'nhd' or 'hnd'")
    if f.channel and page_tokens % _group_tokens(scheme):
        raise gpu.InputError(f"kvq.ops.empty_paged_cache: {scheme}: pages of {page_tokens} tokens do not hold whole "
                             f"token groups of {_group_tokens(scheme)} (N must divide P)")
    hnd = layout == "hnd"

    def stored(x):  # x [pages, heads, P, ...] -> the pool in `layout`'s order, as a [pages, P, heads, ...] view
        return x.transpose(1, 2) if hnd else x.transpose(1, 2).contiguous()
    if f.raw:
        return gpu.Cache(scheme, stored(torch.zeros(pages, heads, page_tokens, head_dim, dtype=RAW_STORAGES[scheme],
                                                    device=device)), layout="paged")
    # each page a planar cache of P tokens: its parameters are already head-major
    flat = quantize(torch.zeros(pages, heads, page_tokens, head_dim, dtype=torch.bfloat16, device=device), f.base,
                    tensor_scale=tensor_scale)
    window = None
    if f.window:
        window = stored(torch.zeros(pages if window_pages is None else window_pages, heads, page_tokens, head_dim,
                                    dtype=torch.bfloat16, device=device))
    data, scales, zeros = flat.data if hnd else flat.data.transpose(1, 2).contiguous(), flat.scales, flat.zero_points
    if params_in_page and scales is not None and scales.numel() > 1:
        shaped = (lambda a: a if a is None else a.view(pages, -1))  # a page's parameters: one row of the pool
        data, scales, zeros = gpu.one_pool(data, shaped(scales), shaped(zeros))
    return gpu.Cache(f.storage, data.transpose(1, 2) if hnd else data, scales, zeros, "paged", flat.tensor_scale,
                     window)


@torch.compiler.assume_constant_result
def _group_tokens(storage: str) -> int:
    from ._core import parse_scheme
    return parse_scheme(storage).group


def _append_channel(cache, x, positions, block_table, window_table, page_tokens, status):
    """chan-t<N>[+w<W>]: the new tokens' values into the window store, then every token group this call
    completes (N tokens in, the window past them) quantized from it, kvq.AppendQuantizer's codes."""
    if x.dtype != torch.bfloat16:
        raise gpu.InputError(f"kvq.ops.append: {cache.storage}: new tokens of dtype {x.dtype}, expected torch.bfloat16 "
                             "(a chan-t<N> group is quantized from the bf16 values it waited in)")
    x = x.contiguous()
    flags = status if status is not None else gpu.new_status(x.device)
    torch.ops.kvq.append_rows(x, cache.window, None, None, None, None, positions, window_table, page_tokens, x.shape[1],
                              flags, status is None)
    torch.ops.kvq.flush_channel_groups(x, cache.storage, cache.data, cache.scales, cache.zero_points, cache.window,
                                       positions, block_table, window_table, page_tokens, flags, status is None)
    return cache


def append(cache, x, positions, *, tensor_scale=None, block_table=None, window_table=None, status=None):
    """Writes new tokens x [B, H, t, D] into `cache` (kvq.ops.empty_cache's, or any planar Cache of a
    token-local scheme or raw bf16 / fp16; or empty_paged_cache's with its block_table [B, pages per
    sequence]) at slots positions[b] .. positions[b] + t - 1 of each sequence b (positions: an int
    tensor [B] on the device), in place: the codes and parameters kvq.AppendQuantizer gives for those
    tokens, bit for bit (a token-local scheme's codes depend on the token alone); raw storages the
    values rounded to their dtype. Two launches per call (kvq::quantize, then kvq::append_rows
    writing the rows at their slots or pages): it compiles with torch.compile (fullgraph); with a status (kvq.gpu.new_status()) nothing waits on the
    device and it can be captured in a CUDA graph (errors are recorded there: kvq.gpu.check_status).
    nvfp4 and the per-tensor schemes: tensor_scale, the cache's calibrated scale as given to
    empty_cache (a float, so that nothing waits on the device; the cache keeps the one it was made
    with, so another one here would give codes its scale does not decode). +w<W> schemes: every new
    token's codes (kvq.AppendQuantizer's once the window passes it: token-local) and its raw values
    into Cache.window (paged: through window_table, the window pool's pages; the same shape as
    block_table); one more launch. chan-t<N>[+w<W>]: x must be bf16; its values go into the window store
    and each token group the call completes is quantized from there (kvq.AppendQuantizer's codes and
    parameters, bit for bit); the window pages must still hold a group's tokens when it completes
    (W + N tokens back). Returns the cache."""
    f = _facts(cache.storage, "kvq.ops.append")
    if cache.layout not in ("bnsh", "paged"):
        raise gpu.InputError(f"kvq.ops.append: a {cache.layout} cache; append writes planar (bnsh) and paged caches")
    paged = cache.layout == "paged"
    if paged != (block_table is not None):
        raise gpu.InputError("kvq.ops.append: " + ("a paged cache needs its block_table" if paged
                                                   else "a block_table goes with a paged cache (empty_paged_cache)"))
    if paged:
        pages, P, H, _ = cache.data.shape
        B = block_table.shape[0]
    else:
        B, H, T, _ = cache.data.shape
    if x.dim() != 4 or x.shape[0] != B or x.shape[1] != H:
        raise gpu.InputError(f"kvq.ops.append: new tokens have shape {list(x.shape)}, expected [{B}, {H}, t, D]")
    t = x.shape[2]
    _check_tensor_scale(f, cache.storage, tensor_scale, "kvq.ops.append")
    if paged and f.window != (window_table is not None):
        raise gpu.InputError("kvq.ops.append: " + ("a paged +w<W> cache needs its window_table" if f.window
                                                   else "a window_table goes with a paged +w<W> cache"))
    if status is None and not torch.compiler.is_compiling() and torch.cuda.is_current_stream_capturing():
        raise gpu.InputError("kvq.ops.append: under CUDA graph capture it needs status= (kvq.gpu.new_status()): "
                             "without one it waits for its checks, which a capture cannot")
    if f.channel:
        return _append_channel(cache, x, positions.to(torch.int32), block_table, window_table, P if paged else 0, status)
    if f.raw:
        new = gpu.Cache(cache.storage, x.to(RAW_STORAGES[cache.storage]).contiguous())
    else:  # without a status, quantize raises for bad input itself (naming the element and its value)
        new = quantize(x, f.base, tensor_scale=tensor_scale, status=status)
    flags = status if status is not None else gpu.new_status(x.device)
    params = not f.raw and not f.per_tensor
    positions = positions.to(torch.int32)
    torch.ops.kvq.append_rows(new.data, cache.data, new.scales if params else None, cache.scales if params else None,
                              new.zero_points if params else None, cache.zero_points if params else None,
                              positions, block_table, P if paged else 0, 1 if f.per_token else H, flags, status is None)
    if f.window:
        torch.ops.kvq.append_rows(x.to(cache.window.dtype).contiguous(), cache.window, None, None, None, None, positions,
                                  window_table, P if paged else 0, H, flags, status is None)
    return cache
