"""Correct decode kernels in numpy, gated by kvq.gate: one function reads every layout and storage
the gate hands out, and declares itself once per layout. Copy one as the start of your own kernel's
gate (docs/gate.md); the tests give the gate these and deliberately broken variants of them.

    import kvq.gate
    from kvq.gate_examples import numpy_paged
    assert kvq.gate.check(numpy_paged, k="int8-head", v="int4-g32-asym", cases="quick").ok

Arithmetic: fp32 logits, softmax and sums over the stored values (dequantized as DESIGN.md's codec
does), O rounded to bf16 — the profile "fp32-obf16".
"""
import numpy as np

from ._core import from_ggml_blocks, round_to_format
from .gate import Kernel, window_starts


def fp8_values(fmt):
    """float32 value of each of the 256 FP8 codes: OCP e4m3fn (bias 7, no inf, 0x7f / 0xff NaN) or
    e5m2 (bias 15, IEEE-like)."""
    c = np.arange(256)
    sign = np.where(c & 0x80, -1.0, 1.0)
    ebits, bias = (4, 7) if fmt == "fp8-e4m3" else (5, 15)
    mbits = 7 - ebits
    e, m = (c >> mbits) & ((1 << ebits) - 1), c & ((1 << mbits) - 1)
    x = np.where(e == 0, m * 2.0 ** (1 - bias - mbits), (1 + m / 2 ** mbits) * 2.0 ** (e - bias))
    if fmt == "fp8-e4m3":
        x = np.where((e == 15) & (m == 7), np.nan, x)
    else:
        x = np.where(e == 31, np.where(m == 0, np.inf, np.nan), x)
    return (sign * x).astype(np.float32)


def unpack_int4(codes, signed):
    """uint8 [..., D/2] -> int [..., D]: element 2i in the low nibble of byte i, element 2i+1 in the
    high one; symmetric codes are two's-complement nibbles."""
    c = np.asarray(codes, np.uint8)
    out = np.stack([c & 0xF, c >> 4], axis=-1).reshape(c.shape[:-1] + (2 * c.shape[-1],)).astype(np.int32)
    return np.where(out >= 8, out - 16, out) if signed else out


def fma32(q, s, z):
    """fma(q, s, z) in fp32 with one rounding: exact in float64 for kvq's codes and fp16/fp32 parameters."""
    return (q.astype(np.float64) * s.astype(np.float64) + z.astype(np.float64)).astype(np.float32)


# llama.cpp's and the FP4 block formats (docs/schemes.md): e2m1 values doubled (ggml's kvalues_mxfp4) and
# iq4_nl's non-linear table (kvalues_iq4nl).
E2M1_DOUBLED = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)
IQ4_NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def dequantize_blocks(op, head_dim):
    """A block format (q8_0 ... nvfp4) in BNSH planar arrays -> float32 [B, Hkv, T, D]: codes as ggml
    stores them (q5: D/2 nibble bytes, then the fifth bits, element d at bit d % 8 of byte D/2 + d/8),
    one scale per block ([B, H, T, D/block]: fp16, or e8m0 / e4m3 bytes), q4_1 / q5_1's min as the zero
    points, nvfp4's fp32 tensor scale."""
    s, f = op.scheme, op.scheme.format
    codes = np.asarray(op.codes)
    if f == "q8_0":
        u = codes.astype(np.int8).astype(np.float32)
    elif f in ("q5_0", "q5_1"):
        half = head_dim // 2
        fifth = np.unpackbits(codes[..., half:].astype(np.uint8), axis=-1, bitorder="little")[..., :head_dim]
        u = (unpack_int4(codes[..., :half], signed=False) | (fifth.astype(np.int32) << 4)).astype(np.float32)
    else:
        u = unpack_int4(codes, signed=False).astype(np.float32)
    p = np.asarray(op.scales)
    if s.scale_dtype == "e8m0":  # 2^(e-127); e = 0 is 2^-127, an fp32 subnormal; 255 is NaN
        e = p.astype(np.int32)
        d = np.where(e == 255, np.float32(np.nan), np.ldexp(np.float32(1), np.minimum(e, 254) - 127)).astype(np.float32)
    elif s.scale_dtype == "e4m3":
        d = fp8_values("fp8-e4m3")[p.astype(np.uint8)]
    else:
        d = p.astype(np.float32)
    d = np.repeat(d, s.group, axis=-1)
    if f in ("q4_0", "q5_0"):
        return (u - (8 if f == "q4_0" else 16)) * d
    if f in ("q4_1", "q5_1"):
        return fma32(u, d, np.repeat(np.asarray(op.zero_points, np.float32), s.group, axis=-1))
    if f == "iq4_nl":
        return d * IQ4_NL[u.astype(np.int32)]
    if f == "mxfp4":
        return E2M1_DOUBLED[u.astype(np.int32)] * (d * np.float32(0.5))
    if f == "nvfp4":
        return E2M1_DOUBLED[u.astype(np.int32)] * np.float32(0.5) * (d * np.float32(op.tensor_scale))
    return u * d  # q8_0: one fp32 multiply


def dequantize_planar(op, head_dim):
    """A kvq scheme in BNSH planar arrays -> float32 [B, Hkv, T, D], as the codec decodes it."""
    s = op.scheme
    if s.block_format:
        return dequantize_blocks(op, head_dim)
    if s.format not in ("int", "fp8-e4m3", "fp8-e5m2"):
        raise ValueError(f"dequantize_planar: {s.name} ({s.format}) is not an int, FP8 or block-format scheme")
    if s.format != "int":
        q = fp8_values(s.format)[np.asarray(op.codes, np.uint8)]
    elif s.bits == 4:
        q = unpack_int4(op.codes, signed=not s.asymmetric)
    else:
        q = np.asarray(op.codes).astype(np.int32)
    if s.scale_free:
        return q
    B, H, T, D = q.shape

    def per_element(p):  # a scale / zero-point array in kvq's group order -> [B, H, T, D]
        p = np.asarray(p, np.float32)
        if s.granularity == "tensor":
            return np.broadcast_to(p.reshape(-1)[:1] if p.size else np.zeros(1, np.float32), q.shape)
        if s.granularity == "token":  # [B, T]
            return np.broadcast_to(p[:, None, :, None], q.shape)
        if s.granularity == "head":  # [B, H, T]
            return np.broadcast_to(p[..., None], q.shape)
        if s.granularity == "group":  # [B, H, T, D/G]
            return np.repeat(p, s.group, axis=-1)
        return np.repeat(p, s.group, axis=2)[:, :, :T]  # chan-tN: [B, H, ceil(T/N), D]

    scales = per_element(op.scales)
    if s.asymmetric:
        return fma32(q, scales, per_element(op.zero_points))
    return q.astype(np.float32) * scales  # one fp32 multiply


def dequantize_fbgemm_rows(rows, head_dim):
    """FBGEMM inline rows uint8 [B, T, H, D/2 + 4n] -> float32 [B, T, H, D]: n x (fp16 scale, fp16
    shift), then the packed int4 codes; element d belongs to group d // (D/n)."""
    rows = np.asarray(rows, np.uint8)
    n = (rows.shape[-1] - head_dim // 2) // 4
    params = np.ascontiguousarray(rows[..., :4 * n]).view(np.float16).reshape(rows.shape[:-1] + (n, 2))
    q = unpack_int4(rows[..., 4 * n:], signed=False)
    scale = np.repeat(params[..., 0], head_dim // n, axis=-1)
    shift = np.repeat(params[..., 1], head_dim // n, axis=-1)
    return fma32(q, scale, shift)


def page_table(case):
    """Each sequence's pages [B, max_pages]: the block table, or FlashInfer's kv_indptr / kv_indices
    (entries past a sequence's pages: page 0, never read)."""
    if case.block_table is not None:
        return np.asarray(case.block_table)
    indptr, indices = np.asarray(case.kv_indptr), np.asarray(case.kv_indices)
    table = np.zeros((case.batch, -(-case.tokens // case.page_size)), np.int32)
    for b in range(case.batch):
        table[b, :indptr[b + 1] - indptr[b]] = indices[indptr[b]:indptr[b + 1]]
    return table


def to_bnsh(a, case):
    """A stored array (values, codes or scales) -> kvq's BNSH order. Paged: the page table gathers each
    sequence's pages into [B, max_pages * page_size, ...]; BSNH-ordered arrays swap T and H back."""
    a = np.asarray(a)
    if case.layout == "bnsh" or a.ndim <= 1:  # bnsh, or one per-tensor scale (nvfp4's: 0-dim)
        return a
    if case.layout in ("paged", "vllm", "flashinfer_nhd", "flashinfer_hnd"):
        t = page_table(case)  # [B, max_pages]
        if case.layout == "flashinfer_hnd":  # [pages, Hkv, page_size, D] -> [pages, page_size, Hkv, D]
            a = np.swapaxes(a, 1, 2)
        a = a[t].reshape((t.shape[0], t.shape[1] * a.shape[1]) + a.shape[2:])  # chan-t<N>: page_size / N groups
    return np.swapaxes(a, 1, 2) if a.ndim >= 3 else a  # [B, T, H, ...] -> [B, H, T, ...]; token scales stay [B, T]


def cache_bnsh(case, op):
    """K or V of a case as float32 [B, Hkv, T', D] (T' >= T), whatever its layout and storage."""
    if op.values is not None:
        return to_bnsh(op.values, case)
    if op.rows is not None:
        return np.swapaxes(dequantize_fbgemm_rows(op.rows, case.head_dim), 1, 2)
    if op.blocks is not None:  # ggml's blocks: back to kvq's planar arrays (a byte-for-byte conversion)
        blocks = np.array(op.blocks)
        b, t, h, _ = blocks.shape
        blocks[np.arange(t)[None, :] >= np.asarray(case.seq_lens)[:, None]] = 0  # padding: never read (zero blocks)
        ts = None if op.tensor_scale is None else float(op.tensor_scale)
        r = from_ggml_blocks(blocks, op.scheme, [b, h, t, case.head_dim],
                             tensor_scale=None if ts is None else (ts if np.isfinite(ts) else 0.0))
        planar = type(op)(op.storage, op.scheme, codes=np.asarray(r.codes), scales=np.asarray(r.scales),
                          zero_points=None if r.zero_points is None else np.asarray(r.zero_points),
                          tensor_scale=op.tensor_scale)
        return dequantize_planar(planar, case.head_dim)
    planar = type(op)(op.storage, op.scheme, codes=to_bnsh(op.codes, case),
                      scales=None if op.scales is None else to_bnsh(op.scales, case),
                      zero_points=None if op.zero_points is None else to_bnsh(op.zero_points, case),
                      tensor_scale=op.tensor_scale)
    values = dequantize_planar(planar, case.head_dim)
    if op.window is not None:  # +w<W>: each sequence's last tokens raw, from the window
        raw = to_bnsh(op.window, case)
        values = np.array(values)
        for b, start in enumerate(window_starts(op.scheme, np.asarray(case.seq_lens))):
            values[b, :, start:] = raw[b, :, start:values.shape[2]]
    return values


def attend(q, k, v, seq_lens, softmax_scale, alibi_slopes):
    """Decode attention in fp32: q [B, Hq, D], k and v [B, Hkv, T, D] -> O (bf16 values) [B, Hq, D],
    LSE [B, Hq]. Only keys j < seq_lens[b] are read; no keys: O = 0, LSE = -inf."""
    B, Hq, D = q.shape
    group = Hq // k.shape[1]
    o = np.zeros((B, Hq, D), np.float32)
    lse = np.full((B, Hq), -np.inf, np.float32)
    for b in range(B):
        n = int(seq_lens[b])
        if n == 0:
            continue
        for h in range(k.shape[1]):
            heads = slice(h * group, (h + 1) * group)  # the query heads that read KV head h
            s = (q[b, heads] @ k[b, h, :n].T) * np.float32(softmax_scale)  # [group, n]
            if alibi_slopes is not None:
                s = s - alibi_slopes[heads, None] * (n - 1 - np.arange(n)).astype(np.float32)
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            l = p.sum(axis=1, keepdims=True)
            o[b, heads] = (p @ v[b, h, :n]) / l
            lse[b, heads] = (m + np.log(l))[:, 0]
    return np.asarray(round_to_format(o, "bf16"), np.float32), lse


def numpy_decode(case):
    """A kvq.gate kernel: any layout, any storage (fp32 arithmetic, O in bf16)."""
    k, v = cache_bnsh(case, case.k), cache_bnsh(case, case.v)
    return attend(case.q, k, v, case.seq_lens, case.softmax_scale, case.alibi_slopes)


numpy_bnsh = Kernel(numpy_decode, name="numpy-bnsh", layout="bnsh", profile="fp32-obf16")
numpy_bsnh = Kernel(numpy_decode, name="numpy-bsnh", layout="bsnh", profile="fp32-obf16")
numpy_paged = Kernel(numpy_decode, name="numpy-paged", layout="paged", profile="fp32-obf16", page_size=16)
numpy_fbgemm = Kernel(numpy_decode, name="numpy-fbgemm", layout="fbgemm", profile="fp32-obf16")
numpy_ggml = Kernel(numpy_decode, name="numpy-ggml", layout="ggml", profile="fp32-obf16")
numpy_vllm = Kernel(numpy_decode, name="numpy-vllm", layout="vllm", profile="fp32-obf16", page_size=16)
numpy_flashinfer_nhd = Kernel(numpy_decode, name="numpy-flashinfer-nhd", layout="flashinfer_nhd", profile="fp32-obf16")
numpy_flashinfer_hnd = Kernel(numpy_decode, name="numpy-flashinfer-hnd", layout="flashinfer_hnd", profile="fp32-obf16")
