"""kvq.gate's mutation score: a catalogue of wrong decode kernels (numpy), one per bug class that real
kernels have shipped with, each beside the right kernel it differs from. The gate must FAIL every
mutant on the case families that aim at its class and pass the right kernel on the same cases:
`python -m kvq.gate_mutants` (or mutation_score()) prints "N of N bug classes caught".

    from kvq.gate_mutants import mutation_score
    assert mutation_score(log=None).all_caught

Each mutant reuses kvq.gate_examples' readers and differs from a correct kernel only where its
comment says. docs/gate.md lists the catalogue and what each mutant gets wrong.
"""
import argparse
import dataclasses
import sys
from dataclasses import dataclass

import numpy as np

from .gate import Kernel, check
from .gate_cases import GGML_BLOCKS
from .gate_examples import attend, cache_bnsh, numpy_decode

def bf16(x):
    """Round float32 to bf16 (nearest even), vectorized: what a bf16 accumulator holds."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def attend_with(q, k, v, seq_lens, scale, slopes, kv_head=lambda h, group, hkv: h // group, keys=lambda n: n,
                bf16_pv=False):
    """attend() with its head mapping, key count and P.V accumulation replaceable."""
    B, Hq, D = q.shape
    hkv = k.shape[1]
    heads = np.array([kv_head(h, Hq // hkv, hkv) for h in range(Hq)], int)
    o = np.zeros((B, Hq, D), np.float32)
    lse = np.full((B, Hq), -np.inf, np.float32)
    for b in range(B):
        n = keys(int(seq_lens[b]))
        if n <= 0:
            continue
        kb, vb = k[b, heads, :n], v[b, heads, :n]  # [Hq, n, D]
        s = np.einsum("hd,hnd->hn", q[b], kb) * np.float32(scale)
        if slopes is not None:
            s = s - slopes[:, None] * (n - 1 - np.arange(n)).astype(np.float32)
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        if bf16_pv:  # the running sum of p_j v_j held in bf16
            acc = np.zeros((Hq, D), np.float32)
            for j in range(n):
                acc = bf16(acc + p[:, j, None] * vb[:, j])
            o[b] = acc / p.sum(axis=1, keepdims=True)
        else:
            o[b] = np.einsum("hn,hnd->hd", p, vb) / p.sum(axis=1, keepdims=True)
        lse[b] = (m + np.log(p.sum(axis=1, keepdims=True)))[:, 0]
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


def without_fifth_bits(op, head_dim):
    """A q5_0 / q5_1 operand with its fifth bits zeroed (numpy or torch codes); others as they are."""
    if op.scheme is None or op.scheme.format not in ("q5_0", "q5_1"):
        return op
    codes = op.codes.clone() if hasattr(op.codes, "clone") else op.codes.copy()
    codes[..., head_dim // 2:] = 0
    return dataclasses.replace(op, codes=codes)


def fifth_bits_ignored(case):  # q5_0 / q5_1: reads the nibbles alone, as if the codes were 4-bit
    return numpy_decode(dataclasses.replace(case, k=without_fifth_bits(case.k, case.head_dim),
                                            v=without_fifth_bits(case.v, case.head_dim)))


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




# ---- split-K, online softmax and the batch: the classes the large-logit and split families aim at ----

def split_attend(q, k, v, seq_lens, scale, slopes, split=64, by_t=False, running_max=True, empty_split_nan=False,
                 merge_by_first=False, batch_max=False):
    """Decode attention the way split-K kernels compute it: each split of `split` keys gives a partial
    (O_s, LSE_s), merged as O = sum_s exp(LSE_s - M) O_s / sum_s exp(LSE_s - M) with M the largest
    LSE_s. by_t: splits cut [0, T) (a sequence shorter than T leaves splits empty), else [0, seq_len).
    The other flags are the mutations (all off: a right kernel)."""
    B, Hq, D = q.shape
    T, group = k.shape[2], Hq // k.shape[1]
    o = np.zeros((B, Hq, D), np.float32)
    lse = np.full((B, Hq), -np.inf, np.float32)
    scores = {}
    for b in range(B):
        n = int(seq_lens[b])
        for h in range(Hq):
            s = (k[b, h // group, :n] @ q[b, h]) * np.float32(scale)
            if slopes is not None:
                s = s - slopes[h] * (n - 1 - np.arange(n)).astype(np.float32)
            scores[b, h] = s
    shared = max((float(s.max()) for s in scores.values() if s.size), default=0.0)  # batch_max's one maximum
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for (b, h), s in scores.items():
            n = len(s)
            if n == 0:
                continue
            parts = []
            for start in range(0, T if by_t else n, split):
                keys = slice(start, min(start + split, n))
                ss = s[keys]
                if ss.size == 0:  # an empty split: LSE -inf, and O 0 (or 0 / 0)
                    parts.append((np.float32(-np.inf), np.full(D, np.nan if empty_split_nan else 0, np.float32)))
                    continue
                m = np.float32(shared) if batch_max else (ss.max() if running_max else np.float32(0))
                p = np.exp(ss - m)
                l_sum = p.sum()
                parts.append((m + np.log(l_sum), (p @ v[b, h // group, keys]) / l_sum))
            lses = np.array([x for x, _ in parts], np.float32)
            ref = lses[0] if merge_by_first else lses.max()
            w = np.exp(lses - ref)
            o[b, h] = sum(wi * oi for wi, (_, oi) in zip(w, parts)) / w.sum()
            lse[b, h] = ref + np.log(w.sum())
    return bf16(o), lse


def _split(case, **mutation):
    q, k, v, lens = _inputs(case)
    return split_attend(q, k, v, lens, case.softmax_scale, case.alibi_slopes, **mutation)


def splitk(case):  # the right split-K kernel: splits of the sequence, merged by the largest LSE
    return _split(case)


def splitk_by_t(case):  # right too: splits of [0, T), empty ones skipped
    return _split(case, by_t=True)


ONE_PASS = 1 << 62  # a split longer than any sequence: a kernel without split-K


def no_running_max(case):  # softmax as exp(s) / sum exp(s) in one pass: overflows past s = 88.7, and is 0 / 0
    # when every s is far below zero
    return _split(case, split=ONE_PASS, running_max=False)


def batch_max(case):  # one maximum for the whole batch: a large score in one sequence underflows the others
    return _split(case, split=ONE_PASS, batch_max=True)


def empty_split_nan(case):  # an empty split's partial O is 0 / 0 = NaN, and 0 x NaN poisons the merge
    return _split(case, by_t=True, empty_split_nan=True)


def merge_by_first_split(case):  # partials weighted by exp(LSE_s - LSE_0): overflows when a later split dominates
    return _split(case, merge_by_first=True)


def shared_pages_owned(case):  # gathers pages into per-sequence buffers by each page's owner (the last
    # sequence naming it): a page two sequences share (a common prefix) is missing from the other one,
    # which reads an unwritten page instead
    table = np.array(case.block_table)
    used = [(b, i) for b in range(table.shape[0]) for i in range(-(-int(case.seq_lens[b]) // case.page_size))]
    owner = {int(table[b, i]): (b, i) for b, i in used}
    pool = (case.k.values if case.k.values is not None else case.k.codes).shape[0]
    unwritten = min(set(range(pool)) - set(owner))  # the gate leaves spare pages in every pool
    for b, i in used:
        if owner[int(table[b, i])] != (b, i):
            table[b, i] = unwritten
    return numpy_decode(dataclasses.replace(case, block_table=table))


def page_ids_16bit(case):  # page ids kept in 16 bits: ids past 32767 wrap negative (numpy then reads from the
    # pool's end, a GPU kernel before its start)
    table = np.asarray(case.block_table).astype(np.int16).astype(np.int32)
    return numpy_decode(dataclasses.replace(case, block_table=table))


def contiguous_memory(a):
    """`a`'s memory read from its first element as if it were contiguous: what a kernel that takes a
    data pointer and ignores the strides reads."""
    a = np.asarray(a)
    if a.flags.c_contiguous:  # 0-dim and empty arrays too
        return a
    strides = tuple(int(np.prod(a.shape[i + 1:])) * a.itemsize for i in range(a.ndim))
    return np.lib.stride_tricks.as_strided(a, a.shape, strides, writeable=False)


def ignores_strides(case):  # declares strides, reads every array as contiguous from its data pointer
    def flat(op):
        return dataclasses.replace(op, **{f: contiguous_memory(getattr(op, f)) for f in ("values", "codes", "scales",
                                                                                         "zero_points")
                                          if getattr(op, f) is not None})
    return numpy_decode(dataclasses.replace(case, q=contiguous_memory(case.q), k=flat(case.k), v=flat(case.v)))


def packed_keys(case):  # the batch's keys packed into one tile, another sequence's keys masked by a zero
    # probability yet still multiplied into P.V: 0 x Inf = NaN from one sequence reaches every other
    q, k, v, lens = _inputs(case)
    B, Hq, D = q.shape
    group = Hq // k.shape[1]
    owner = np.concatenate([np.full(int(n), b) for b, n in enumerate(lens)] or [np.zeros(0, int)])
    o = np.zeros((B, Hq, D), np.float32)
    lse = np.full((B, Hq), -np.inf, np.float32)
    if not owner.size:
        return o, lse
    with np.errstate(invalid="ignore", over="ignore"):
        for h in range(Hq):
            keys = np.concatenate([k[b, h // group, :int(n)] for b, n in enumerate(lens)])
            values = np.concatenate([v[b, h // group, :int(n)] for b, n in enumerate(lens)])
            for b in range(B):
                mine = owner == b
                if not mine.any():
                    continue
                s = (keys @ q[b, h]) * np.float32(case.softmax_scale)
                if case.alibi_slopes is not None:
                    pos = np.concatenate([np.arange(int(n)) for n in lens])
                    s = s - case.alibi_slopes[h] * (int(lens[b]) - 1 - pos).astype(np.float32)
                m = s[mine].max()
                p = np.where(mine, np.exp(np.where(mine, s, m) - m), np.float32(0))
                o[b, h] = (p @ values) / p.sum()
                lse[b, h] = m + np.log(p.sum())
    return bf16(o), lse


# ---- serving engines' layouts ----

def hnd_read_as_nhd(case):  # FlashInfer: an HND cache [pages, Hkv, page_size, D] read as NHD
    def as_nhd(op):
        name = "values" if op.values is not None else "codes"
        a = np.asarray(getattr(op, name))
        return dataclasses.replace(op, **{name: np.ascontiguousarray(a.reshape(a.shape[0], a.shape[2], a.shape[1], -1))})
    return numpy_decode(dataclasses.replace(case, layout="flashinfer_nhd", k=as_nhd(case.k), v=as_nhd(case.v)))


def last_page_full(case):  # FlashInfer: every page taken as full, kv_last_page_len ignored
    indptr = np.asarray(case.kv_indptr)
    lens = np.minimum((indptr[1:] - indptr[:-1]) * case.page_size, case.tokens).astype(np.int32)
    return numpy_decode(dataclasses.replace(case, seq_lens=lens))


def fp8_scale_ignored(case):  # vLLM FP8: the codes' values without k_scale / v_scale
    def unscaled(op):
        return op if op.scales is None else dataclasses.replace(op, scales=np.float32(1.0))
    return numpy_decode(dataclasses.replace(case, k=unscaled(case.k), v=unscaled(case.v)))


# ---- the catalogue ----

@dataclass(frozen=True)
class BugClass:
    """One bug class: the mutant, the right kernel it differs from, the storages and the case families
    that must catch it."""
    name: str
    bug: str
    mutant: Kernel
    right: Kernel
    families: tuple
    k: str = "bf16"
    v: str = "bf16"
    gpu_only: bool = False  # its families run on device "cuda" only (huge_cache)


def _k(fn, **declarations):
    return Kernel(fn, name=fn.__name__.replace("_", "-"), **declarations)


RIGHT = _k(numpy_decode)
RIGHT_SPLITK, RIGHT_SPLITK_BY_T = _k(splitk), _k(splitk_by_t)
RIGHT_PAGED = _k(numpy_decode, layout="paged")
RIGHT_VLLM, RIGHT_HND = _k(numpy_decode, layout="vllm"), _k(numpy_decode, layout="flashinfer_hnd")
RIGHT_NHD = _k(numpy_decode, layout="flashinfer_nhd")
RIGHT_STRIDES = _k(numpy_decode, strides=True)

CATALOGUE = (
    BugClass("reads_padding", "attends over all T keys, not seq_len", _k(reads_padding), RIGHT,
             ("varlen", "no_keys")),
    BugClass("wrong_gqa", "query head h reads KV head h % Hkv, not h // (Hq / Hkv)", _k(wrong_gqa), RIGHT,
             ("varlen", "keys33")),
    BugClass("off_by_one", "drops the newest key (j < seq_len - 1)", _k(off_by_one), RIGHT, ("varlen", "one_key")),
    BugClass("no_softmax_scale", "softmax(q.k) without the scale", _k(no_softmax_scale), RIGHT, ("mha",)),
    BugClass("fixed_softmax_scale", "1/sqrt(D) whatever the case's scale", _k(fixed_softmax_scale), RIGHT, ("mqa",)),
    BugClass("ignores_alibi", "declares ALiBi, adds no bias", _k(ignores_alibi, alibi=True), RIGHT, ("alibi",)),
    BugClass("bf16_pv", "P.V accumulated in bf16 under the fp32-obf16 profile", _k(bf16_pv), RIGHT,
             ("varlen", "long")),
    BugClass("noisy", "last-bit noise that differs between calls, declared deterministic", _k(noisy), RIGHT,
             ("reruns",)),
    BugClass("scale_zero_swapped", "int4 asymmetric: q * zero + scale", _k(scale_zero_swapped), RIGHT,
             ("varlen",), "int4-g32-asym", "int4-head-asym"),
    BugClass("nibbles_swapped", "int4: element 2i from the high nibble", _k(nibbles_swapped), RIGHT, ("varlen",),
             "int4-head", "int4-g32-asym"),
    BugClass("fifth_bits_ignored", "q5_0 / q5_1 read as 4-bit codes", _k(fifth_bits_ignored), RIGHT, ("varlen",),
             "q5_0", "q5_1"),
    BugClass("e2m1_not_doubled", "mxfp4 / nvfp4 values twice too large", _k(e2m1_not_doubled), RIGHT, ("varlen",),
             "mxfp4", "nvfp4"),
    BugClass("ggml_blocks_reversed", "ggml layout: a row's blocks read last to first",
             _k(ggml_blocks_reversed, layout="ggml"), _k(numpy_decode, layout="ggml"), ("varlen",), "q8_0", "q4_0"),
    BugClass("ignores_page_table", "sequence b's pages taken as b * max_pages + i",
             _k(ignores_page_table, layout="paged"), RIGHT_PAGED, ("varlen",), "int8-head", "int8-head"),
    BugClass("no_running_max", "softmax without the running maximum: exp(s) overflows past 88.7",
             _k(no_running_max), RIGHT_SPLITK, ("large_logits",)),
    BugClass("batch_max", "one maximum for the whole batch: one sequence's large score underflows the others",
             _k(batch_max), RIGHT_SPLITK, ("large_logits",)),
    BugClass("empty_split_nan", "split-K: an empty split's O is 0 / 0 and the merge multiplies it by 0",
             _k(empty_split_nan), RIGHT_SPLITK_BY_T, ("split_stress",)),
    BugClass("merge_by_first_split", "split-K: partials weighted by the first split's LSE, not the largest",
             _k(merge_by_first_split), RIGHT_SPLITK, ("split_stress",)),
    BugClass("shared_pages_owned", "paged: a page shared by two sequences (a common prefix) read by one only",
             _k(shared_pages_owned, layout="paged"), RIGHT_PAGED, ("shared_pages",), "int8-head", "int8-head"),
    BugClass("hnd_read_as_nhd", "FlashInfer: an HND cache read as NHD", _k(hnd_read_as_nhd, layout="flashinfer_hnd"),
             RIGHT_HND, ("varlen",)),
    BugClass("last_page_full", "FlashInfer: kv_last_page_len ignored, every page read whole",
             _k(last_page_full, layout="flashinfer_nhd"), RIGHT_NHD, ("varlen",)),
    BugClass("fp8_scale_ignored", "vLLM FP8: the codes' values without k_scale / v_scale",
             _k(fp8_scale_ignored, layout="vllm"), RIGHT_VLLM, ("varlen",), "fp8-e4m3-tensor", "fp8-e4m3-tensor"),
    BugClass("page_ids_16bit", "paged: page ids kept in 16 bits (ids past 32767 wrap)",
             _k(page_ids_16bit, layout="paged"), RIGHT_PAGED, ("spaced_pages",)),
    BugClass("ignores_strides", "declares strides, reads each array as contiguous from its data pointer",
             _k(ignores_strides, strides=True), RIGHT_STRIDES, ("strided",)),
    BugClass("packed_keys", "the batch's keys in one tile, other sequences' masked by p = 0 but multiplied into "
             "P.V: one sequence's Inf reaches every other", _k(packed_keys), RIGHT, ("nonfinite",)),
)


def torch_catalogue():
    """The catalogue in torch (kvq.gate_mutants_torch), for the devices "cuda" and "torch-cpu": each class's
    mutant and right kernel with the numpy ones' declarations, and the GPU-only class int32_offsets."""
    from . import gate_mutants_torch as t

    def like(kern, fn):
        return Kernel(fn, name=kern.name + "-torch", layout=kern.layout, alibi=kern.alibi, page_size=kern.page_size,
                      strides=kern.strides)
    rights = {numpy_decode: t.right, splitk: t.splitk, splitk_by_t: t.splitk_by_t}
    out = [dataclasses.replace(c, mutant=like(c.mutant, getattr(t, c.name)), right=like(c.right, rights[c.right.fn]))
           for c in CATALOGUE]
    out.append(BugClass("int32_offsets", "element offsets in 32 bits: past 2^31 they wrap",
                        Kernel(t.int32_offsets, name="int32-offsets-torch"), Kernel(t.right, name="numpy-decode-torch"),
                        ("huge_cache",), gpu_only=True))
    return tuple(out)


@dataclass
class ClassResult:
    bug_class: BugClass
    caught: bool  # the mutant failed at least one case
    right_ok: bool  # the right kernel passed every case
    failed: list  # the mutant's failing case lines
    right_failed: list

    @property
    def ok(self):
        return self.caught and self.right_ok


@dataclass
class MutationReport:
    results: list

    @property
    def caught(self):
        return sum(r.ok for r in self.results)

    @property
    def all_caught(self):
        return self.caught == len(self.results)

    def summary(self):
        return f"{self.caught} of {len(self.results)} bug classes caught"


def mutation_score(device="cpu", classes=None, seed=0, log=print):
    """Runs every bug class (or those named in `classes`): the mutant must FAIL a case of its families
    and the right kernel pass them all. device "cpu": the numpy catalogue; "cuda" or "torch-cpu": the
    torch one (torch_catalogue(); its GPU-only classes on "cuda" alone). Returns a MutationReport."""
    catalogue = CATALOGUE if device == "cpu" else torch_catalogue()
    catalogue = [c for c in catalogue if device == "cuda" or not c.gpu_only]
    chosen = [c for c in catalogue if classes is None or c.name in classes]
    if classes is not None and len(chosen) != len(set(classes)):
        known = {c.name for c in catalogue}
        raise ValueError(f"unknown bug classes {sorted(set(classes) - known)}; the catalogue: {sorted(known)}")
    results = []
    for c in chosen:
        kw = dict(cases=list(c.families), seed=seed, log=None, device=device, reruns=3 if "reruns" in c.families else None)
        mutant = check(c.mutant, c.k, c.v, **kw)
        right = check(c.right, c.k, c.v, **kw)
        r = ClassResult(c, bool(mutant.with_status("FAIL")), right.ok,
                        [x.line(mutant.kernel) for x in mutant.with_status("FAIL")],
                        [x.line(right.kernel) for x in right.with_status("FAIL")])
        results.append(r)
        if log:
            verdict = "caught" if r.caught else "NOT CAUGHT"
            right_note = "" if r.right_ok else f"; the right kernel {c.right.name} FAILS: {r.right_failed[0]}"
            first = f": {r.failed[0].split(': ', 1)[-1][:110]}" if r.failed else ""
            log(f"{'[OK]  ' if r.ok else '[FAIL]'} {c.name} ({c.bug}) {verdict} by {', '.join(c.families)}"
                f"{first}{right_note}")
    report = MutationReport(results)
    if log:
        log(report.summary())
    return report


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m kvq.gate_mutants",
                                description="kvq.gate's mutation score: each bug class's wrong kernel must fail and "
                                            "its right kernel pass. Exit 0 when every class is caught.")
    p.add_argument("classes", nargs="*", help="bug classes to run (default: the whole catalogue)")
    p.add_argument("--list", action="store_true", help="list the catalogue and exit")
    p.add_argument("--device", choices=("cpu", "cuda", "torch-cpu"), default="cpu",
                   help="cpu: the numpy catalogue; cuda / torch-cpu: the torch one on torch tensors (default cpu)")
    a = p.parse_args(argv)
    if a.list:
        for c in (CATALOGUE if a.device == "cpu" else torch_catalogue()):
            print(f"{c.name:<22} {c.bug} (K {c.k}, V {c.v}, families {', '.join(c.families)})")
        return 0
    try:
        report = mutation_score(a.device, a.classes or None)
    except ValueError as e:
        print(f"{p.prog}: {e}", file=sys.stderr)
        return 2
    return 0 if report.all_caught else 1


if __name__ == "__main__":
    sys.exit(main())
