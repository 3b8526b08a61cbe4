"""kvq.gate: the decode gate (`kvq validate`'s decode cases and tolerance rule) for a kernel that lives
outside kvq — any Python callable that takes a DecodeCase and returns O (and LSE).

    import kvq.gate
    from kvq.gate_examples import numpy_decode            # a correct fp32 numpy kernel
    report = kvq.gate.check(numpy_decode, k="int8-head", v="int8-head", layout="bnsh",
                            profile="fp32-obf16", cases="quick")
    assert report.ok                                       # [OK] / [FAIL] / [SKIP] printed per case

Per case kvq builds Q (bf16 values) and the cache with its own codec (bit-exact), hands the kernel the
arrays in the layout it declares, with every position it must not read poisoned (NaN values and
scales, garbage codes), and judges O and LSE against kvq's fp64 reference over the dequantized cache:
DESIGN.md's rule, `max|O - ref| <= 2 max|mimic - ref| + floor` and the same for the mean, where mimic
is the reference redone in the kernel's declared precision profile (docs/gate.md). The same rule as
check_tolerance in experiments/gate/validate_decode.cpp. `python -m kvq.gate module:function` is the
command line. With device="cpu" the kernel gets numpy arrays, with device="cuda" torch CUDA tensors
(Q and raw K/V in bf16 / fp16, codes and scales in their own dtypes); every array passes through one
conversion (kvq.gate_devices). kvq's own GPU kernels are gated this way by kvq.gate_kvq, and the
peers (torch SDPA, FBGEMM, FlashInfer) by kvq.gate_peers.
"""
import argparse
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ._core import Error, alibi_slopes, attention, parse_scheme, round_to_format
from .gate_cases import (ENGINE_LAYOUTS, FAMILIES, HUGE_OFFSET, LAYOUTS, PAGED_LAYOUTS, RAW_STORAGES,
                         break_values, case_rng, case_specs, check_storage_name, family_unfit_reason, flashinfer_indices,
                         make_paging, padding_tokens, poisoned, random_values, shape_logits, share_prefix,
                         storage_unfit_reason, store_operand, to_layout, window_starts)
from .gate_devices import DEVICES
from .gate_verdict import CaseReport, GateReport, Tolerance, bf16_noise, tolerance

__all__ = ["Kernel", "kernel", "DecodeCase", "KvOperand", "CaseReport", "GateReport", "Refused", "check", "tolerance",
           "Tolerance", "bf16_noise", "main", "window_starts", "FAMILIES", "LAYOUTS"]

LAYOUT_NAMES = {"bnsh": "BNSH", "bsnh": "BSNH", "paged": "paged", "fbgemm": "FBGEMM", "ggml": "ggml", "vllm": "vLLM",
                "flashinfer_nhd": "FlashInfer NHD", "flashinfer_hnd": "FlashInfer HND"}


# ---- what a kernel receives ----

@dataclass(frozen=True)
class KvOperand:
    """K or V as stored. Raw storages ("bf16", "fp16") fill `values`; kvq schemes fill `codes`,
    `scales` (None for scale-free FP8) and `zero_points` (asymmetric schemes), or `rows` in the
    FBGEMM layout. Shapes per layout are in docs/gate.md."""
    storage: str  # "bf16", "fp16" or a kvq scheme name
    scheme: Any = None  # kvq.Scheme for a quantized storage, else None
    values: Any = None  # raw: float32 holding exactly the bf16 / fp16 values
    codes: Any = None  # int8 / uint8, int4 packed two per byte (element 2i in the low nibble)
    scales: Any = None  # float16 or float32, in the scheme's scale dtype; uint8 bytes for e8m0 / e4m3
    zero_points: Any = None
    tensor_scale: Any = None  # nvfp4: its float32 per-tensor scale (0-dim)
    rows: Any = None  # FBGEMM: uint8 [B, T, Hkv, D/2 + 4n], n x (fp16 scale, fp16 shift) then the codes
    blocks: Any = None  # ggml: uint8 [B, T, Hkv, D/32 * sizeof(block)], a llama.cpp cache row per (b, t, h)
    # +w<W>: the window's raw tokens (bf16 values; laid out as raw values are), read for tokens t >=
    # kvq.gate.window_starts(scheme, seq_lens)[b]; the codes and parameters of those tokens are poisoned
    window: Any = None


@dataclass(frozen=True)
class DecodeCase:
    """One decode problem (Tq = 1). Query head h reads KV head h // (Hq // Hkv); query b sits at
    position seq_lens[b] - 1 and attends to keys 0 .. seq_lens[b] - 1, with the ALiBi bias
    -alibi_slopes[h] * (seq_lens[b] - 1 - j) when alibi_slopes is not None."""
    q: Any  # [B, Hq, D] float32 (bf16 values)
    k: KvOperand
    v: KvOperand
    seq_lens: Any  # [B] int32, each <= tokens
    softmax_scale: float  # the scale to use (1/sqrt(D) unless the case says otherwise)
    alibi_slopes: Any  # [Hq] float32, or None
    block_table: Any  # paged: [B, max_pages] int32 page ids; else None
    layout: str  # "bnsh", "bsnh", "paged", "fbgemm", "ggml", "vllm", "flashinfer_nhd" or "flashinfer_hnd"
    page_size: Optional[int]  # paged: tokens per page; else None
    batch: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    tokens: int  # T: the cache's length (paged: the table has ceil(T / page_size) columns)
    label: str  # the case's name and shape, for messages
    # The serving engines' layouts (vllm, flashinfer_nhd, flashinfer_hnd): K and V in one cache
    # [pages, 2, ...] (k / v hold its two halves, the split-K/V form); FlashInfer's page lists; FP8's
    # per-tensor scales (vLLM's k_scale / v_scale; 1.0 for scale-free FP8, None for bf16 / fp16)
    kv_cache: Any = None
    kv_indptr: Any = None  # [B + 1] int32
    kv_indices: Any = None  # [pages in use] int32
    kv_last_page_len: Any = None  # [B] int32: tokens in each sequence's last page (0: no pages)
    k_scale: Optional[float] = None
    v_scale: Optional[float] = None

    @property
    def group(self):
        return self.num_q_heads // self.num_kv_heads


# ---- what a kernel declares ----

def _canonical_storage(name):
    return name if name in RAW_STORAGES else parse_scheme(name).name


def _check_profile(profile):
    try:  # kvq parses the profile (reference/attention.hpp): its message names what is wrong
        z = np.zeros((1, 1, 1, 1), np.float32)
        attention(z, z, z, precision=profile)
    except Error as e:
        raise ValueError(f"kvq.gate.Kernel: {e}") from None


class Kernel:
    """A decode kernel and what it declares; cases outside the declarations are SKIPPED with the reason.

    fn(case: DecodeCase) returns O [B, Hq, D], or (O, LSE [B, Hq]) when returns_lse.
    head_dims / storages: None for any, else a set; max_tokens: the largest cache length T, or None.
    profile: a precision profile name, or profile(k, v) -> name for one that depends on the K and V
    storages. page_size: tokens per page of the paged layouts. strides: the kernel reads Q and the cache
    through their strides (the strided family hands it views with padded rows; else SKIP).
    why_not(spec, k, v): the kernel's own reason for
    not taking a case (a gate_cases.CaseSpec and the K/V storage names), or "" — for limits the other
    declarations cannot say.
    """

    def __init__(self, fn, *, name=None, layout="bnsh", profile="fp32-obf16", head_dims=None, max_tokens=None,
                 alibi=True, deterministic=True, returns_lse=True, page_size=16, storages=None, why_not=None,
                 strides=False):
        if not callable(fn):
            raise TypeError(f"kvq.gate.Kernel: fn must be callable, got {type(fn).__name__}")
        if layout not in LAYOUTS:
            raise ValueError(f"kvq.gate.Kernel: layout '{layout}' is not one of {', '.join(LAYOUTS)}")
        if not callable(profile):
            _check_profile(profile)
        if not isinstance(page_size, int) or page_size <= 0:
            raise ValueError(f"kvq.gate.Kernel: page_size must be a positive int, got {page_size!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.layout, self.profile, self.page_size = layout, profile, page_size
        self.head_dims = None if head_dims is None else frozenset(int(d) for d in head_dims)
        self.max_tokens = max_tokens
        self.alibi, self.deterministic, self.returns_lse = bool(alibi), bool(deterministic), bool(returns_lse)
        self.strides = bool(strides)
        self.storages = None if storages is None else frozenset(_canonical_storage(s) for s in storages)
        if why_not is not None and not callable(why_not):
            raise TypeError(f"kvq.gate.Kernel: why_not must be callable(spec, k, v) -> str, got {type(why_not).__name__}")
        self.why_not = why_not

    def __call__(self, case):
        return self.fn(case)

    def for_storages(self, k, v):
        """This kernel with a profile that depends on the storages (a callable) resolved for K = k, V = v."""
        if not callable(self.profile):
            return self
        import copy
        out = copy.copy(self)
        out.profile = self.profile(k, v)
        _check_profile(out.profile)
        return out

    def __repr__(self):
        return f"kvq.gate.Kernel({self.name!r}, {self.declarations()})"

    def declarations(self):
        return {"layout": self.layout, "profile": self.profile, "page_size": self.page_size,
                "head_dims": None if self.head_dims is None else sorted(self.head_dims),
                "max_tokens": self.max_tokens, "alibi": self.alibi, "deterministic": self.deterministic,
                "returns_lse": self.returns_lse, "strides": self.strides,
                "storages": None if self.storages is None else sorted(self.storages),
                "why_not": None if self.why_not is None else getattr(self.why_not, "__qualname__", repr(self.why_not))}

    def unsupported_reason(self, spec, k, v):
        """The kernel's own reason for not taking the case, or ""."""
        if self.storages is not None:
            for which, s in (("K", k), ("V", v)):
                if _canonical_storage(s) not in self.storages:
                    return f"{which} storage {s} (the kernel declares storages {', '.join(sorted(self.storages))})"
        if self.head_dims is not None and spec.head_dim not in self.head_dims:
            return f"head_dim {spec.head_dim} (the kernel declares head_dims {sorted(self.head_dims)})"
        if self.max_tokens is not None and spec.tokens > self.max_tokens:
            return f"T = {spec.tokens} (the kernel declares max_tokens {self.max_tokens})"
        if spec.alibi and not self.alibi:
            return "ALiBi (the kernel declares alibi=False)"
        if spec.strided and not self.strides:
            return "strided views (the kernel declares strides=False: contiguous arrays only)"
        if spec.huge and self.max_tokens is not None and self.layout not in PAGED_LAYOUTS:
            return (f"a cache inflated past 2^31 elements along T (the kernel declares max_tokens "
                    f"{self.max_tokens})")
        return self.why_not(spec, k, v) if self.why_not else ""


def kernel(fn=None, **declarations):
    """Decorator: `@kvq.gate.kernel(layout="paged", profile=...)` (or bare `@kvq.gate.kernel`)."""
    if fn is None:
        return lambda f: Kernel(f, **declarations)
    return Kernel(fn, **declarations)


# ---- running a case ----

def _format_name(storage):
    if storage in RAW_STORAGES:
        return storage
    s = parse_scheme(storage)
    return f"int{s.bits}" if s.format == "int" else s.format


class _Inputs:
    """One case's Q and cache: the stored operands (clean), the paging, and the reference."""

    def __init__(self, spec, k, v, layout, page_size, seed, device):
        B, Hq, Hkv, T, D = spec.batch, spec.q_heads, spec.kv_heads, spec.tokens, spec.head_dim
        self.spec, self.layout, self.device = spec, layout, device
        self.lens = spec.lens()
        q = random_values(case_rng(seed, spec, "q"), (B, Hq, D), 1.0)
        keep = ~padding_tokens(spec, None, T)[:, None, :, None]
        x = {which: random_values(case_rng(seed, spec, which), (B, Hkv, T, D), outlier)
             for which, outlier in (("k", 12.0), ("v", 3.0))}
        shape_logits(q, x["k"], spec, case_rng(seed, spec, "logits"))
        self.q = np.asarray(round_to_format(q, "bf16"), np.float32)
        self.ops = {}
        for which, storage in (("k", k), ("v", v)):
            share_prefix(x[which], spec)
            self.ops[which] = store_operand(np.where(keep, x[which], np.float32(0)), storage, layout, self.lens)
            break_values(self.ops[which], spec, which)
        self.paging = None
        if layout in PAGED_LAYOUTS:
            self.paging = make_paging(spec, page_size, case_rng(seed, spec, "pages"),
                                      page_elements=page_size * Hkv * D)
        # padding a kernel could read: tokens >= seq_len, in a paged cache the unused pages, the rows'
        # padding of strided views, the inflated part of a huge cache
        # and a +w<W> operand's codes of window tokens and raw values of quantized ones
        windowed = any("window" in op.arrays for op in self.ops.values())
        self.has_padding = (bool((self.lens < T).any()) or layout in PAGED_LAYOUTS or spec.strided or spec.huge
                            or windowed)
        self.rows = spec.judged()

    def reference(self, precision):
        s = self.spec
        o, lse = attention(self.q[:, :, None, :], self.ops["k"].reference, self.ops["v"].reference,
                           seq_lens=self.lens, alibi=s.alibi, softmax_scale=s.scale(), precision=precision)
        return o[self.rows, :, 0, :], lse[self.rows, :, 0]

    def case(self, poison):
        """The DecodeCase with the padding filled by `poison` ("nan": NaN / garbage; "finite": the probe's)."""
        s = self.spec
        arrays = {which: to_layout(poisoned(op, s, poison), op, self.layout, self.paging, poison)
                  for which, op in self.ops.items()}
        inflate = _Inflation(self, poison, arrays) if s.huge else None

        def put(a, values_format=None, name=None):
            if inflate and name is not None:
                return inflate.put(a, values_format, name)
            return self.device.put(a, values_format, strided=s.strided and name is not None, kind=poison)
        engine = {}
        if self.layout in ENGINE_LAYOUTS:
            engine = self._engine_cache(arrays, put, inflate.pages if inflate else 0)
            operands = {w: engine.pop(w) for w in ("k", "v")}
        else:
            operands = {which: KvOperand(op.storage, op.scheme, **{
                n: put(a, op.storage if n == "values" else "bf16" if n == "window" else None, n)
                for n, a in arrays[which].items()})
                for which, op in self.ops.items()}
        slopes = np.asarray(alibi_slopes(s.q_heads), np.float32) if s.alibi else None
        flashinfer = self.layout.startswith("flashinfer")
        table = None
        if self.paging is not None and not flashinfer:
            table = self.paging.block_table + (inflate.pages if inflate else 0)
        return DecodeCase(q=put(self.q, "bf16", "q"), k=operands["k"], v=operands["v"], seq_lens=put(self.lens),
                          softmax_scale=float(s.scale()), alibi_slopes=put(slopes), block_table=put(table),
                          layout=self.layout, page_size=self.paging.page_size if self.paging else None, batch=s.batch,
                          num_q_heads=s.q_heads, num_kv_heads=s.kv_heads, head_dim=s.head_dim,
                          tokens=inflate.tokens if inflate and self.paging is None else s.tokens, label=s.label,
                          **engine)

    def _engine_cache(self, arrays, put, pages):
        """A serving engine's cache from each operand's paged arrays: K and V pages stacked into one
        [pages, 2, ...] array (one dtype: _prepare checked), each operand holding its half;
        FlashInfer's page lists; FP8's per-tensor scales."""
        halves, ops, scales = [], {}, {}
        for which, op in self.ops.items():
            halves.append(arrays[which]["values" if op.scheme is None else "codes"])
            scale = np.asarray(arrays[which].get("scales", [])).reshape(-1)  # one per tensor; none for an empty cache
            scales[which] = None if op.scheme is None else float(scale[0]) if scale.size else 1.0
        both = np.stack(halves, axis=1)  # [pages, 2, ...]
        cache = put(both, self.ops["k"].storage if self.ops["k"].scheme is None else None, "kv_cache")
        for i, (which, op) in enumerate(self.ops.items()):
            name = "values" if op.scheme is None else "codes"
            ops[which] = KvOperand(op.storage, op.scheme, **{name: cache[:, i]},
                                   scales=None if scales[which] is None else put(np.float32(scales[which])))
        out = {"kv_cache": cache, "k": ops["k"], "v": ops["v"], "k_scale": scales["k"], "v_scale": scales["v"]}
        if self.layout.startswith("flashinfer"):
            indptr, indices, last = flashinfer_indices(self.paging.block_table, self.lens, self.paging.page_size)
            out.update(kv_indptr=put(indptr), kv_indices=put(indices + pages), kv_last_page_len=put(last))
        return out


class _Inflation:
    """The huge_cache family: every cache array put in a larger one so that the last sequence's live
    keys lie past HUGE_OFFSET elements of it, the rest poisoned. Contiguous layouts grow their token
    axis to `tokens`; paged ones get `pages` poisoned pages before the pool (page ids shifted by as
    many). `arrays`: each operand's arrays in the kernel's layout."""

    def __init__(self, inputs, poison, arrays):
        self.device, self.poison, self.spec = inputs.device, poison, inputs.spec
        self.bnsh = inputs.layout == "bnsh"
        self.tokens, self.pages = self.spec.tokens, 0
        data = [(n, a) for ops in arrays.values() for n, a in ops.items() if n in ("values", "codes", "rows", "blocks")]
        if inputs.paging is not None:  # [pages, ...]: enough pages that the smallest page ends past the offset
            self.pages = -(-HUGE_OFFSET // min(a.size // a.shape[0] for _, a in data)) + 1
            return
        last = max((b for b in range(self.spec.batch) if inputs.lens[b]), default=0)
        for n, a in data:  # the token count that puts the last live sequence's first key (last head) past it
            t_axis = self._token_axis(n, a)
            h_axis = 3 - t_axis  # [B, H, T, ...] or [B, T, H, ...]
            index = [0] * a.ndim
            index[0], index[h_axis] = last, a.shape[h_axis] - 1

            def offset(t, a=a, t_axis=t_axis, index=index):
                shape = list(a.shape)
                shape[t_axis] = t
                return int(np.ravel_multi_index(index, shape))
            step = offset(2) - offset(1)
            self.tokens = max(self.tokens, -(-(HUGE_OFFSET - offset(1)) // step) + 2)

    def _token_axis(self, name, a):
        """A contiguous layout's token axis: BNSH arrays [B, H, T, ...] (token scales [B, T]); BSNH, FBGEMM
        rows and ggml blocks [B, T, ...]."""
        return 2 if self.bnsh and name not in ("rows", "blocks") and np.ndim(a) >= 3 else 1

    def put(self, a, values_format, name):
        if name == "q" or np.ndim(a) <= 1:
            return self.device.put(a, values_format)
        if self.pages:
            return self.device.put_inflated(a, values_format, 0, a.shape[0] + self.pages, True, self.poison)
        t_axis = self._token_axis(name, a)
        per = max(self.spec.tokens // max(a.shape[t_axis], 1), 1)  # chan-tN scales: one per N tokens
        return self.device.put_inflated(a, values_format, t_axis, -(-self.tokens // per), False, self.poison)


class Refused(Exception):
    """Raised by a kernel for a case it does not take (as NotImplementedError is): REFUSED, not FAIL."""


# Exception messages that say "I do not take this" rather than "I broke" (peers raise their own classes).
# torch's SDPA says "No available kernel" when the backend it is held to does not take the inputs.
REFUSAL_WORDS = ("not supported", "unsupported", "not implemented", "does not support", "do not support",
                 "not yet supported", "no available kernel")


def is_refusal(e):
    return isinstance(e, (Refused, NotImplementedError)) or any(w in str(e).lower() for w in REFUSAL_WORDS)


def _call(kern, case, device, rows=None):
    """The kernel's (O, LSE or None) as numpy arrays (the sequences `rows` selects), or a one-line
    error ("error: ..." or, when the kernel refused the case, "refused: ...")."""
    try:
        result = kern(case)
    except Exception as e:  # the kernel failed (or refused) the case; the gate goes on
        return f"{'refused' if is_refusal(e) else 'error'}: {type(e).__name__}: {e}"
    if kern.returns_lse:
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            return f"error: returned {type(result).__name__}, expected (O, LSE) (the kernel declares returns_lse=True)"
        outputs = (("O", result[0]), ("LSE", result[1]))
    else:
        if isinstance(result, (tuple, list)):
            return "error: returned a tuple, expected O alone (the kernel declares returns_lse=False)"
        outputs = (("O", result),)
    got = []
    for what, x in outputs:
        try:  # what the kernel returned is its own: a ragged list or an unconvertible tensor fails the case
            got.append(device.get(x))
        except Exception as e:
            return f"error: {what} is not readable as an array on device '{device.name}' ({type(e).__name__}: {e})"
    o, lse = got if len(got) == 2 else (got[0], None)
    want = (case.batch, case.num_q_heads, case.head_dim)
    if o.shape != want:
        return f"error: O has shape {list(o.shape)}, expected [B, Hq, D] = {list(want)}"
    if lse is not None and lse.shape != want[:2]:
        return f"error: LSE has shape {list(lse.shape)}, expected [B, Hq] = {list(want[:2])}"
    for what, a in (("O", o), ("LSE", lse)):
        if a is not None and not np.issubdtype(a.dtype, np.floating):
            return f"error: {what} must be a floating-point array, got {a.dtype}"
    if rows is not None:
        o, lse = o[rows], None if lse is None else lse[rows]
    return o, lse


def _same_bits(a, b):
    return all((x is None and y is None) or (x is not None and y is not None and x.dtype == y.dtype
                                             and x.tobytes() == y.tobytes()) for x, y in zip(a, b))


def _padding_probe(kern, inputs, first, device):
    """Runs the kernel again with the padding holding other (finite) values. Returns (reads_padding, note)."""
    probe = _call(kern, inputs.case("finite"), device, inputs.rows)
    where = "positions >= seq_len" + (", unused pages" if inputs.layout in PAGED_LAYOUTS else "")
    where += ", the rows' padding of the views" if inputs.spec.strided else ""
    where += ", the inflated cache" if inputs.spec.huge else ""
    if any(op.scheme is not None for op in inputs.ops.values()):
        where += ", their codes and scales"
    if isinstance(probe, str):
        return True, f"reads padding: with finite values in the padding ({where}) it raised {probe.split(': ', 1)[1]}"
    if _same_bits(first, probe):
        return False, ""
    nan_moved = bool((np.isnan(first[0]) != np.isnan(probe[0])).any())
    if not kern.deterministic and not nan_moved:
        return False, "the output changed with the padding's values, inconclusive: declared non-deterministic"
    if kern.deterministic and not nan_moved:
        again = _call(kern, inputs.case("nan"), device, inputs.rows)
        if isinstance(again, str) or not _same_bits(first, again):
            return False, ("two calls on the same inputs differ (non-deterministic, see the reruns family): the "
                           "padding probe is inconclusive")
    nan = " (NaN there gives NaN in O)" if nan_moved else ""
    return True, f"reads padding: O changes when the padding ({where}) changes{nan}"


def _run_case(kern, spec, k, v, seed, device):
    layout = kern.layout
    scheme = f"{k} {LAYOUT_NAMES[layout]}" if k == v else f"K {k} / V {v} {LAYOUT_NAMES[layout]}"
    dtype = _format_name(k) if _format_name(k) == _format_name(v) else f"{_format_name(k)}/{_format_name(v)}"
    shape = spec.shape() + (f" page_size={kern.page_size}" if layout in PAGED_LAYOUTS else "")
    rep = CaseReport(spec.family, spec.name, shape, scheme, dtype, LAYOUT_NAMES[layout])
    why = (kern.unsupported_reason(spec, k, v) or storage_unfit_reason(k, layout, spec.head_dim)
           or storage_unfit_reason(v, layout, spec.head_dim) or family_unfit_reason(spec, k, v, layout)
           or (_huge_unfit_reason(device) if spec.huge else ""))
    if why:
        rep.status, rep.detail = "SKIP", "skipped: " + why
        return rep
    inputs = _Inputs(spec, k, v, layout, kern.page_size, seed, device)
    rep.values = int(inputs.rows.sum()) * spec.q_heads * spec.head_dim * max(spec.reruns, 1)
    case = inputs.case("nan")
    first = _call(kern, case, device, inputs.rows)
    if isinstance(first, str):
        refused = first.startswith("refused:")
        rep.status, rep.detail = ("REFUSED", first) if refused else ("FAIL", first)
        rep.values = 0 if refused else rep.values
        return rep
    ref_o, ref_lse = inputs.reference("fp64")
    mimic_o, mimic_lse = inputs.reference(kern.profile)
    t = tolerance(first[0], first[1], ref_o, ref_lse, mimic_o, mimic_lse, np.flatnonzero(inputs.rows))
    rep.tolerance, rep.status, rep.detail = t, "OK" if t.ok else "FAIL", t.detail
    notes = []
    if inputs.has_padding:
        reads, note = _padding_probe(kern, inputs, first, device)
        if reads:
            rep.status = "FAIL"
        if note:
            notes.append(note)
    if spec.reruns:
        differing, diff = 0, 0.0
        for _ in range(spec.reruns - 1):
            again = _call(kern, case, device, inputs.rows)
            if isinstance(again, str):
                rep.status = "FAIL"
                notes.append(f"rerun {again}")
                break
            if not _same_bits(first, again):
                differing += 1
                diff = max(diff, float(np.nanmax(np.abs(again[0].astype(np.float64) - first[0]), initial=0.0)))
        if differing:
            notes.append(f"{differing} of {spec.reruns - 1} reruns differ from the first (max |dO| {diff:.3g})"
                         + ("" if kern.deterministic else "; declared non-deterministic: reported, not failed"))
            if kern.deterministic:
                rep.status = "FAIL"
        else:
            notes.append(f"{spec.reruns} runs bitwise identical")
    if notes:
        rep.detail = "; ".join(([n for n in notes if n.startswith("reads padding")]) + [rep.detail]
                               + [n for n in notes if not n.startswith("reads padding")])
    return rep


HUGE_BYTES = 40 << 30  # device memory the huge_cache family wants free: two cases' inflated K and V at once


def _huge_unfit_reason(device):
    free = device.free_bytes()
    if free is None:
        return (f"a cache past 2^31 elements is built on the GPU only (device 'cuda'); on device '{device.name}' "
                "it would take tens of GB of host memory")
    if free < HUGE_BYTES:
        return f"a cache past 2^31 elements wants {HUGE_BYTES / 2**30:.0f} GiB of free GPU memory, {free / 2**30:.1f} free"
    return ""


def _engine_dtype(storage):
    return storage if storage in RAW_STORAGES else parse_scheme(storage).format


def _prepare(kernel, k, v, layout, profile, cases, reruns, device, name):
    """Validates the arguments (ValueError) and returns (Kernel, case specs, device)."""
    if device not in DEVICES:
        raise ValueError(f"device '{device}': kvq.gate runs on {', '.join(DEVICES)} (numpy arrays, torch CUDA "
                         "tensors, torch CPU tensors)")
    why = getattr(DEVICES[device], "why_unavailable", lambda: "")()
    if why:
        raise ValueError(why)
    if isinstance(kernel, Kernel):
        for what, given, declared in (("layout", layout, kernel.layout), ("profile", profile, kernel.profile)):
            if given is not None and given != declared:
                raise ValueError(f"{what} '{given}' given, but kernel {kernel.name} declares '{declared}'")
        kern = kernel
    else:
        kern = Kernel(kernel, name=name, layout=layout or "bnsh", profile=profile or "fp32-obf16")
    for storage in (k, v):
        check_storage_name(storage, kern.layout, kern.page_size)
    if kern.layout in ENGINE_LAYOUTS and _engine_dtype(k) != _engine_dtype(v):
        raise ValueError(f"K {k}, V {v}: the {kern.layout} layout keeps K and V in one array of one dtype")
    kern = kern.for_storages(k, v)
    if reruns is not None and (not isinstance(reruns, int) or reruns < 2):
        raise ValueError(f"reruns must be an int >= 2, got {reruns!r}")
    return kern, case_specs(cases, reruns), DEVICES[device]


def _run(kern, specs, k, v, seed, dev, report, log):
    out = GateReport(kern.name, kern.declarations(), k, v, dev.name)
    for spec in specs:
        rep = _run_case(kern, spec, k, v, seed, dev)
        out.cases.append(rep)
        if log:
            log(rep.line(kern.name))
    if log:
        log(out.summary())
    if report:
        out.write(report)
        if log:
            log(f"wrote {report}")
    return out


def check(kernel, k="bf16", v="bf16", *, layout=None, profile=None, cases="full", seed=0, reruns=None, report=None,
          log=print, device="cpu", name=None):
    """Runs the gate's decode cases on `kernel` (a Kernel, or a plain callable with `layout` / `profile`).

    k, v: "bf16", "fp16" or a kvq scheme name (no +had / +w<W>). cases: "quick", "full" or a list of
    family names (kvq.gate.FAMILIES, at the full sizes). reruns: calls in the reruns family (default 3
    quick, 50 full). report: a path for the JSON report. log: called with each line (None: quiet).
    device: "cpu" (numpy arrays), "cuda" (torch CUDA tensors) or "torch-cpu". Returns a GateReport; raises ValueError
    for arguments it cannot run.
    """
    kern, specs, dev = _prepare(kernel, k, v, layout, profile, cases, reruns, device, name)
    return _run(kern, specs, k, v, seed, dev, report, log)


# ---- the command line ----

class _UsageError(Exception):
    pass


def load_kernel(target):
    """'module:function' or 'path/to/file.py:function' -> the object (a Kernel or a callable)."""
    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr:
        raise _UsageError(f"'{target}': expected module:function or path/to/file.py:function")
    try:
        if where.endswith(".py") or os.sep in where:
            if not os.path.isfile(where):
                raise _UsageError(f"'{where}': no such file")
            module_name = "kvq_gate_kernel_" + os.path.splitext(os.path.basename(where))[0]
            spec = importlib.util.spec_from_file_location(module_name, where)
            module = importlib.util.module_from_spec(spec)
            sys.path.insert(0, os.path.dirname(os.path.abspath(where)))  # its neighbours import too
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except _UsageError:
        raise
    except BaseException as e:  # SyntaxError, ImportError, SystemExit from the module, ...
        raise _UsageError(f"cannot import '{where}': {type(e).__name__}: {e}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise _UsageError(f"'{where}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise _UsageError(f"'{target}' is a {type(obj).__name__}, not a callable or kvq.gate.Kernel")
    return obj


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        self.exit(2, f"{self.prog}: {message}\n")


def main(argv=None):
    p = _Parser(prog="python -m kvq.gate",
                description="Run kvq's decode gate on a Python kernel. Exit 0: every case OK or SKIP; 1: a case "
                            "failed; 2: usage or import error.")
    p.add_argument("kernel", help="module:function or path/to/file.py:function (a kvq.gate.Kernel uses its "
                                  "declarations)")
    p.add_argument("--k", default="bf16", help="K storage: bf16, fp16 or a kvq scheme (default bf16)")
    p.add_argument("--v", default="bf16", help="V storage (default bf16)")
    p.add_argument("--layout", choices=LAYOUTS, help="cache layout of a plain function (default bnsh)")
    p.add_argument("--profile", help="precision profile of a plain function (default fp32-obf16)")
    p.add_argument("--cases", default="full", help="quick, full, or family names separated by commas: "
                                                   + ",".join(FAMILIES))
    p.add_argument("--report", help="write the JSON report here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reruns", type=int, help="calls in the reruns family (default 3 quick, 50 full)")
    p.add_argument("--device", choices=list(DEVICES), default="cpu",
                   help="cpu: numpy arrays; cuda: torch CUDA tensors; torch-cpu: torch CPU tensors (default cpu)")
    a = p.parse_args(argv)
    cases = a.cases if a.cases in ("quick", "full") else [c for c in a.cases.split(",") if c]
    try:
        kern, specs, dev = _prepare(load_kernel(a.kernel), a.k, a.v, a.layout, a.profile, cases, a.reruns, a.device,
                                    None)
    except (_UsageError, ValueError, TypeError) as e:
        print(f"{p.prog}: {e}", file=sys.stderr)
        return 2
    return 0 if _run(kern, specs, a.k, a.v, a.seed, dev, a.report, print).ok else 1


if __name__ == "__main__":
    # Run kvq.gate's own copy (not __main__'s), so that a kernel module's kvq.gate.Kernel is this Kernel.
    from kvq.gate import main as _main
    sys.exit(_main())
