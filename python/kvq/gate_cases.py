"""The decode cases kvq.gate runs, and the arrays each hands a kernel (python/kvq/gate.py is the API).

A case is a shape and its sequence lengths (CaseSpec). Its inputs are built the way the C++ gate
builds them (experiments/gate/decode_gate_case.cpp): random values with outlier channels, Q rounded to
bf16, K and V stored raw (bf16 / fp16 values) or quantized by kvq's codec, and every position a
kernel must not read — tokens >= seq_len, the tail of a sequence's last page, unused pages and page
table entries past a sequence's pages, the scales of groups that hold only such tokens — poisoned.
"""
import zlib
from dataclasses import dataclass

import numpy as np

from ._core import SchemeError, fbgemm_rows, parse_scheme, quantize, quantized_length, round_to_format, to_ggml_blocks

LAYOUTS = ("bnsh", "bsnh", "paged", "fbgemm", "ggml", "vllm", "flashinfer_nhd", "flashinfer_hnd")
# Serving engines' own paged caches (docs/gate.md): vLLM's [num_blocks, 2, block_size, Hkv, D] with a block
# table; FlashInfer's [pages, 2, page_size, Hkv, D] (NHD) or [pages, 2, Hkv, page_size, D] (HND) with
# kv_indptr / kv_indices / kv_last_page_len. They hold bf16 / fp16 values or FP8 codes with a per-tensor
# scale (vLLM's k_scale / v_scale).
ENGINE_LAYOUTS = ("vllm", "flashinfer_nhd", "flashinfer_hnd")
PAGED_LAYOUTS = ("paged",) + ENGINE_LAYOUTS
# ggml's block structs: bytes per block, and where its scale fields are (offset, "fp16" / "byte"; quant/ggml_layout.hpp)
GGML_BLOCKS = {"q8_0": (34, ((0, "fp16"),)), "q4_0": (18, ((0, "fp16"),)), "q4_1": (20, ((0, "fp16"), (2, "fp16"))),
               "q5_0": (22, ((0, "fp16"),)), "q5_1": (24, ((0, "fp16"), (2, "fp16"))), "iq4_nl": (18, ((0, "fp16"),)),
               "mxfp4": (17, ((0, "byte"),)), "nvfp4": (36, ((0, "byte"), (1, "byte"), (2, "byte"), (3, "byte")))}
RAW_STORAGES = ("bf16", "fp16")
# In the order they run; FULL_ONLY's run with cases="full" (or by name) only.
FAMILIES = ("varlen", "head_dim", "mha", "mqa", "alibi", "group16", "one_key", "keys33", "odd_t", "no_keys",
            "batch0", "large_logits", "split_stress", "shared_pages", "spaced_pages", "strided", "nonfinite", "long",
            "huge_cache", "reruns")
FULL_ONLY = ("long", "huge_cache")  # families that "quick" leaves out
LOGIT_SCALE = 40.0  # Q's magnitude in the large-logit sequences: scores in the hundreds
LOGIT_TARGET = 300.0  # the score of a dominating key (or minus that of every key, "negative")
SPARE_PAGES = 2  # unused pages in every paged cache; page table entries past a sequence's pages name one
SPREAD_PAGE_ID = 1 << 15  # spaced_pages: page ids reach past int16's range ...
SPREAD_POOL_ELEMENTS = 1 << 26  # ... where a pool of at most this many elements per operand holds that many pages
HUGE_OFFSET = 1 << 31  # huge_cache: live keys of the last sequence sit past 2^31 elements of their array
STRIDE_PAD = 8  # strided: elements between the rows of a view (the last axis padded, the padding poisoned)


@dataclass(frozen=True)
class CaseSpec:
    family: str
    name: str  # as the C++ gate names its cases
    batch: int
    q_heads: int
    kv_heads: int
    tokens: int  # T: the cache's length (seq_lens[b] <= T)
    head_dim: int
    seq_lens: tuple = None  # None: every sequence holds T keys
    alibi: bool = False
    softmax_scale: float = 0.0  # 0: 1/sqrt(D)
    reruns: int = 0  # the reruns family: calls on the same inputs, compared bitwise
    # per sequence: "plain", "large" (Q x LOGIT_SCALE: scores of both signs in the hundreds), "negative"
    # (every key's score near -LOGIT_TARGET) or "dominant@F" (one key, at fraction F of the sequence,
    # near +LOGIT_TARGET, the rest in the tens); None: all plain
    logits: tuple = None
    shared_prefix: int = 0  # paged: sequence 1's first pages are sequence 0's (its first tokens the same)
    spread_pages: bool = False  # paged: the pages spread over a pool whose ids pass SPREAD_PAGE_ID
    strided: bool = False  # Q and the cache arrays handed as views with padded rows (kernels declaring strides)
    # per sequence: "plain", "inf_v" (+Inf in V at one key) or "nan_k" (NaN in K at one key); the broken
    # sequences' rows are not judged, every other row must be as if they were not there
    nonfinite: tuple = None
    huge: bool = False  # GPU: the cache inflated past HUGE_OFFSET elements (paged: the pool), lengths unchanged

    def lens(self):
        return np.array(self.seq_lens if self.seq_lens is not None else [self.tokens] * self.batch, dtype=np.int32)

    def scale(self):
        return self.softmax_scale or 1.0 / np.sqrt(self.head_dim)

    def shape(self):
        s = f"B={self.batch} Hq={self.q_heads} Hkv={self.kv_heads} T={self.tokens} D={self.head_dim}"
        if self.seq_lens is not None:
            s += " lens " + ",".join(map(str, self.seq_lens[:6])) + (",..." if len(self.seq_lens) > 6 else "")
        if self.alibi:
            s += " alibi"
        if self.softmax_scale:
            s += f" scale={self.softmax_scale:g}"
        if self.logits:
            s += " logits " + ",".join(self.logits)
        if self.shared_prefix:
            s += f" shared prefix {self.shared_prefix}"
        if self.spread_pages:
            s += " pages spread"
        if self.strided:
            s += " strided views"
        if self.nonfinite:
            s += " " + ",".join(self.nonfinite)
        if self.huge:
            s += " inflated past 2^31 elements"
        return s

    def judged(self):
        """[B] bool: the sequences whose rows the gate judges (all but the nonfinite family's broken ones)."""
        if not self.nonfinite:
            return np.ones(self.batch, bool)
        return np.array([m == "plain" for m in self.nonfinite], bool)

    @property
    def label(self):
        return f"{self.name} {self.shape()}"


def case_specs(cases, reruns=None):
    """The cases of "quick", "full" or a list of family names (run at the full sizes)."""
    if isinstance(cases, str) and cases in ("quick", "full"):
        quick, wanted = cases == "quick", [f for f in FAMILIES if cases == "full" or f not in FULL_ONLY]
    else:
        wanted = [cases] if isinstance(cases, str) else list(cases)
        unknown = [f for f in wanted if f not in FAMILIES]
        if unknown or not wanted:
            raise ValueError(f"cases {cases!r}: expected 'quick', 'full' or family names from {', '.join(FAMILIES)}")
        quick = False
    T = 70 if quick else 300
    n = reruns if reruns is not None else (3 if quick else 50)
    specs = {
        # varlen GQA: one sequence full, one empty, one half; the padding poisoned
        "varlen": [CaseSpec("varlen", "varlen GQA", 3, 8, 2, T, 128, (T, 0, T // 2 + 27))],
        "head_dim": [CaseSpec("head_dim", "head_dim", 2, 4, 2, T, d, (T, T - 7)) for d in (64, 96, 256)],
        "mha": [CaseSpec("mha", "MHA", 2, 4, 4, T, 128)],
        # a softmax scale that is not 1/sqrt(D), as the dumps of real models carry
        "mqa": [CaseSpec("mqa", "MQA", 2, 8, 1, T, 128, softmax_scale=0.25)],
        "alibi": [CaseSpec("alibi", "group of 6, ALiBi", 2, 12, 2, T, 128, (T - 1, 5), alibi=True)],
        "group16": [CaseSpec("group16", "group of 16", 1, 16, 1, T, 64)],
        "one_key": [CaseSpec("one_key", "one key", 1, 4, 1, 1, 128)],
        "keys33": [CaseSpec("keys33", "33 keys", 2, 4, 2, 33, 128)],
        # T (and the lengths) not a multiple of a page or a tile
        "odd_t": [CaseSpec("odd_t", "odd T", 3, 8, 2, 37, 128, (37, 20, 1))],
        "no_keys": [CaseSpec("no_keys", "no keys", 2, 4, 2, 16, 128, (0, 0)),
                    CaseSpec("no_keys", "T = 0", 1, 4, 2, 0, 128)],
        "batch0": [CaseSpec("batch0", "B = 0", 0, 4, 2, 16, 128)],
        # scores past exp's range in float32 (88.7) and fp16 (11.1), in some sequences of the batch only
        "large_logits": [CaseSpec("large_logits", "large logits", 5, 8, 2, T, 128, (T, T - 3, T // 2, 7, T),
                                  logits=("plain", "large", "negative", "dominant@0.5", "plain")),
                         CaseSpec("large_logits", "large logits, MQA", 3, 8, 1, T, 64, (T, T, 1),
                                  logits=("dominant@1.0", "plain", "large"))],
        # split-K: lengths that leave a T-based split empty, a dominating key first, last or in the middle
        "split_stress": [CaseSpec("split_stress", "split stress", 5, 8, 2, 4 * T, 128,
                                  (4 * T, 4 * T - 1, T + 1, 65, 4 * T),
                                  logits=("dominant@1.0", "dominant@0.0", "dominant@0.99", "dominant@1.0", "plain"))],
        # paged: sequence 1 shares sequence 0's first pages (a common prompt), as engines share prefixes
        # (other layouts: the two sequences merely begin with the same tokens)
        "shared_pages": [CaseSpec("shared_pages", "shared prefix pages", 3, 8, 2, T, 128, (T, T - 5, T // 2),
                                  shared_prefix=128)],
        # paged: the pages far apart in a large pool (ids past int16's range where memory allows)
        "spaced_pages": [CaseSpec("spaced_pages", "spaced pages", 3, 8, 1, 200, 64, (200, 37, 129), spread_pages=True)],
        # Q and K / V as views with padded rows (a fused QKV buffer, a cache with spare columns)
        "strided": [CaseSpec("strided", "strided views", 3, 8, 2, T, 128, (T, T // 2 + 3, 17), strided=True)],
        # Inf / NaN in one sequence's cache must not reach another's output
        "nonfinite": [CaseSpec("nonfinite", "Inf and NaN in one sequence", 4, 8, 2, T, 128, (T, T - 9, T // 2, 40),
                               nonfinite=("plain", "inf_v", "nan_k", "plain"))],
        "long": [CaseSpec("long", "long", 2, 8, 2, 2048, 128, (2048, 1500)),
                 CaseSpec("long", "long, 32K", 2, 8, 2, 32768, 128, (32768, 20001))],
        # GPU: a cache of more than 2^31 elements, the last sequence's keys past element 2^31 (32-bit offsets)
        "huge_cache": [CaseSpec("huge_cache", "cache past 2^31 elements", 4, 8, 4, 64, 128, (64, 0, 33, 64),
                                huge=True)],
        "reruns": [CaseSpec("reruns", f"{n} reruns", 4, 8, 2, 64 if quick else 2048, 128, reruns=n)],
    }
    return [s for f in FAMILIES if f in wanted for s in specs[f]]


def case_rng(seed, spec, what):
    """Fixed per (seed, case label, tensor), whichever cases run."""
    return np.random.default_rng([seed, zlib.crc32(f"{spec.label}/{what}".encode())])


def random_values(rng, shape, outlier):
    """Normal values; channels d % 23 == 5 times `outlier` (the outlier channels of real K)."""
    x = rng.standard_normal(shape, dtype=np.float32)
    x[..., np.arange(shape[-1]) % 23 == 5] *= outlier
    return x


def shape_logits(q, k, spec, rng):
    """Gives each sequence of q [B, Hq, D] and k [B, Hkv, T, D] (float32, in place) the scores its
    spec.logits mode asks for; the fp64 reference sees whatever results (Q is rounded to bf16 after)."""
    if not spec.logits:
        return
    D, group, scale = spec.head_dim, spec.q_heads // spec.kv_heads, spec.scale()
    for b, mode in enumerate(spec.logits):
        n = int(spec.lens()[b])
        if mode == "plain":
            continue
        if mode == "large":
            q[b] *= LOGIT_SCALE
            continue
        for h in range(spec.kv_heads):  # one direction u per KV head, its query heads all along u
            u = rng.standard_normal(D).astype(np.float32)
            u /= np.linalg.norm(u)
            q[b, h * group:(h + 1) * group] = LOGIT_SCALE * u
            c = LOGIT_TARGET / (LOGIT_SCALE * scale)  # |k . u| that gives a score of LOGIT_TARGET
            if mode == "negative":
                k[b, h, :n] -= c * u
            elif mode.startswith("dominant@") and n:
                j = min(n - 1, int(float(mode.split("@")[1]) * n))
                k[b, h, j] += c * u
            elif not mode.startswith("dominant@"):
                raise ValueError(f"logits mode '{mode}': expected plain, large, negative or dominant@F")


def share_prefix(x, spec):
    """x [B, H, T, D]: sequence 1's first spec.shared_prefix tokens made sequence 0's (in place)."""
    if spec.shared_prefix:
        x[1, :, :spec.shared_prefix] = x[0, :, :spec.shared_prefix]


def check_storage_name(name, layout, page_size=None):
    """Raises ValueError when kvq.gate cannot store K or V as `name` in `layout` (pages of `page_size`
    tokens) for any case."""
    if name in RAW_STORAGES:
        return
    scheme = parse_scheme(name)  # SchemeError (a ValueError) for a bad name
    if layout == "fbgemm" and scheme.block_format:
        raise ValueError(f"storage '{name}': FBGEMM's inline rows hold kvq's int4 schemes, not llama.cpp's or the "
                         "FP4 block formats (planar: layouts bnsh, bsnh, paged; ggml's own blocks: layout ggml)")
    if layout == "ggml" and not scheme.block_format:
        raise ValueError(f"storage '{name}': the ggml layout holds llama.cpp's cache types and mxfp4 / nvfp4 "
                         "(q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, nvfp4) or bf16 / fp16 values")
    if layout in ENGINE_LAYOUTS and not (scheme.format in ("fp8-e4m3", "fp8-e5m2")
                                         and (scheme.scale_free or scheme.granularity == "tensor")):
        raise ValueError(f"storage '{name}': the {layout} layout holds bf16 / fp16 values or FP8 codes with one "
                         "scale per tensor (fp8-e4m3, fp8-e4m3-tensor, fp8-e5m2, fp8-e5m2-tensor), as the engine does")
    if scheme.hadamard:
        raise ValueError(f"storage '{name}': kvq.gate does not gate +had storages yet (the kernel would need the "
                         "rotation of Q)")
    if scheme.window is not None and layout not in ("bnsh", "bsnh", "paged"):
        raise ValueError(f"storage '{name}': a +w<W> window's raw tokens lie beside the codes in the bnsh, bsnh and "
                         f"paged layouts, not in {layout}")
    if layout == "paged" and scheme.granularity == "channel" and (page_size or 0) % scheme.group:
        raise ValueError(f"storage '{name}': a paged cache holds chan-t<N> in pages of whole token groups, and "
                         f"{scheme.group} does not divide page_size {page_size}; use such a page_size, or layout "
                         "'bnsh' or 'bsnh'")
    if layout == "fbgemm" and not (scheme.bits == 4 and scheme.asymmetric and scheme.scale_dtype == "float16"
                                   and scheme.granularity in ("head", "group")):
        raise ValueError(f"storage '{name}': FBGEMM's inline rows hold int4 asymmetric head or g<G> schemes with "
                         "fp16 scales (e.g. int4-head-asym, int4-g32-asym), or bf16 / fp16 values")


def storage_unfit_reason(name, layout, head_dim):
    """Why `name` cannot be stored at this head_dim (e.g. int4-g64 at D = 96), or ""."""
    if name in RAW_STORAGES:
        return ""
    scheme = parse_scheme(name)
    try:
        scheme.fits(head_dim)
    except SchemeError as e:
        return f"storage {name} at head_dim {head_dim}: {e}"
    if layout == "ggml" and scheme.format == "nvfp4" and head_dim % 64:
        return f"storage {name} at head_dim {head_dim}: ggml's block_nvfp4 holds 64 elements"
    if layout == "fbgemm" and scheme.granularity == "group" and head_dim // scheme.group not in (1, 2, 4, 8):
        return (f"storage {name} at head_dim {head_dim}: FBGEMM rows hold 1, 2, 4 or 8 groups, not "
                f"{head_dim // scheme.group}")
    return ""


# ---- poison: what padding holds. "nan" is what kernels see; "finite" is the probe's second filling,
# so that an output that depends on the padding shows as a difference even where NaN would not.

def poison_values(kind, shape, dtype):
    """Poison for a float array (values, scales or zero points). One-byte scales (mxfp4's e8m0, nvfp4's
    e4m3): 0xFF, NaN in both, or 0x7E (e8m0 0.5, e4m3 448)."""
    if np.issubdtype(np.dtype(dtype), np.integer):
        return np.full(shape, 0xFF if kind == "nan" else 0x7E, dtype=dtype)
    return np.full(shape, np.nan if kind == "nan" else 8.0, dtype=dtype)


def poison_codes(kind, shape, dtype):
    """Garbage code bytes, varying along the last axis (as the C++ gate writes them)."""
    n = shape[-1] if shape else 1
    pattern = ((0x7E ^ (np.arange(n) * 37)) if kind == "nan" else (0x35 ^ (np.arange(n) * 11))) & 0xFF
    return np.broadcast_to(pattern.astype(np.uint8).view(dtype), shape).copy()


def poison_fbgemm_rows(kind, shape, groups):
    """Rows whose n (scale, shift) pairs are NaN (or 0.5, -1.0) and whose codes are garbage."""
    rows = poison_codes(kind, shape, np.uint8)
    params = np.array([np.nan, np.nan] if kind == "nan" else [0.5, -1.0], dtype=np.float16).view(np.uint8)
    rows[..., :4 * groups] = np.tile(params, groups)
    return rows


def poison_ggml_blocks(kind, shape, fmt):
    """Rows of ggml blocks [..., row bytes] whose scales (and mins) are NaN (fp16 0x7E00; one-byte
    scales 0xFF) or, for the probe, 0.5 and 0x7E, and whose codes are garbage."""
    rows = poison_codes(kind, shape, np.uint8)
    size, fields = GGML_BLOCKS[fmt]
    blocks = rows.reshape(rows.shape[:-1] + (rows.shape[-1] // size, size))
    half = np.array([np.nan if kind == "nan" else 0.5], np.float16).view(np.uint8)
    for offset, field in fields:
        if field == "fp16":
            blocks[..., offset:offset + 2] = half
        else:
            blocks[..., offset] = 0xFF if kind == "nan" else 0x7E
    return rows


@dataclass
class StoredOperand:
    """K or V of one case before its layout: arrays in kvq's planar order (BNSH), the padding clean.

    arrays: name -> (array, token axis or None, head axis or None); names are "values" (raw), or
    "codes", "scales", "zero_points", "tensor_scale" (a kvq scheme; the last nvfp4's), or "rows"
    (FBGEMM, already [B, T, Hkv, bytes]), or "blocks" (ggml's, [B, T, Hkv, bytes], and nvfp4's
    "tensor_scale"); a +w<W> scheme's "window" (its raw tokens, bf16 values as float32, BNSH).
    """
    storage: str
    scheme: object  # kvq.Scheme or None
    reference: np.ndarray  # float32 [B, Hkv, T, D]: the values the kernel must attend over
    arrays: dict
    fbgemm_groups: int = 0


def store_operand(x, storage, layout, lens=None):
    """x [B, Hkv, T, D] (padding zero, so it does not move the scales) stored as `storage`; a +w<W>
    storage keeps each sequence's window (lens: the sequences' lengths) raw in bf16, `window` [B, Hkv,
    T, D], beside the codes of the tokens before it."""
    B, H, T, D = x.shape
    if storage in RAW_STORAGES:
        values = np.array(round_to_format(x, storage), dtype=np.float32)
        return StoredOperand(storage, None, values.copy(), {"values": (values, 2, 1)})
    scheme = parse_scheme(storage)
    lens = np.full(B, T, np.int32) if lens is None else np.asarray(lens, np.int32)
    r = quantize(x, scheme, name="K/V", seq_lens=lens if scheme.window is not None else None)
    reference = np.array(r.dequantized)
    window = {}
    if scheme.window is not None:
        raw = np.array(round_to_format(x, "bf16"), dtype=np.float32)
        for b, start in enumerate(window_starts(scheme, lens)):
            reference[b, :, start:] = raw[b, :, start:]
        window = {"window": (raw, 2, 1)}
    if layout == "fbgemm":
        groups = 1 if scheme.granularity == "head" else D // scheme.group
        return StoredOperand(storage, scheme, reference, {"rows": (np.array(fbgemm_rows(r)), 1, 2)}, groups)
    # nvfp4: one fp32 per tensor beside its codes, padding only when every sequence is empty
    tensor = {} if r.tensor_scale is None else {"tensor_scale": (np.array(r.tensor_scale, np.float32).reshape(()),
                                                                 None, None)}
    if layout == "ggml":
        return StoredOperand(storage, scheme, reference, {"blocks": (np.array(to_ggml_blocks(r)), 1, 2), **tensor})
    # token axis of the scale array: tensor none; token [B, T]; head, gG [B, H, T(, n)]; chan-tN [B, H, T/N, D]
    g = scheme.granularity
    token_axis, head_axis = {"tensor": (None, None), "token": (1, None)}.get(g, (2, 1))
    arrays = {"codes": (np.array(r.codes), 2, 1)}
    if not scheme.scale_free:
        arrays["scales"] = (np.array(r.scales), token_axis, head_axis)
        if scheme.asymmetric:
            arrays["zero_points"] = (np.array(r.zero_points), token_axis, head_axis)
    return StoredOperand(storage, scheme, reference, {**arrays, **tensor, **window})


def window_starts(scheme, lens):
    """[B]: the first token a +w<W> storage keeps raw in each sequence (kvq.quantized_length, the rule
    kvq.quantize places windows by: the last W tokens, chan-t<N> rounded down to whole groups); the
    lengths themselves without a window."""
    lens = np.asarray(lens, np.int64)
    if scheme is None or scheme.window is None:
        return lens
    return np.array([quantized_length(scheme, int(n)) for n in lens], np.int64)


def outside_its_part(lens, scheme, name, n_tokens):
    """[B, n] bool: entries of a +w<W> operand's array that hold none of its data: the window's tokens
    in the codes and parameters (their values are in `window`), the quantized tokens in `window`."""
    starts = window_starts(scheme, lens)[:, None]
    per = scheme.group if scheme.granularity == "channel" and name in ("scales", "zero_points") else 1
    index = np.arange(n_tokens)[None, :] * per
    return index < starts if name == "window" else index >= starts


def padding_tokens(spec, scheme, n_tokens):
    """[B, n] bool: entries of a token axis of length n that hold only padding (chan-tN: token groups)."""
    lens = spec.lens()[:, None]
    if scheme is not None and scheme.granularity == "channel":
        return np.arange(n_tokens)[None, :] * scheme.group >= lens
    return np.arange(n_tokens)[None, :] >= lens


def poisoned(op, spec, kind):
    """The operand's arrays (BNSH order) with every padding position poisoned."""
    out = {}
    lens = spec.lens()
    for name, (a, t_axis, h_axis) in op.arrays.items():
        a = a.copy()
        if name == "rows":  # [B, T, Hkv, bytes]
            pad = padding_tokens(spec, None, a.shape[1])
            a[pad] = poison_fbgemm_rows(kind, a[pad].shape, op.fbgemm_groups)
        elif name == "blocks":  # ggml's [B, T, Hkv, bytes]
            pad = padding_tokens(spec, None, a.shape[1])
            a[pad] = poison_ggml_blocks(kind, a[pad].shape, op.scheme.format)
        elif t_axis is None:  # one per-tensor scale: padding only when every sequence is empty
            if a.size and not lens.any():
                a[...] = poison_values(kind, a.shape, a.dtype)
        else:
            pad = padding_tokens(spec, op.scheme if name not in ("codes", "window") else None, a.shape[t_axis])
            if op.scheme is not None and op.scheme.window is not None:
                pad |= outside_its_part(spec.lens(), op.scheme, name, a.shape[t_axis])
            moved = np.moveaxis(a, t_axis, 1)  # [B, T, ...] view of a
            fill = poison_codes if name == "codes" else poison_values
            moved[pad] = fill(kind, moved[pad].shape, a.dtype)
        out[name] = a
    return out


def flashinfer_indices(block_table, lens, page_size):
    """FlashInfer's (kv_indptr [B + 1], kv_indices [pages in use], kv_last_page_len [B]) of a page table
    [B, max_pages] and the lengths [B]: sequence b's pages are kv_indices[kv_indptr[b]:kv_indptr[b + 1]],
    its last page holds kv_last_page_len[b] tokens (0 for an empty sequence)."""
    lens = np.asarray(lens, np.int64)
    counts = -(-lens // page_size)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = np.concatenate([np.asarray(block_table)[b, :n] for b, n in enumerate(counts)] or [np.zeros(0, np.int32)])
    last = np.where(counts > 0, lens - (counts - 1) * page_size, 0).astype(np.int32)
    return indptr, indices.astype(np.int32), last


@dataclass(frozen=True)
class Paging:
    """Where each sequence's pages lie: page_size, the page table [B, max_pages], pages per sequence."""
    page_size: int
    block_table: np.ndarray
    counts: np.ndarray  # [B]: ceil(seq_len / page_size)
    num_pages: int
    lens: np.ndarray  # [B]: seq_len


def make_paging(spec, page_size, rng, page_elements=0):
    """ceil(seq_len / page_size) pages per sequence, all pages (and SPARE_PAGES unused ones) shuffled;
    table entries past a sequence's pages name an unused (poisoned) page. spec.shared_prefix: the
    whole pages of it are sequence 0's in sequence 1's table too (one page, two sequences).
    spec.spread_pages: the pages lie far apart in a pool of up to SPREAD_POOL_ELEMENTS / page_elements
    pages (the rest unused), the last one at the pool's end."""
    lens = spec.lens()
    counts = -(-lens // page_size)
    # whole pages of the prefix both sequences hold (a page with one's padding in it is not the other's)
    shared = min(spec.shared_prefix, int(lens[0]), int(lens[1])) // page_size if spec.shared_prefix else 0
    used = int(counts.sum()) - shared + SPARE_PAGES
    pool = used
    if spec.spread_pages:
        pool = max(used, min(SPREAD_PAGE_ID + 4 * used, SPREAD_POOL_ELEMENTS // max(page_elements, 1)))
    slots = np.unique(np.linspace(0, pool - 1, used).round().astype(np.int64)) if pool > used else np.arange(used)
    perm = rng.permutation(slots).astype(np.int32)
    max_pages = -(-spec.tokens // page_size)
    table = np.full((spec.batch, max_pages), perm[-1], dtype=np.int32)
    start = 0
    for b, n in enumerate(counts):
        own = n - (shared if b == 1 else 0)
        table[b, n - own:n] = perm[start:start + own]
        start += own
    if shared:
        table[1, :shared] = table[0, :shared]
    return Paging(page_size, table, counts, pool, lens)


def family_unfit_reason(spec, k, v, layout):
    """Why a case's family cannot run with these storages in this layout, or ""."""
    if spec.spread_pages and layout not in PAGED_LAYOUTS:
        return f"spaced pages: the family gates paged layouts ({', '.join(PAGED_LAYOUTS)}), the kernel reads {layout}"
    if spec.nonfinite and not (k in RAW_STORAGES and v in RAW_STORAGES):
        return "Inf / NaN go into raw (bf16 / fp16) caches only: a quantized storage's codes cannot hold them"
    return ""


def break_values(op, spec, which):
    """The nonfinite family: +Inf into V (inf_v) or NaN into K (nan_k) at one live key of the sequences
    that name it, in the stored values (op.reference, the values judged against, stays finite)."""
    if not spec.nonfinite or op.scheme is not None:
        return
    values = op.arrays["values"][0]  # [B, Hkv, T, D]
    for b, mode in enumerate(spec.nonfinite):
        n = int(spec.lens()[b])
        if n and (mode, which) in (("inf_v", "v"), ("nan_k", "k")):
            values[b, spec.kv_heads - 1, n // 2, 5] = np.inf if which == "v" else np.nan
        elif mode not in ("plain", "inf_v", "nan_k"):
            raise ValueError(f"nonfinite mode '{mode}': expected plain, inf_v or nan_k")


def to_layout(arrays, op, layout, paging, kind):
    """BNSH arrays -> the kernel's layout: BSNH moves each head axis after its token axis; the paged
    layouts put the BSNH tokens into pages [num_pages, page_size, ...] by the page table (FlashInfer's
    HND: [num_pages, Hkv, page_size, D]); chan-t<N> parameters, one per N tokens, [num_pages,
    page_size / N, Hkv, D] (N divides page_size)."""
    out = {}
    for name, a in arrays.items():
        _, t_axis, h_axis = op.arrays[name]
        if layout == "bnsh" or layout in ("fbgemm", "ggml") and name in ("rows", "blocks") or t_axis is None:
            out[name] = a
            continue
        if h_axis is not None:  # [B, H, T, ...] -> [B, T, H, ...]
            a = np.ascontiguousarray(np.moveaxis(a, h_axis, t_axis))
        if layout in ("bsnh", "fbgemm", "ggml"):
            out[name] = a
            continue
        rest = a.shape[2:]
        fill = poison_codes if name == "codes" else poison_values
        channel = name in ("scales", "zero_points") and op.scheme.granularity == "channel"
        P, T = paging.page_size // (op.scheme.group if channel else 1), a.shape[1]  # entries per page, in all
        pages = fill(kind, (paging.num_pages, P) + rest, a.dtype)  # unused pages stay poisoned
        # +w<W> in a page two sequences share (sequence 1 writes it after 0): the entries sequence 0 needs
        # stay its own (a token in one's window may be quantized in the other's: codes and raw both live)
        windowed = op.scheme is not None and op.scheme.window is not None and a.shape[0] > 1
        needs_first = ~outside_its_part(paging.lens, op.scheme, name, T)[0] if windowed else None
        for b in range(a.shape[0]):
            for i in range(paging.counts[b]):  # the last page's tail: tokens >= seq_len, poisoned in `a`
                n = min(P, T - i * P)
                page, rows = paging.block_table[b, i], a[b, i * P:i * P + n]
                if windowed and b > 0 and i < paging.counts[0] and paging.block_table[0, i] == page:
                    keep = needs_first[i * P:i * P + n].reshape((n,) + (1,) * len(rest))
                    rows = np.where(keep, a[0, i * P:i * P + n], rows)
                pages[page, :n] = rows
        out[name] = np.ascontiguousarray(pages.swapaxes(1, 2)) if layout == "flashinfer_hnd" else pages
    return out
