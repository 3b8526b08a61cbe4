"""Deliberately wrong decode kernels (numpy) for tests/python/test_gate.py: each makes one mistake real
kernels make, and the gate must catch it. They reuse kvq.gate_examples' readers and differ from the
correct kernel only where the comment says."""
import dataclasses

import numpy as np

from kvq.gate import Kernel
from kvq.gate_examples import attend, cache_bnsh, numpy_decode


def bf16(x):
    """Round float32 to bf16 (nearest even), vectorized: what a bf16 accumulator holds."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def attend_with(q, k, v, seq_lens, scale, slopes, kv_head=lambda h, group, hkv: h // group, keys=lambda n: n,
                bf16_pv=False):
    """attend() one query head at a time, with its head mapping, key count and P.V accumulation
    replaceable."""
    B, Hq, D = q.shape
    hkv = k.shape[1]
    o = np.zeros((B, Hq, D), np.float32)
    lse = np.full((B, Hq), -np.inf, np.float32)
    for b in range(B):
        n = keys(int(seq_lens[b]))
        if n <= 0:
            continue
        for h in range(Hq):
            kh = kv_head(h, Hq // hkv, hkv)
            s = (k[b, kh, :n] @ q[b, h]) * np.float32(scale)
            if slopes is not None:
                s = s - slopes[h] * (n - 1 - np.arange(n)).astype(np.float32)
            m = s.max()
            p = np.exp(s - m)
            if bf16_pv:  # the running sum of p_j v_j held in bf16
                acc = np.zeros(D, np.float32)
                for j in range(n):
                    acc = bf16(acc + p[j] * v[b, kh, j])
                o[b, h] = acc / p.sum()
            else:
                o[b, h] = (p @ v[b, kh, :n]) / p.sum()
            lse[b, h] = m + np.log(p.sum())
    return bf16(o), lse


def _inputs(case):
    return case.q, cache_bnsh(case, case.k), cache_bnsh(case, case.v), case.seq_lens


def reads_padding(case):  # attends over all T keys, not seq_len
    q, k, v, _ = _inputs(case)
    return attend(q, k, v, np.full(case.batch, case.tokens), case.softmax_scale, case.alibi_slopes)


def wrong_gqa(case):  # query head h reads KV head h % Hkv instead of h // (Hq / Hkv)
    return attend_with(*_inputs(case), case.softmax_scale, case.alibi_slopes, kv_head=lambda h, g, hkv: h % hkv)


def off_by_one(case):  # drops the newest key: j < seq_len - 1
    return attend_with(*_inputs(case), case.softmax_scale, case.alibi_slopes, keys=lambda n: n - 1)


def no_softmax_scale(case):  # softmax(q.k) without the scale
    q, k, v, lens = _inputs(case)
    return attend(q, k, v, lens, 1.0, case.alibi_slopes)


def fixed_softmax_scale(case):  # 1/sqrt(D) always, whatever the case's softmax_scale
    q, k, v, lens = _inputs(case)
    return attend(q, k, v, lens, 1.0 / np.sqrt(case.head_dim), case.alibi_slopes)


def ignores_alibi(case):  # declares alibi=True, adds no bias
    q, k, v, lens = _inputs(case)
    return attend(q, k, v, lens, case.softmax_scale, None)


def bf16_pv(case):  # P.V accumulated in bf16: too little precision for the declared fp32-obf16
    return attend_with(*_inputs(case), case.softmax_scale, case.alibi_slopes, bf16_pv=True)


def noisy(case):  # adds noise in the last bit of a few outputs, different on every call
    o, lse = numpy_decode(case)
    o = o.copy()
    flip = (np.random.default_rng().random(o.shape) < 0.01) & (o != 0)  # O = 0 of empty rows stays exact
    o[flip] = np.nextafter(o[flip], np.float32(np.inf))
    return o, lse


def scale_zero_swapped(case):  # int4 asymmetric: decodes q * z + s (scale and zero point mixed up)
    def swap(op):
        if op.rows is not None:  # FBGEMM: reads each (scale, shift) pair the other way round
            n = (op.rows.shape[-1] - case.head_dim // 2) // 4
            rows = op.rows.copy()
            pairs = rows[..., :4 * n].reshape(rows.shape[:-1] + (n, 2, 2))
            rows[..., :4 * n] = pairs[..., ::-1, :].reshape(rows.shape[:-1] + (4 * n,))
            return dataclasses.replace(op, rows=rows)
        return dataclasses.replace(op, scales=op.zero_points, zero_points=op.scales)
    return numpy_decode(dataclasses.replace(case, k=swap(case.k), v=swap(case.v)))


def nibbles_swapped(case):  # int4: element 2i read from the high nibble
    def swap(op):
        if op.rows is not None:
            n = (op.rows.shape[-1] - case.head_dim // 2) // 4
            rows = op.rows.copy()
            rows[..., 4 * n:] = (rows[..., 4 * n:] >> 4) | (rows[..., 4 * n:] << 4)
            return dataclasses.replace(op, rows=rows)
        return dataclasses.replace(op, codes=(op.codes >> 4) | (op.codes << 4))
    return numpy_decode(dataclasses.replace(case, k=swap(case.k), v=swap(case.v)))


def fifth_bits_ignored(case):  # q5_0 / q5_1: reads the nibbles alone, as if the codes were 4-bit
    def drop(op):
        if op.scheme is None or op.scheme.format not in ("q5_0", "q5_1"):
            return op
        codes = op.codes.copy()
        codes[..., case.head_dim // 2:] = 0
        return dataclasses.replace(op, codes=codes)
    return numpy_decode(dataclasses.replace(case, k=drop(case.k), v=drop(case.v)))


def e2m1_not_doubled(case):  # mxfp4 / nvfp4: the e2m1 values without the table's 1/2 (twice too large)
    def double(op):
        if op.scheme is None or op.scheme.format not in ("mxfp4", "nvfp4"):
            return op
        if op.scheme.format == "nvfp4":
            return dataclasses.replace(op, tensor_scale=op.tensor_scale * np.float32(2))
        return dataclasses.replace(op, scales=np.where(op.scales < 254, op.scales + 1, op.scales).astype(op.scales.dtype))
    return numpy_decode(dataclasses.replace(case, k=double(case.k), v=double(case.v)))


def ggml_blocks_reversed(case):  # ggml layout: reads a row's blocks last to first
    def flip(op):
        if op.blocks is None:
            return op
        from kvq.gate_cases import GGML_BLOCKS
        size = GGML_BLOCKS[op.scheme.format][0]
        b = np.asarray(op.blocks)
        blocks = b.reshape(b.shape[:-1] + (b.shape[-1] // size, size))[..., ::-1, :].reshape(b.shape)
        return dataclasses.replace(op, blocks=np.ascontiguousarray(blocks))
    return numpy_decode(dataclasses.replace(case, k=flip(case.k), v=flip(case.v)))


def ignores_page_table(case):  # assumes sequence b's pages are b * max_pages + i, in order
    table = case.block_table
    pages = (case.k.values if case.k.values is not None else case.k.codes).shape[0]
    linear = np.minimum(np.arange(table.size).reshape(table.shape), pages - 1).astype(np.int32)
    return numpy_decode(dataclasses.replace(case, block_table=linear))


# Each wrong kernel with its declarations and the families that must catch it ([FAIL]).
WRONG = {
    "reads_padding": (Kernel(reads_padding, name="reads-padding"), {"varlen", "alibi", "odd_t", "no_keys"}),
    "wrong_gqa": (Kernel(wrong_gqa, name="wrong-gqa"), {"varlen", "alibi", "odd_t", "keys33"}),
    "off_by_one": (Kernel(off_by_one, name="off-by-one"), {"varlen", "one_key", "mha", "keys33"}),
    "no_softmax_scale": (Kernel(no_softmax_scale, name="no-softmax-scale"), {"varlen", "mha", "mqa"}),
    "fixed_softmax_scale": (Kernel(fixed_softmax_scale, name="fixed-softmax-scale"), {"mqa"}),
    "ignores_alibi": (Kernel(ignores_alibi, name="ignores-alibi", alibi=True), {"alibi"}),
    "noisy": (Kernel(noisy, name="noisy", deterministic=True), {"reruns"}),
}
