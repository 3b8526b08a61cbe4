#!/usr/bin/env python3
"""decode-tc over a paged cache beside the same cache contiguous (issue 33): per shape, storage pair and
page size, the median time of both (CUDA-graph replays, rotating input sets >= 4x L2, as bench_peers.py
times; the two kinds' graphs replayed in turn) and the median of each rep's paged / contiguous ratio.
The paged pool holds the contiguous cache's pages in a shuffled order (a serving engine's allocator
after many requests; --pool-order in-order keeps a sequence's pages adjacent); the paged output must
equal the contiguous one bit for bit (same splits, same arithmetic), which is checked per row before
timing.

    python3 experiments/bench/bench_paged.py --out results/paged/paged.csv [--shapes llama8b] [--pages 16 64]

Needs a CUDA GPU, torch and kvq._gpu (a build with KVQ_PYTHON; PYTHONPATH=build-gpu/python).
"""
import argparse
import csv
import os
import statistics
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_peers import driver_version, time_graphs_interleaved  # noqa: E402
from peer_rows import input_sets, paged_cases  # noqa: E402

import kvq  # noqa: E402
import kvq.gpu  # noqa: E402

PAIRS = (("bf16", "bf16"), ("int8-head", "int8-head"), ("int4-g32-asym", "int4-g32-asym"), ("fp8-e4m3", "fp8-e4m3"),
         ("q4_0", "q8_0"))
COLUMNS = ("layout,pool_order,params,shape,B,HQ,HKV,T,D,k,v,page_tokens,contiguous_us,paged_us,paged_over_contiguous,contiguous_p10,"
           "contiguous_p90,paged_p10,paged_p90,splits,bitwise_equal,input_sets,calls_per_graph,gpu,driver,commit").split(",")


def operand(x, storage):
    """x bf16 [B, H, T, D] as a contiguous Cache of `storage`."""
    return kvq.gpu.Cache(storage, x) if storage in ("bf16", "fp16") else kvq.gpu.quantize(x, storage)


def to_pool(a, perm, P, head_major):
    """[B, H, T, ...] -> a pool [pages, P, H, ...] (head_major: [pages, H, P, ...]; per-token [B, T] ->
    [pages, P]) whose page perm[b * T/P + i] holds tokens [i P, (i + 1) P) of sequence b."""
    if a is None or a.dim() < 2:
        return a
    if a.dim() == 2:  # per-token parameters [B, T]
        B, T = a.shape
        pages = a.reshape(B * T // P, P)
    else:
        B, H, T = a.shape[:3]
        rest = tuple(a.shape[3:])
        pages = a.reshape(B, H, T // P, P, *rest).movedim(2, 1)  # [B, T/P, H, P, ...]
        if not head_major:
            pages = pages.movedim(3, 2)  # [B, T/P, P, H, ...]
        pages = pages.reshape(B * T // P, *pages.shape[2:])
    pool = torch.empty_like(pages)
    pool[perm] = pages
    return pool.contiguous()


def paged_operand(c, perm, P, hnd=False, params_in_page=False):
    """The contiguous Cache `c` as a paged one: its pages at perm's places in a pool; hnd: the pool's
    codes (values) [pages, Hkv, P, row] (each page a small BNSH cache), read as their transposed view;
    params_in_page: a page's scales and zero points in the codes' page (kvq.gpu.one_pool), else pools of their own."""
    B, H, T = c.data.shape[:3]

    def shaped(a):  # kvq.gpu.quantize's flat parameters: [B, H, T, groups], per token [B, T], per tensor as is
        if a is None or a.numel() < B * T:
            return a
        return a.view(B, T) if a.numel() == B * T and H > 1 else a.view(B, H, T, -1)
    data = to_pool(c.data, perm, P, hnd)
    scales, zeros = to_pool(shaped(c.scales), perm, P, True), to_pool(shaped(c.zero_points), perm, P, True)
    if params_in_page and scales is not None and scales.dim() > 1:
        data, scales, zeros = kvq.gpu.one_pool(data, scales, zeros)
    return kvq.gpu.Cache(c.storage, data.transpose(1, 2) if hnd else data, scales, zeros, layout="paged",
                         tensor_scale=c.tensor_scale)


def one_set(shape, pair, P, gen, hnd=False, in_order=False, params_in_page=False):
    B, H, T, D = shape.B, shape.HKV, shape.T, shape.D
    q = torch.randn(B, shape.HQ, D, device="cuda", generator=gen).to(torch.bfloat16)
    caches, paged = [], []
    pages = B * T // P
    perm = torch.arange(pages, device="cuda") if in_order else torch.randperm(pages, device="cuda", generator=gen)
    for storage in pair:
        c = operand(torch.randn(B, H, T, D, device="cuda", generator=gen).to(torch.bfloat16), storage)
        caches.append(c)
        paged.append(paged_operand(c, perm, P, hnd, params_in_page))
    table = perm.reshape(B, T // P).to(torch.int32).contiguous()
    lens = torch.full((B,), T, dtype=torch.int32, device="cuda")
    return q, caches, paged, table, lens


def bytes_of(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t is not None and hasattr(t, "numel"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="seed000|seed002|llama8b|smollm2", help="regex over shape names")
    ap.add_argument("--pages", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--pairs", default="", help="regex over 'K/V' storage pairs (default: all of PAIRS)")
    ap.add_argument("--reps", type=int, default=30, help="timed reps (>= 2: p10 and p90 need two)")
    ap.add_argument("--layout", choices=("nhd", "hnd"), default="nhd",
                    help="the pool's codes: [pages, P, Hkv, row] (vLLM's, FlashInfer's NHD) or [pages, Hkv, P, row]")
    ap.add_argument("--pool-order", choices=("shuffled", "in-order"), default="shuffled",
                    help="where a sequence's pages lie in the pool: a random permutation (an allocator after many "
                         "requests) or in order (a sequence's pages adjacent: the paged cost without the scattering)")
    ap.add_argument("--params", choices=("pooled", "in-page"), default="pooled",
                    help="where a page's scales and zero points lie: pools of their own ([pages, Hkv, P, groups], "
                         "kvq.ops.empty_paged_cache's default) or in the codes' page, after its codes (one pool)")
    ap.add_argument("--profile", action="store_true",
                    help="no timing: per row one contiguous decode, then one paged decode (for ncu -k decode_tc_kernel)")
    args = ap.parse_args()
    if args.reps < 2:
        ap.error(f"--reps {args.reps}: expected at least 2 (the p10 and p90 columns)")
    try:
        todo, left_out = paged_cases(args.shapes, args.pairs, args.pages, PAIRS)
    except ValueError as e:
        ap.error(str(e))
    for shape, P in left_out:
        print(f"bench_paged: {shape.label} left out at P={P}: T={shape.T} is not a multiple of it", file=sys.stderr)
    props = torch.cuda.get_device_properties(0)
    gpu = props.name
    commit = os.environ.get("KVQ_COMMIT") or subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                                            text=True).stdout.strip() or "unknown"
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    rows = []
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    hnd, in_order, in_pg = args.layout == "hnd", args.pool_order == "in-order", args.params == "in-page"
    for n, (shape, pair, P) in enumerate(todo, 1):
        gen = torch.Generator(device="cuda").manual_seed(n)
        first = one_set(shape, pair, P, gen, hnd, in_order, in_pg)
        set_bytes = bytes_of(first[1][0].data, first[1][0].scales, first[1][1].data, first[1][1].scales) * 2
        sets = 1 if args.profile else input_sets(set_bytes, l2, props.total_memory)
        data = [first] + [one_set(shape, pair, P, gen, hnd, in_order, in_pg) for _ in range(sets - 1)]
        q, caches, paged, table, lens = first
        o_c, l_c, launch_c = kvq.gpu.decode(q, caches[0], caches[1], seq_lens=lens, variant="decode-tc", info=True)
        o_p, l_p, launch_p = kvq.gpu.decode(q, paged[0], paged[1], seq_lens=lens, variant="decode-tc", block_table=table,
                                            info=True)
        # the same splits: the same arithmetic, bit for bit (the paged kernels' occupancy may pick others,
        # whose rounding differs: then within the output's bf16 rounding)
        same = torch.equal(o_c, o_p) and torch.equal(l_c, l_p)
        close = torch.allclose(o_c.float(), o_p.float(), rtol=2 ** -7, atol=2 ** -7)
        if not (same or (launch_c["splits"] != launch_p["splits"] and close)):
            raise SystemExit(f"{shape.name} B={shape.B} T={shape.T} {pair} P={P}: paged output differs from contiguous "
                             f"(splits {launch_c['splits']} / {launch_p['splits']})")
        if args.profile:  # the two launches above are the profiled pair
            print(f"[{n}/{len(todo)}] {shape.name} B={shape.B} T={shape.T} {pair[0]}/{pair[1]} P={P}: profiled "
                  f"(splits {launch_c['splits']} / {launch_p['splits']})", file=sys.stderr, flush=True)
            continue
        calls = max(1, min(20, int(2e9 // max(set_bytes, 1))))
        outs = [(torch.empty_like(d[0]), torch.empty(shape.B, shape.HQ, device="cuda")) for d in data]

        def contiguous(i):
            q, c, _, _, lens = data[i]
            return lambda: kvq.gpu.decode(q, c[0], c[1], seq_lens=lens, variant="decode-tc", out=outs[i][0], lse=outs[i][1])

        def paged_call(i):
            q, _, p, table, lens = data[i]
            return lambda: kvq.gpu.decode(q, p[0], p[1], seq_lens=lens, variant="decode-tc", out=outs[i][0], lse=outs[i][1],
                                          block_table=table)
        # Interleaved, and the ratio the median of each rep's paged / contiguous pair: one block of
        # contiguous reps then one of paged ones moved single rows by 5-10 % (an A/A, aa-noise/).
        tc, tp = time_graphs_interleaved([contiguous, paged_call], sets, args.reps, calls_per_graph=calls)
        mc, mp = statistics.median(tc), statistics.median(tp)
        ratio = statistics.median(p / c for c, p in zip(tc, tp))
        q10 = lambda us: statistics.quantiles(us, n=10)[0]  # noqa: E731
        q90 = lambda us: statistics.quantiles(us, n=10)[-1]  # noqa: E731
        rows.append({"layout": args.layout, "pool_order": args.pool_order, "params": args.params, "shape": shape.name, "B": shape.B,
                     "HQ": shape.HQ, "HKV": shape.HKV, "T": shape.T, "D": shape.D,
                     "k": pair[0], "v": pair[1], "page_tokens": P, "contiguous_us": f"{mc:.2f}", "paged_us": f"{mp:.2f}",
                     "paged_over_contiguous": f"{ratio:.3f}", "contiguous_p10": f"{q10(tc):.2f}",
                     "contiguous_p90": f"{q90(tc):.2f}", "paged_p10": f"{q10(tp):.2f}", "paged_p90": f"{q90(tp):.2f}",
                     "splits": f"{launch_c['splits']}/{launch_p['splits']}", "bitwise_equal": int(same),
                     "input_sets": sets, "calls_per_graph": calls, "gpu": gpu, "driver": driver_version(), "commit": commit})
        print(f"[{n}/{len(todo)}] {shape.name} B={shape.B} T={shape.T} {pair[0]}/{pair[1]} P={P}: contiguous {mc:.2f} us, "
              f"paged {mp:.2f} us ({ratio:.3f}x)", file=sys.stderr, flush=True)
        del data, outs, first, q, caches, paged
        torch.cuda.empty_cache()
        with open(args.out, "w", newline="") as f:  # rewritten each row: a cut-off run keeps what it timed
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)
    for line in summary(rows):
        print(line)


def summary(rows, limit=1.05):
    """Issue 33's check per page size: paged / contiguous at B >= 8 (median, max, rows above `limit`,
    the worst row) and at B = 1 (median, max)."""
    out = []
    for P in sorted({int(r["page_tokens"]) for r in rows}):
        at = [r for r in rows if int(r["page_tokens"]) == P]
        big = [r for r in at if int(r["B"]) >= 8]
        ratio = lambda r: float(r["paged_over_contiguous"])  # noqa: E731
        line = f"{rows[0]['layout']} ({rows[0]['pool_order']} pool, {rows[0]['params']} parameters) P={P}:"
        if big:
            worst = max(big, key=ratio)
            line += (f" B>=8 median {statistics.median(map(ratio, big)):.3f}, max {ratio(worst):.3f} ({worst['shape']} "
                     f"B={worst['B']} T={worst['T']} {worst['k']}/{worst['v']}), {sum(ratio(r) > limit for r in big)} of "
                     f"{len(big)} rows above {limit}")
        small = [ratio(r) for r in at if int(r["B"]) == 1]
        if small:
            line += f"; B=1 median {statistics.median(small):.3f}, max {max(small):.3f}"
        out.append(line)
    return out


if __name__ == "__main__":
    main()
