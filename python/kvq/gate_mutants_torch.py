"""kvq.gate_mutants' catalogue in torch, for the gate's torch devices ("cuda" on a GPU, "torch-cpu"):
every bug class redone on the torch tensors the gate hands out, its arithmetic in torch on their
device, beside a right torch kernel. kvq.gate_mutants.mutation_score(device="cuda") runs it.

The attention arithmetic, the page tables, the strides and the offsets are torch code; a quantized
storage is decoded (bytes -> values) by kvq.gate_examples' numpy reader on a host copy, after the
mutant has changed the bytes in torch. One class is GPU-only: int32_offsets needs the huge_cache
family's cache of more than 2^31 elements.
"""
import dataclasses
import math

import numpy as np

from .gate_cases import GGML_BLOCKS
from .gate_examples import cache_bnsh, page_table
from .gate_mutants import without_fifth_bits

KV_FIELDS = ("values", "codes", "scales", "zero_points", "tensor_scale", "rows", "blocks")
CASE_ARRAYS = ("q", "seq_lens", "alibi_slopes", "block_table", "kv_indptr", "kv_indices", "kv_last_page_len")


def _torch():
    import torch
    return torch


def host(x):
    """A tensor as numpy in its own dtype (bf16 as float32); anything else as it is."""
    torch = _torch()
    if not isinstance(x, torch.Tensor):
        return x
    x = x.detach()
    return (x.float() if x.dtype == torch.bfloat16 else x).cpu().numpy()


def host_case(case):
    """The case with every tensor copied to numpy (for the numpy readers)."""
    def op(o):
        return dataclasses.replace(o, **{f: host(getattr(o, f)) for f in KV_FIELDS})
    return dataclasses.replace(case, k=op(case.k), v=op(case.v), **{f: host(getattr(case, f)) for f in CASE_ARRAYS})


class Reader:
    """K and V of one sequence as float32 [Hkv, n, D] on the case's device. Raw values are read in
    torch through the layout (and the page table); quantized storages are decoded once, whole, by the
    numpy reader."""

    def __init__(self, case, table=None):
        torch = _torch()
        self.case, self.device, self.decoded = case, case.q.device, {}
        self.table, self.custom, self.host = None, table, None
        if case.layout in ("paged", "vllm", "flashinfer_nhd", "flashinfer_hnd"):
            if table is None:  # the block table, or FlashInfer's page lists as one (the index arrays only)
                table = page_table(dataclasses.replace(case, **{f: host(getattr(case, f)) for f in
                                                                ("block_table", "kv_indptr", "kv_indices")}))
            self.table = torch.as_tensor(np.asarray(table, np.int64), device=self.device)

    def __call__(self, which, b, n):
        torch, case = _torch(), self.case
        op = getattr(case, which)
        if op.values is None:
            if which not in self.decoded:
                if self.host is None:  # one host copy for K and V
                    self.host = host_case(case)
                    if self.custom is not None:  # the mutant's own page table
                        self.host = dataclasses.replace(self.host, block_table=np.asarray(self.custom))
                hc = self.host
                self.decoded[which] = torch.from_numpy(cache_bnsh(hc, getattr(hc, which))).to(self.device)
            return self.decoded[which][b, :, :n]
        a = op.values
        if case.layout == "bnsh":
            return a[b, :, :n].float()
        if self.table is None:  # bsnh (fbgemm / ggml layouts keep raw values BSNH too)
            return a[b, :n].transpose(0, 1).float()
        x = a[self.table[b, :-(-n // case.page_size)]]  # [pages, page_size, Hkv, D] (HND: [pages, Hkv, page_size, D])
        if case.layout == "flashinfer_hnd":
            x = x.transpose(1, 2)
        return x.reshape(-1, x.shape[-2], x.shape[-1])[:n].transpose(0, 1).float()


def scores(case, read, b, n, heads, scale, alibi):
    """s [Hq, n] of sequence b in fp32 (elementwise products and sums: no TF32), and V [Hq, n, D]."""
    torch = _torch()
    q = case.q[b].float()
    k, v = read("k", b, n)[heads], read("v", b, n)[heads]
    s = (q[:, None, :] * k).sum(-1) * scale
    if alibi and case.alibi_slopes is not None:
        s = s - case.alibi_slopes.float()[:, None] * (n - 1 - torch.arange(n, device=s.device)).float()
    return s, v


def t_attend(case, read=None, keys=lambda n: n, kv_head=None, scale=None, alibi=True, bf16_pv=False):
    """Decode attention in fp32 on the case's device: O (bf16 values, as float32) [B, Hq, D] and LSE."""
    torch = _torch()
    read = read or Reader(case)
    B, Hq, D = case.batch, case.num_q_heads, case.head_dim
    group, dev = Hq // case.num_kv_heads, case.q.device
    h = torch.arange(Hq, device=dev)
    heads = h // group if kv_head is None else kv_head(h, group, case.num_kv_heads)
    scale = case.softmax_scale if scale is None else scale
    o = torch.zeros(B, Hq, D, device=dev)
    lse = torch.full((B, Hq), -math.inf, device=dev)
    for b, length in enumerate(host(case.seq_lens).tolist()):
        n = keys(int(length))
        if n <= 0:
            continue
        s, v = scores(case, read, b, n, heads, scale, alibi)
        m = s.max(1, keepdim=True).values
        p = torch.exp(s - m)
        if bf16_pv:  # the running sum of p_j v_j held in bf16
            acc = torch.zeros(Hq, D, device=dev)
            for j in range(n):
                acc = (acc + p[:, j, None] * v[:, j]).bfloat16().float()
        else:
            acc = (p[:, :, None] * v).sum(1)
        o[b] = acc / p.sum(1, keepdim=True)
        lse[b] = (m + torch.log(p.sum(1, keepdim=True)))[:, 0]
    return o.bfloat16().float(), lse


def t_split_attend(case, split=64, by_t=False, running_max=True, empty_split_nan=False, merge_by_first=False,
                   batch_max=False):
    """kvq.gate_mutants.split_attend in torch: splits of `split` keys, partials merged by the largest
    LSE; the flags are the mutations."""
    torch = _torch()
    read, dev = Reader(case), case.q.device
    B, Hq, D = case.batch, case.num_q_heads, case.head_dim
    heads = torch.arange(Hq, device=dev) // (Hq // case.num_kv_heads)
    o = torch.zeros(B, Hq, D, device=dev)
    lse = torch.full((B, Hq), -math.inf, device=dev)
    per_seq = {b: scores(case, read, b, n, heads, case.softmax_scale, True)
               for b, n in enumerate(host(case.seq_lens).tolist()) if n > 0}
    shared = max((float(s.max()) for s, _ in per_seq.values()), default=0.0)  # batch_max's one maximum
    for b, (s, v) in per_seq.items():
        n = s.shape[1]
        parts = []
        for start in range(0, case.tokens if by_t else n, split):
            ss, vv = s[:, start:min(start + split, n)], v[:, start:min(start + split, n)]
            if ss.shape[1] == 0:  # an empty split: LSE -inf, and O 0 (or 0 / 0)
                parts.append((torch.full((Hq,), -math.inf, device=dev),
                              torch.full((Hq, D), math.nan if empty_split_nan else 0.0, device=dev)))
                continue
            if batch_max:
                m = torch.full((Hq,), shared, device=dev)
            else:
                m = ss.max(1).values if running_max else torch.zeros(Hq, device=dev)
            p = torch.exp(ss - m[:, None])
            total = p.sum(1)
            parts.append((m + torch.log(total), (p[:, :, None] * vv).sum(1) / total[:, None]))
        lses = torch.stack([x for x, _ in parts])  # [S, Hq]
        ref = lses[0] if merge_by_first else lses.max(0).values
        w = torch.exp(lses - ref)
        o[b] = (w[:, :, None] * torch.stack([x for _, x in parts])).sum(0) / w.sum(0)[:, None]
        lse[b] = ref + torch.log(w.sum(0))
    return o.bfloat16().float(), lse


def right(case):
    return t_attend(case)


def _both(case, change):
    return dataclasses.replace(case, k=change(case.k), v=change(case.v))


# ---- the mutants (kvq.gate_mutants names each class and says what it gets wrong) ----

def reads_padding(case):
    return t_attend(case, keys=lambda n: case.tokens)


def wrong_gqa(case):
    return t_attend(case, kv_head=lambda h, group, hkv: h % hkv)


def off_by_one(case):
    return t_attend(case, keys=lambda n: n - 1)


def no_softmax_scale(case):
    return t_attend(case, scale=1.0)


def fixed_softmax_scale(case):
    return t_attend(case, scale=1.0 / math.sqrt(case.head_dim))


def ignores_alibi(case):
    return t_attend(case, alibi=False)


def bf16_pv(case):
    return t_attend(case, bf16_pv=True)


def noisy(case):
    torch = _torch()
    o, lse = t_attend(case)
    flip = (torch.rand(o.shape, device=o.device) < 0.01) & (o != 0)
    return torch.where(flip, torch.nextafter(o, torch.full_like(o, math.inf)), o), lse


def scale_zero_swapped(case):
    def swap(op):
        if op.rows is not None:
            n = (op.rows.shape[-1] - case.head_dim // 2) // 4
            pairs = op.rows[..., :4 * n].reshape(op.rows.shape[:-1] + (n, 2, 2)).flip(-2)
            return dataclasses.replace(op, rows=_torch().cat([pairs.reshape(op.rows.shape[:-1] + (4 * n,)),
                                                              op.rows[..., 4 * n:]], -1))
        return dataclasses.replace(op, scales=op.zero_points, zero_points=op.scales)
    return right(_both(case, swap))


def nibbles_swapped(case):
    def swap(op):
        if op.rows is not None:
            n = (op.rows.shape[-1] - case.head_dim // 2) // 4
            c = op.rows[..., 4 * n:]
            return dataclasses.replace(op, rows=_torch().cat([op.rows[..., :4 * n], (c >> 4) | (c << 4)], -1))
        return dataclasses.replace(op, codes=(op.codes >> 4) | (op.codes << 4))
    return right(_both(case, swap))


def fifth_bits_ignored(case):  # the numpy catalogue's operand change, which takes torch codes too
    return right(_both(case, lambda op: without_fifth_bits(op, case.head_dim)))


def e2m1_not_doubled(case):
    torch = _torch()

    def double(op):
        if op.scheme is None or op.scheme.format not in ("mxfp4", "nvfp4"):
            return op
        if op.scheme.format == "nvfp4":
            return dataclasses.replace(op, tensor_scale=op.tensor_scale * 2)
        return dataclasses.replace(op, scales=torch.where(op.scales < 254, op.scales + 1, op.scales))
    return right(_both(case, double))


def ggml_blocks_reversed(case):
    def flip(op):
        if op.blocks is None:
            return op
        size, b = GGML_BLOCKS[op.scheme.format][0], op.blocks
        return dataclasses.replace(op, blocks=b.reshape(b.shape[:-1] + (b.shape[-1] // size, size)).flip(-2)
                                   .reshape(b.shape).contiguous())
    return right(_both(case, flip))


def _pool_pages(case):
    return (case.k.values if case.k.values is not None else case.k.codes).shape[0]


def ignores_page_table(case):
    table = host(case.block_table)
    linear = np.minimum(np.arange(table.size).reshape(table.shape), _pool_pages(case) - 1)
    return t_attend(case, Reader(case, linear))


def no_running_max(case):
    return t_split_attend(case, split=1 << 62, running_max=False)


def batch_max(case):
    return t_split_attend(case, split=1 << 62, batch_max=True)


def empty_split_nan(case):
    return t_split_attend(case, by_t=True, empty_split_nan=True)


def merge_by_first_split(case):
    return t_split_attend(case, merge_by_first=True)


def splitk(case):
    return t_split_attend(case)


def splitk_by_t(case):
    return t_split_attend(case, by_t=True)


def shared_pages_owned(case):
    table = np.array(host(case.block_table))
    lens = host(case.seq_lens)
    used = [(b, i) for b in range(table.shape[0]) for i in range(-(-int(lens[b]) // case.page_size))]
    owner = {int(table[b, i]): (b, i) for b, i in used}
    unwritten = min(set(range(_pool_pages(case))) - set(owner))
    for b, i in used:
        if owner[int(table[b, i])] != (b, i):
            table[b, i] = unwritten
    return t_attend(case, Reader(case, table))


def hnd_read_as_nhd(case):
    def as_nhd(op):
        name = "values" if op.values is not None else "codes"
        a = getattr(op, name)
        return dataclasses.replace(op, **{name: a.reshape(a.shape[0], a.shape[2], a.shape[1], -1)})
    return right(dataclasses.replace(_both(case, as_nhd), layout="flashinfer_nhd"))


def last_page_full(case):
    torch = _torch()
    indptr = case.kv_indptr.long()
    lens = torch.clamp((indptr[1:] - indptr[:-1]) * case.page_size, max=case.tokens).int()
    return right(dataclasses.replace(case, seq_lens=lens))


def fp8_scale_ignored(case):
    def unscaled(op):
        return op if op.scales is None else dataclasses.replace(op, scales=_torch().ones_like(op.scales))
    return right(_both(case, unscaled))


def page_ids_16bit(case):
    table = host(case.block_table).astype(np.int16).astype(np.int64)
    return t_attend(case, Reader(case, np.where(table < 0, table + _pool_pages(case), table)))


def contiguous_memory(x):
    """What a kernel that takes x's data pointer and ignores its strides reads."""
    torch = _torch()
    if x is None or x.dim() == 0 or x.is_contiguous():
        return x
    return torch.as_strided(x, x.shape, torch.empty(x.shape, device="meta").stride())


def ignores_strides(case):
    def flat(op):
        return dataclasses.replace(op, **{f: contiguous_memory(getattr(op, f)) for f in ("values", "codes", "scales",
                                                                                         "zero_points")})
    return right(dataclasses.replace(_both(case, flat), q=contiguous_memory(case.q)))


def packed_keys(case):
    torch = _torch()
    read, dev = Reader(case), case.q.device
    B, Hq, D = case.batch, case.num_q_heads, case.head_dim
    heads = torch.arange(Hq, device=dev) // (Hq // case.num_kv_heads)
    lens = host(case.seq_lens).tolist()
    if not sum(lens):
        return torch.zeros(B, Hq, D, device=dev), torch.full((B, Hq), -math.inf, device=dev)
    keys = torch.cat([read("k", b, n)[heads] for b, n in enumerate(lens)], 1)  # [Hq, sum n, D]
    values = torch.cat([read("v", b, n)[heads] for b, n in enumerate(lens)], 1)
    owner = torch.cat([torch.full((n,), b, device=dev) for b, n in enumerate(lens)])
    o = torch.zeros(B, Hq, D, device=dev)
    lse = torch.full((B, Hq), -math.inf, device=dev)
    for b, n in enumerate(lens):
        if not n:
            continue
        mine = owner == b
        s = (case.q[b].float()[:, None, :] * keys).sum(-1) * case.softmax_scale
        m = s[:, mine].max(1, keepdim=True).values
        p = torch.where(mine, torch.exp(torch.where(mine, s, m) - m), torch.zeros_like(s))
        o[b] = (p[:, :, None] * values).sum(1) / p.sum(1, keepdim=True)
        lse[b] = (m + torch.log(p.sum(1, keepdim=True)))[:, 0]
    return o.bfloat16().float(), lse


def int32_offsets(case):  # element offsets ((b * Hkv + h) * T + t) * D + d computed in 32 bits: past 2^31
    # they wrap, and the kernel reads another part of the cache (raw BNSH values)
    torch = _torch()
    dev = case.q.device

    def read(which, b, n):
        a = getattr(case, which).values
        H, T, D = a.shape[1:]
        idx = (((b * H + torch.arange(H, device=dev)[:, None, None]) * T + torch.arange(n, device=dev)[None, :, None])
               * D + torch.arange(D, device=dev)[None, None, :])
        wrapped = (idx + (1 << 31)) % (1 << 32) - (1 << 31)
        return a.reshape(-1)[wrapped % a.numel()].float()
    return t_attend(case, read)
