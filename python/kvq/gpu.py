"""kvq's GPU kernels on torch CUDA tensors: the quantize and decode variants of `kvq variants`, with
the same storages, names and errors as the command line. Tensors go in and out through DLPack (no
copies) and every launch is enqueued on torch's current stream.

    import torch, kvq.gpu
    k = torch.randn(8, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)         # [B, Hkv, T, D]
    kc = kvq.gpu.quantize(k, "int8-head")                    # Cache: codes, scales (, zero_points)
    o, lse = kvq.gpu.decode(q, kc, vc, seq_lens=lens)        # q bf16 [B, Hq, D]; O bf16, LSE fp32

Needs the module kvq._gpu, built with the kernels when nvcc is found (`pip install .` or the developer
build); available() says whether it and a CUDA device are there, and why_unavailable() why not.
"""
from dataclasses import dataclass
from typing import Any

from ._core import InputError

try:
    from . import _gpu
    _IMPORT_ERROR = None
except ImportError as e:  # a CPU-only build
    _gpu, _IMPORT_ERROR = None, e

__all__ = ["Cache", "available", "why_unavailable", "device", "variants", "quantize", "dequantize", "decode", "raw",
           "new_status", "check_status", "one_pool"]


def why_unavailable():
    """Why the GPU kernels cannot run here, or "" when they can."""
    if _gpu is None:
        return (f"kvq was built without its CUDA kernels (no nvcc at build time: {_IMPORT_ERROR}); rebuild with nvcc "
                "on PATH")
    try:
        import torch
    except ImportError:
        return "kvq.gpu takes torch CUDA tensors: torch is not installed"
    if not torch.cuda.is_available() or not _gpu.available():
        return "no CUDA device"
    return ""


def available():
    return why_unavailable() == ""


def _require():
    why = why_unavailable()
    if why:
        raise RuntimeError(f"kvq.gpu: {why}")
    import torch
    return torch


def device():
    """The current device: name, SM count, compute capability, driver and runtime."""
    _require()
    return _gpu.device()


def variants(kind=None):
    """Registered variants as dicts (kind, name, summary, supports, incumbent); kind "quantize" / "decode"."""
    _require()
    return [v for v in _gpu.variants() if kind is None or v["kind"] == kind]


@dataclass(frozen=True)
class Cache:
    """K or V on the device as a kernel reads it. Raw storages ("bf16", "fp16") hold `data` (values);
    kvq schemes hold `data` (codes: planar [B, H, T, D*bits/8], q5_0 / q5_1 [B, H, T, 5D/8]; "fbgemm":
    rows [B, T, H, D/2 + 4n]), `scales` and `zero_points` in group order (quant/groups.hpp; None where
    the scheme has none), in the scale dtype as kvq.quantize gives them (float16, float32, or uint8 bytes
    for mxfp4's e8m0 and nvfp4's e4m3), and nvfp4's `tensor_scale` (a float32 0-dim tensor on the device).
    layout: "bnsh" or "bsnh" (raw and planar codes), or "fbgemm"; or "paged": `data` a pool of pages
    [pages, P, Hkv, D] (raw) or [pages, P, Hkv, row bytes] (codes), read through its strides (vLLM's and
    FlashInfer's NHD pools, an HND pool as its transposed view, K or V of a pool that interleaves them),
    `scales` / `zero_points` [pages, Hkv, P(, groups)] (per-token schemes [pages, P]), contiguous or
    each page's contiguous at a page stride of their own (one_pool's views): decode takes the block
    table. +wW schemes: `window`, the raw bf16 / fp16 values the window keeps, [B, H, T, D] beside bnsh
    codes (only the window's tokens are read), or a pool of pages [pages', P, Hkv, D] beside paged ones,
    read through decode's window_table (only the window's pages need be held)."""
    storage: str
    data: Any
    scales: Any = None
    zero_points: Any = None
    layout: str = "bnsh"
    tensor_scale: Any = None
    window: Any = None

    def _as_dict(self):
        return {"storage": self.storage, "layout": self.layout, "data": self.data, "scales": self.scales,
                "zero_points": self.zero_points, "tensor_scale": self.tensor_scale, "window": self.window}


def raw(x, layout="bnsh"):
    """A bf16 / fp16 tensor as a Cache of its own dtype."""
    torch = _require()
    names = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    if x.dtype not in names:
        raise InputError(f"kvq.gpu.raw: dtype {x.dtype}, expected torch.bfloat16 or torch.float16")
    return Cache(names[x.dtype], x, layout=layout)


def one_pool(*pools, align=128):
    """Pools of pages [pages, ...] (a paged Cache's codes, scales, zero points; None stays None) copied
    into one pool whose page holds each of theirs in turn, each part at a multiple of `align` bytes
    into the page (a multiple of 16; 128 keeps the parts' rows on whole cache lines); returns views of
    the given shapes and dtypes into it, which decode and kvq.ops.append read and write as they do the
    separate pools. One allocation a page, as engines that keep a block's parameters beside its codes
    (lmdeploy) do; on the H100 not faster than pools of their own (paged-decode/params-in-page/)."""
    import torch
    held = [a for a in pools if a is not None]
    if not held or align % 16 or any(a.dim() < 1 or a.shape[0] != held[0].shape[0] for a in held):
        raise InputError(f"kvq.gpu.one_pool: pools of one page count (shapes {[tuple(a.shape) for a in held]}) and an "
                         f"align that is a multiple of 16 (got {align})")
    sizes = [a[0].numel() * a.element_size() for a in held]
    offsets, page_bytes = [], 0
    for n in sizes:
        offsets.append(page_bytes)
        page_bytes += -(-n // align) * align
    pool = torch.empty(held[0].shape[0], page_bytes, dtype=torch.uint8, device=held[0].device)
    views = iter([pool[:, o:o + n].view(a.dtype).view(a.shape) for a, o, n in zip(held, offsets, sizes)])
    out = tuple(None if a is None else next(views) for a in pools)
    for view, a in zip(out, pools):
        if a is not None:
            view.copy_(a)
    return out


def _stream(torch, x):
    return torch.cuda.current_stream(x.device).cuda_stream


def _on_cuda(x, what):
    """Raises kvq.InputError unless x is a torch CUDA tensor (the kernels' own check names the rest)."""
    if not getattr(x, "is_cuda", False):
        where = getattr(x, "device", type(x).__name__)
        raise InputError(f"{what}: expected a CUDA tensor, got one on {where} (move it with .cuda())")


def quantize(x, scheme, *, layout="planar", variant=None, seq_lens=None, tensor_scale=None, status=None):
    """x [B, H, T, D] (fp32 / fp16 / bf16, any strides but D's) quantized with `scheme` by a GPU
    variant (None: the first specialised one that takes it, else quantize-generic; all are bit-exact
    with the CPU codec). layout "planar" or "fbgemm" (the block formats q8_0 ... nvfp4: planar).
    seq_lens (+wW schemes): per-sequence lengths; the Cache's window is then x itself (bf16 / fp16 x;
    other dtypes rounded to bf16), whose window tokens decode reads. tensor_scale: a calibrated tensor-wide scale (a float):
    nvfp4's s_t (default: amax / (6 * 448) of x, computed on the device) or a symmetric per-tensor
    scheme's one scale (fp8-e4m3-tensor, int8-tensor, ...; default: amax / FMAX or qmax). Returns a Cache; raises kvq.InputError /
    SchemeError with the CLI's messages. status (new_status()'s): the call waits on nothing and can be
    captured in a CUDA graph; non-finite input or an overflowing scale is recorded there for
    check_status instead of raising here (memory comes from torch's allocator either way)."""
    torch = _require()
    _on_cuda(x, "x")
    if x.dim() != 4:
        raise InputError(f"kvq.gpu.quantize: x has shape {list(x.shape)}, expected [B, H, T, D]")
    B, H, T, D = (int(n) for n in x.shape)
    sizes = _gpu.quantized_sizes(scheme, B, H, T, D, layout)
    with torch.cuda.device(x.device):
        new = lambda n: torch.empty(n, dtype=torch.uint8, device=x.device)  # noqa: E731
        codes = new(sizes["codes"])
        scales = new(sizes["scales"]) if sizes["scales"] else None
        zeros = new(sizes["zeros"]) if sizes["zeros"] else None
        ts = torch.empty((), dtype=torch.float32, device=x.device) if sizes["tensor_scale"] else None
        lens = [] if seq_lens is None else [int(n) for n in seq_lens]
        if lens and status is not None:
            raise InputError("kvq.gpu.quantize: seq_lens are uploaded to the device, which a call with status "
                             "(a capturable one) does not do")
        _gpu.quantize(x, scheme, codes, scales, zeros, ts, None if tensor_scale is None else float(tensor_scale), layout,
                      variant or "", lens, _stream(torch, x), new(sizes["scratch"]), status)
    if layout == "fbgemm":
        return Cache(scheme, codes.view(B, T, H, sizes["row_bytes"]), layout="fbgemm")
    scale_dtype = _scale_dtype(torch, scheme)
    from ._core import parse_scheme
    window = None
    if parse_scheme(scheme).window is not None:
        window = x if x.dtype in (torch.bfloat16, torch.float16) else x.to(torch.bfloat16)
    return Cache(scheme, codes.view(B, H, T, sizes["row_bytes"]),
                 None if scales is None else scales.view(scale_dtype),
                 None if zeros is None else zeros.view(scale_dtype), tensor_scale=ts, window=window)


def new_status(device="cuda"):
    """Error flags for quantize and append calls that must not wait on the device (quantize(...,
    status=), kvq.ops.append under a CUDA graph): int64 [3] on `device`, -1 (no error) until a call
    records the first non-finite input element, overflowing scale group, or appended token whose slot
    lies outside its cache. Read with check_status."""
    torch = _require()
    return torch.full((3,), -1, dtype=torch.int64, device=device)


def check_status(status, name="quantize"):
    """Raises kvq.InputError if a call that recorded into `status` met non-finite input, a scale that
    overflows its dtype, or an appended token whose slot lies outside its cache (waits for the device);
    clears nothing (status.fill_(-1) does)."""
    bad, overflow, outside = (int(f) for f in status.tolist())
    if bad != -1:
        raise InputError(f"{name}: a non-finite value in the tokens given (flat element {bad} of its call's input "
                         "[B, H, t, D] in C order; the smallest such index of the calls that met one); the codes "
                         "written for it are not the codec's")
    if overflow != -1:
        raise InputError(f"{name}: a scale overflows its dtype (group {overflow} in group order of its call's input; "
                         "the smallest of the calls that met one): values too large for the scheme")
    if outside != -1:
        raise InputError(f"{name}: an appended token's slot lies outside its cache (token {outside} of its call, counted "
                         "b * t + i; the smallest of the calls that met one): a position past the capacity, or a block "
                         "table entry past the pool's pages; that token was not written")


def dequantize(cache, head_dim=None):
    """The values a planar Cache (kvq.gpu.quantize's) stands for: float32 [B, H, T, D] on its device,
    the bits of the CPU's kvq.quantize(...).dequantized (the same codec arithmetic). +had schemes give
    the rotated values (what is stored); a +wW window's tokens the value of code 0. head_dim: D
    (default: from the codes' row bytes)."""
    torch = _require()
    if not isinstance(cache, Cache) or cache.layout != "bnsh" or cache.storage in ("bf16", "fp16"):
        raise InputError("kvq.gpu.dequantize: expected a planar Cache from kvq.gpu.quantize")
    from ._core import parse_scheme
    codes = cache.data
    _on_cuda(codes, "codes")
    if codes.dim() != 4:
        raise InputError(f"kvq.gpu.dequantize: codes have shape {list(codes.shape)}, expected [B, H, T, row bytes]")
    D = int(head_dim) if head_dim is not None else int(codes.shape[3]) * 8 // parse_scheme(cache.storage).bits
    with torch.cuda.device(codes.device):
        out = torch.empty(*codes.shape[:3], D, dtype=torch.float32, device=codes.device)
        as_bytes = lambda t: None if t is None else t.contiguous().view(torch.uint8)  # noqa: E731
        _gpu.dequantize(codes, cache.storage, D, as_bytes(cache.scales), as_bytes(cache.zero_points),
                        cache.tensor_scale, out, _stream(torch, codes))
    return out


def _scale_dtype(torch, scheme):
    from ._core import parse_scheme
    return {"float16": torch.float16, "float32": torch.float32}.get(parse_scheme(scheme).scale_dtype, torch.uint8)


def decode(q, k, v, *, seq_lens=None, alibi_slopes=None, softmax_scale=None, variant=None, splits=0, out=None,
           lse=None, info=False, block_table=None, window_table=None):
    """Decode attention (one query per sequence): q bf16 [B, Hq, D] over k, v (Cache, or bf16 / fp16
    tensors [B, Hkv, T, D]); seq_lens int32 [B] on the device (None: all T), alibi_slopes fp32 [Hq].
    Paged caches (Cache layout "paged", decode-tc): block_table int32 [B, pages per sequence] on the
    device, sequence b's tokens [i P, (i + 1) P) in page block_table[b, i]; P a power of two >= 16.
    +wW schemes in pages: window_table, the same shape, naming the window pool's pages (Cache.window);
    entries of pages that hold no window token are not read.
    variant None: decode-tc where it reads the storages, else decode-splitk (`kvq variants`); splits > 0
    forces the key splits of a split-K variant. Returns (O bf16 [B, Hq, D], LSE fp32 [B, Hq], natural
    log, -inf for an empty sequence), and the launch (variant, splits, profile) when info."""
    torch = _require()
    k, v = (c if isinstance(c, Cache) else raw(c) for c in (k, v))
    _on_cuda(q, "q")
    if q.dim() != 3:
        raise InputError(f"kvq.gpu.decode: q has shape {list(q.shape)}, expected [B, Hq, D]")
    B, Hq = int(q.shape[0]), int(q.shape[1])
    with torch.cuda.device(q.device):
        out = torch.empty_like(q) if out is None else out
        lse = torch.empty(B, Hq, dtype=torch.float32, device=q.device) if lse is None else lse
        launch = _gpu.decode(q, k._as_dict(), v._as_dict(), out, lse, seq_lens, alibi_slopes, float(softmax_scale or 0),
                             variant or "", int(splits), _stream(torch, q), block_table, window_table)
    return (out, lse, launch) if info else (out, lse)
