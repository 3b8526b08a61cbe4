#!/usr/bin/env python3
"""Times the peers a kvq decode kernel is compared with, decode (one query per sequence), on the
DESIGN.md shapes (experiments/bench/peer_rows.py):
- PyTorch scaled_dot_product_attention with the cuDNN and FlashAttention-2 backends, bf16, GQA native;
- FBGEMM's INT4 GQA kernel `torch.ops.fbgemm.gqa_attn_splitk` on its inline rows with 1 and 4
  (scale, shift) groups, the best split count of a range per shape (as the seed did); it takes
  Hkv = 1, D = 128 and T <= 16384 only, other shapes are skipped with a line saying why. It needs the
  fbgemm-gpu-genai wheel on PYTHONPATH (README); without it those rows are skipped with one line;
- FlashInfer's paged batch decode (BatchDecodeWithPagedKVCacheWrapper, pages of 16 tokens, NHD) over an
  FP8 e4m3 cache and, as its own baseline, a bf16 one, bf16 queries: the tensor-core kernel when query
  heads share a KV head, the CUDA-core one for MHA, planned once per shape outside the timed region.
  Each shape's output is first checked against fp32 attention over the cache as stored. It needs the
  wheels of .whl/flashinfer/ on PYTHONPATH and nvcc and ninja for its JIT build at first use (README);
  without them those rows are skipped with one line.
Timed the way DESIGN.md prescribes: CUDA events around CUDA-graph replays, rotating input sets
totalling >= 4x L2 (several calls per graph, so the graph launch is amortized, as in `kvq bench`),
warm-up, median / p10 / p90 of >= 30 replays, with a read-only and a copy bandwidth measured in the
same process. The CSV has `kvq bench`'s schema; `kvq bench --peers` puts the rows beside its own.

    python3 experiments/bench/bench_peers.py --out results/peers/peers.csv [--shapes seed000] [--peers fbgemm]

Needs a CUDA GPU and torch (the GPU machine's image has it).
"""
import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from peer_rows import (BF16_PEERS, COLUMNS, FBGEMM_PEERS, FBGEMM_SPLITS, FLASHINFER_PAGE, FLASHINFER_PEERS, SHAPES,
                       Machine, Shape, bf16_bytes, fbgemm_bytes, fbgemm_row_bytes, fbgemm_skip_reason, fbgemm_splits,
                       flashinfer_bytes, flashinfer_pages, flashinfer_tensor_cores, input_sets, make_row, select)

SDPA_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash2": SDPBackend.FLASH_ATTENTION}
INT4 = 2  # FBGEMM's CacheLogicalDtype::INT4
FLASHINFER_WORKSPACE = 256 << 20  # FlashInfer's split-KV scratch (it recommends 128 MB)


def time_graphs(make_call, sets, reps, warmup=5, calls_per_graph=1):
    """make_call(i) returns a no-argument function enqueueing the work for input set i. Graph g
    captures calls on sets g, g+1, ...; the times returned are per call."""
    return time_graphs_interleaved([make_call], sets, reps, warmup, calls_per_graph)[0]


def time_graphs_interleaved(make_calls, sets, reps, warmup=5, calls_per_graph=1):
    """time_graphs for several kinds of call at once, their graphs replayed in turn (a, b, a, b, ...):
    clock and thermal drift fall on every kind alike, so rep i of each kind is a fair pair. Returns
    one list of per-call times a kind."""
    stream = torch.cuda.Stream()
    graphs = []  # [kind][set]
    for make_call in make_calls:
        calls = [make_call(i) for i in range(sets)]
        with torch.cuda.stream(stream):
            for call in calls:
                call()  # warm-up outside the capture (kernel selection, workspace, argument checks)
            torch.cuda.synchronize()
            graphs.append([])
            for i in range(sets):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=stream):
                    for c in range(calls_per_graph):
                        calls[(i + c) % sets]()
                graphs[-1].append(g)
    for i in range(warmup):
        for kind in graphs:
            kind[i % sets].replay()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    us = [[] for _ in graphs]
    for i in range(reps):
        for kind, times in zip(graphs, us):
            start.record()
            kind[i % sets].replay()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1e3 / calls_per_graph)
    return us


def copy_gbps(nbytes=2 << 30, reps=30):
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    us = time_graphs(lambda i: (lambda: dst.copy_(src)), 1, reps)
    return 2 * nbytes / (statistics.median(us) * 1e3)


def read_gbps(nbytes=2 << 30, reps=30):
    """A reduction to one number reads every byte and writes almost nothing, like decode."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
    out = torch.empty((), dtype=torch.float32, device="cuda")
    us = time_graphs(lambda i: (lambda: torch.amax(src, dim=0, out=out)), 1, reps)
    return nbytes / (statistics.median(us) * 1e3)


def driver_version():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"


def reason(e, width=100):
    """An exception as one line: its type and the start of its message's first line."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:width] if text else ''}"


def load_fbgemm():
    """None when gqa_attn_splitk is registered, else why not."""
    try:
        import fbgemm_gpu.experimental.gen_ai  # noqa: F401  registers torch.ops.fbgemm.*
        torch.ops.fbgemm.gqa_attn_splitk  # noqa: B018  raises when the op is missing
        return None
    except (ImportError, OSError, AttributeError, RuntimeError) as e:
        return reason(e)


def fbgemm_rows(B, T, D, groups, codes=None):
    """A cache [B, T, 1, D/2 + 4 groups] uint8: per row `groups` fp16 (scale, shift) pairs, then packed
    codes (random unless `codes` [B, T, groups] gives one code per group, for the layout check).
    Scales in [0.05, 0.15] and shifts in [-1, -0.5] keep values in about [-1, 1.75]."""
    scale = torch.empty(B, T, 1, groups, device="cuda").uniform_(0.05, 0.15)
    shift = torch.empty(B, T, 1, groups, device="cuda").uniform_(-1.0, -0.5)
    params = torch.stack([scale, shift], dim=-1).to(torch.float16).reshape(B, T, 1, 2 * groups)
    if codes is None:
        packed = torch.randint(0, 256, (B, T, 1, D // 2), dtype=torch.uint8, device="cuda")
    else:  # both nibbles of every byte of a group hold the group's code
        packed = (codes.to(torch.uint8) * 17).reshape(B, T, 1, groups, 1).expand(B, T, 1, groups, D // 2 // groups)
        packed = packed.reshape(B, T, 1, D // 2)
    rows = torch.cat([params.view(torch.uint8), packed], dim=-1).contiguous()
    assert rows.shape[-1] == fbgemm_row_bytes(D, groups)
    return rows, params


def positions(B, T):
    """gqa_attn_splitk's seq_positions: the last position each query attends to, here all T keys."""
    return torch.full((B,), T - 1, dtype=torch.int32, device="cuda")


def fbgemm_attention(q, k, v, pos, splits, groups):
    """O [B, 1, Hq, D] bf16 of Q [B, 1, Hq, D] bf16 over the rows k, v [B, T, 1, D/2 + 4 groups]."""
    return torch.ops.fbgemm.gqa_attn_splitk(q, k, v, pos, 1 / math.sqrt(q.shape[-1]), splits,
                                            kv_cache_quant_num_groups=groups, use_tensor_cores=True,
                                            cache_logical_dtype_int=INT4)[0]


def check_fbgemm(groups, B=3, HQ=8, T=211, D=128):
    """Layout check before timing: codes constant per group (so FBGEMM's nibble order does not matter)
    against attention in fp32 over the same dequantized values. A layout slip (scale and shift
    swapped, groups misplaced) moves O by O(1); bf16 rounding in the kernel by well under 2 %."""
    kc, vc = (torch.randint(0, 16, (B, T, groups), device="cuda") for _ in range(2))
    (k, kp), (v, vp) = fbgemm_rows(B, T, D, groups, kc), fbgemm_rows(B, T, D, groups, vc)

    def dequantized(codes, params):  # [B, T, D]
        p = params.float().reshape(B, T, groups, 2)
        return (codes * p[..., 0] + p[..., 1]).repeat_interleave(D // groups, dim=-1)
    q = torch.randn(B, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
    kd, vd = dequantized(kc, kp), dequantized(vc, vp)
    p = torch.softmax(torch.einsum("bhd,btd->bht", q[:, 0].float(), kd) / math.sqrt(D), dim=-1)
    ref = torch.einsum("bht,btd->bhd", p, vd)
    err = (fbgemm_attention(q, k, v, positions(B, T), 4, groups)[:, 0].float() - ref).abs().max().item()
    bound = 0.02 * vd.abs().max().item()
    return err <= bound, f"max |O - ref| = {err:.4f} (bound {bound:.4f})"


def load_flashinfer():
    """None when FlashInfer's decode wrapper imports, else why not."""
    try:
        from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper  # noqa: F401
        return None
    except Exception as e:  # noqa: BLE001  whatever its import chain raises (a missing dependency, tvm-ffi's library)
        return reason(e)


def flashinfer_cache(shape, peer):
    """K and V [pages, 16, Hkv, D] (NHD) of the peer's dtype, N(0, 1) rounded onto its grid; sequence b
    owns pages b*P .. b*P + P - 1 (P pages per sequence)."""
    pages, _ = flashinfer_pages(shape.T)
    return tuple(torch.randn(shape.B * pages, FLASHINFER_PAGE, shape.HKV, shape.D, device="cuda",
                             dtype=torch.bfloat16).to(getattr(torch, peer.kv_dtype)) for _ in range(2))


def flashinfer_decoder(shape, peer, workspace):
    """A BatchDecodeWithPagedKVCacheWrapper planned for the shape over flashinfer_cache's page table.
    The first plan() of a kernel builds it (nvcc, into FLASHINFER_WORKSPACE_BASE) or loads it prebuilt."""
    from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper
    pages, last = flashinfer_pages(shape.T)
    decoder = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=flashinfer_tensor_cores(shape))
    decoder.plan(torch.arange(shape.B + 1, dtype=torch.int32, device="cuda") * pages,
                 torch.arange(shape.B * pages, dtype=torch.int32, device="cuda"),
                 torch.full((shape.B,), last, dtype=torch.int32, device="cuda"), shape.HQ, shape.HKV, shape.D,
                 FLASHINFER_PAGE, q_data_type=torch.bfloat16, kv_data_type=getattr(torch, peer.kv_dtype))
    torch.cuda.synchronize()  # plan() uploads its schedule asynchronously; time_graphs runs on another stream
    return decoder


def flashinfer_run(decoder, q, k, v):
    """O [B, Hq, D] bf16 of Q [B, Hq, D] bf16. Unit per-tensor scales (the scale-free fp8-e4m3): FlashInfer
    folds k_scale into the softmax scale and skips the rescale of O at v_scale 1."""
    return decoder.run(q, (k, v), k_scale=1.0, v_scale=1.0)


def prepare_flashinfer(peers, shapes, workspace):
    """Builds or loads each kernel the shapes need on a one-page problem first, so that a kernel that does
    not build costs one try and one line; returns the (peer, tensor cores, D) that work."""
    ready = set()
    for peer in peers:
        for tensor_cores, head_dim in sorted({(flashinfer_tensor_cores(s), s.D) for s in shapes}):
            kind = f"{'tensor-core' if tensor_cores else 'CUDA-core'} kernel, D={head_dim}"
            mini = Shape("jit", 1, 2 if tensor_cores else 1, 1, FLASHINFER_PAGE, head_dim)
            start = time.perf_counter()
            try:
                q = torch.randn(1, mini.HQ, head_dim, device="cuda", dtype=torch.bfloat16)
                flashinfer_run(flashinfer_decoder(mini, peer, workspace), q, *flashinfer_cache(mini, peer))
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001  JIT build (nvcc, ninja), load or launch
                print(f"FlashInfer rows skipped: {peer.name}, {kind}: {reason(e, 300)}")
                for line in str(e).strip().splitlines()[1:][-20:]:  # a build's errors end its message
                    print(f"    {line}")
                continue
            print(f"FlashInfer {peer.name}, {kind}: ready in {time.perf_counter() - start:.0f} s (built or loaded)")
            ready.add((peer.name, tensor_cores, head_dim))
    return ready


def flashinfer_reference(shape, q, k, v, chunk_bytes=256 << 20):
    """fp32 attention O [B, Hq, D] over the cache as stored (e4m3 and bf16 are exact in fp32), a few
    sequences at a time so that the fp32 copies stay small."""
    B, T, G = shape.B, shape.T, shape.HQ // shape.HKV
    k, v = (c.view(B, -1, shape.HKV, shape.D)[:, :T] for c in (k, v))
    step = max(1, chunk_bytes // (T * shape.HKV * shape.D * 4))
    out = []
    for b in range(0, B, step):
        s = torch.einsum("bhgd,bthd->bhgt", q[b:b + step].float().view(-1, shape.HKV, G, shape.D),
                         k[b:b + step].float()) / math.sqrt(shape.D)
        out.append(torch.einsum("bhgt,bthd->bhgd", torch.softmax(s, dim=-1), v[b:b + step].float()))
    return torch.cat(out).reshape(B, shape.HQ, shape.D)


def time_flashinfer(shape, peer, args, l2, memory, workspace):
    """(check passed, its line, per-call times (None when the check failed), sets). The check compares
    input set 0's output with flashinfer_reference. Random keys make the softmax flat, so |O| is about
    1.6/sqrt(T) and the bound is 2 % of max |ref|: a wrong page, head or layout moves O by about |O|
    itself, bf16 rounding of P and O by well under 1 %."""
    sets = input_sets(flashinfer_bytes(shape, peer.kv_bytes), l2, memory)
    data = [(torch.randn(shape.B, shape.HQ, shape.D, device="cuda", dtype=torch.bfloat16),
             *flashinfer_cache(shape, peer)) for _ in range(sets)]
    decoder = flashinfer_decoder(shape, peer, workspace)
    ref = flashinfer_reference(shape, *data[0])
    err = (flashinfer_run(decoder, *data[0]).float() - ref).abs().max().item()
    bound = 0.02 * ref.abs().max().item()
    detail = f"max |O - ref| = {err:.2e} (bound {bound:.2e})"
    del ref
    if not err <= bound:
        return False, detail, None, sets

    def make_call(i):
        q, k, v = data[i]
        return lambda: flashinfer_run(decoder, q, k, v)
    return True, detail, time_graphs(make_call, sets, args.reps, calls_per_graph=args.calls_per_graph), sets


def time_sdpa(shape, peer, data, args):
    def make_call(i):
        q, k, v = data[i]

        def call():
            with sdpa_kernel(SDPA_BACKENDS[peer]):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=shape.HQ != shape.HKV)
        return call
    return time_graphs(make_call, len(data), args.reps, calls_per_graph=args.calls_per_graph)


def time_fbgemm(shape, peer, args, l2, memory):
    """(best split, its times, sets, one line of every split's median)."""
    nbytes = fbgemm_bytes(shape, peer.groups)
    sets = input_sets(nbytes, l2, memory)
    data = [(torch.randn(shape.B, 1, shape.HQ, shape.D, device="cuda", dtype=torch.bfloat16),
             fbgemm_rows(shape.B, shape.T, shape.D, peer.groups)[0],
             fbgemm_rows(shape.B, shape.T, shape.D, peer.groups)[0], positions(shape.B, shape.T)) for _ in range(sets)]
    best, tried = None, []
    for splits in fbgemm_splits(shape.T, args.fbgemm_splits):
        def make_call(i, splits=splits):
            q, k, v, pos = data[i]
            return lambda: fbgemm_attention(q, k, v, pos, splits, peer.groups)
        try:
            us = time_graphs(make_call, sets, args.reps, calls_per_graph=args.calls_per_graph)
        except RuntimeError as e:  # e.g. one split's scores do not fit in shared memory
            tried.append(f"{splits}: {str(e).strip().splitlines()[0][:50]}")
            continue
        tried.append(f"{splits}: {statistics.median(us):.1f}")
        if best is None or statistics.median(us) < statistics.median(best[1]):
            best = (splits, us)
    del data
    return best, sets, "; ".join(tried)


def print_row(r, ref):
    print(f"{r['shape']:<10}{r['B']:>5}{r['HQ']:>4}{r['HKV']:>4}{r['T']:>7}  {r['kernel']:<20}{r['splits']:>5}"
          f"{float(r['median_us']):>10.1f}{float(r['p10_us']):>9.1f}{float(r['p90_us']):>9.1f}"
          f"{float(r['GBps']):>8.0f}{float(r['pct_of_read']):>7.1f}%{r['vs_cudnn']:>8}"
          f"{ref if ref is not None else float('nan'):>8.1f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/peers/peers.csv")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--calls-per-graph", type=int, default=8)
    ap.add_argument("--shapes", default=".", help="regex over shape labels, as kvq bench's: seed000, seed000/B128/T8192")
    ap.add_argument("--peers", default=".",
                    help="regex over peer names (cudnn, flash2, fbgemm-int4-g1, fbgemm-int4-g4, "
                         "flashinfer-fp8-e4m3, flashinfer-bf16)")
    ap.add_argument("--fbgemm-splits", default=",".join(map(str, FBGEMM_SPLITS)),
                    type=lambda s: [int(x) for x in s.split(",") if x], help="split counts FBGEMM is timed with")
    ap.add_argument("--commit", default=os.environ.get("KVQ_COMMIT", "unknown"))
    ap.add_argument("--reference", default=os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "peers",
                                                        "peers_h100.csv"), help="earlier peer figures to compare with")
    args = ap.parse_args()
    if args.reps < 30:
        ap.error(f"--reps {args.reps}: DESIGN.md asks for at least 30 replays")
    try:
        chosen = set(select("--peers", args.peers, list(BF16_PEERS) + [p.name for p in FBGEMM_PEERS + FLASHINFER_PEERS]))
        shapes = select("--shapes", args.shapes, SHAPES, lambda s: s.label)
    except ValueError as e:
        ap.error(str(e))
    if not torch.cuda.is_available():
        print("no CUDA device: peers not timed", file=sys.stderr)
        return 1
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    machine = Machine(props.name, driver_version(), torch.version.cuda or "", args.commit, read_gbps(), copy_gbps())
    reference = {}
    if os.path.exists(args.reference):
        with open(args.reference) as f:
            for r in csv.DictReader(f):
                reference[(r["shape"], int(r["B"]), int(r["T"]), r["peer"])] = float(r["us"])
    wanted = lambda peer: peer in chosen  # noqa: E731
    fbgemm_peers = [p for p in FBGEMM_PEERS if wanted(p.name)]
    flashinfer_peers = [p for p in FLASHINFER_PEERS if wanted(p.name)]
    print(f"{machine.gpu}, driver {machine.driver}, torch {torch.__version__}, CUDA {machine.cuda}; "
          f"read {machine.read_gbps:.0f} GB/s, copy {machine.copy_gbps:.0f} GB/s (read + write)")
    failed = False
    if fbgemm_peers:
        why = load_fbgemm()
        if why is not None:
            print(f"FBGEMM rows skipped: fbgemm_gpu.experimental.gen_ai does not load ({why}); "
                  "unzip the fbgemm-gpu-genai wheel onto PYTHONPATH (README, 'FBGEMM peer')")
            fbgemm_peers = []
        for peer in list(fbgemm_peers):  # validate before timing: a failed check drops the peer, fails the run
            ok, detail = check_fbgemm(peer.groups)
            print(f"[{'OK' if ok else 'FAIL'}] {peer.name} layout check: {detail}")
            if not ok:
                fbgemm_peers.remove(peer)
                failed = True
    flashinfer_ready = set()
    if flashinfer_peers:
        why = load_flashinfer()
        if why is not None:
            print(f"FlashInfer rows skipped: flashinfer does not load ({why}); unzip the wheels of .whl/flashinfer/ "
                  "onto PYTHONPATH (README, 'FlashInfer peer')")
            flashinfer_peers = []
        else:
            workspace = torch.zeros(FLASHINFER_WORKSPACE, dtype=torch.uint8, device="cuda")  # zero before first use
            flashinfer_ready = prepare_flashinfer(flashinfer_peers, shapes, workspace)
    print(f"{'shape':<10}{'B':>5}{'Hq':>4}{'Hkv':>4}{'T':>7}  {'peer':<20}{'spl':>5}{'median us':>10}{'p10':>9}"
          f"{'p90':>9}{'GB/s':>8}{'%read':>8}{'/cuDNN':>8}{'ref us':>8}")
    rows = []
    for shape in shapes:
        cudnn_us = None

        def add(kernel, scheme, us, splits, sets, nbytes):
            row = make_row(shape, kernel, scheme, us, splits=splits, calls_per_graph=args.calls_per_graph, sets=sets,
                           nbytes=nbytes, machine=machine, cudnn_us=cudnn_us)
            rows.append(row)
            print_row(row, reference.get((shape.name, shape.B, shape.T, kernel)))
            return float(row["median_us"])
        sdpa_peers = [p for p in BF16_PEERS if wanted(p)]
        if sdpa_peers:
            nbytes = bf16_bytes(shape)
            sets = input_sets(nbytes, l2, props.total_memory)
            data = [tuple(torch.randn(shape.B, h, t, shape.D, device="cuda", dtype=torch.bfloat16)
                          for h, t in ((shape.HQ, 1), (shape.HKV, shape.T), (shape.HKV, shape.T)))
                    for _ in range(sets)]
            for peer in sdpa_peers:
                try:
                    us = time_sdpa(shape, peer, data, args)
                except RuntimeError as e:  # a backend that does not take the shape: say so, go on
                    print(f"{shape.name:<10}{shape.B:>5}{shape.HQ:>4}{shape.HKV:>4}{shape.T:>7}  {peer:<20} "
                          f"not supported: {str(e).splitlines()[0][:60]}")
                    continue
                median = add(peer, "bf16", us, None, sets, nbytes)
                cudnn_us = median if peer == "cudnn" else cudnn_us
            del data
        skip = fbgemm_skip_reason(shape)
        if fbgemm_peers and skip:
            print(f"{shape.name:<10}{shape.B:>5}{shape.HQ:>4}{shape.HKV:>4}{shape.T:>7}  {'fbgemm-int4-*':<20} "
                  f"skipped: gqa_attn_splitk does not take {skip}")
        for peer in fbgemm_peers if not skip else []:
            best, sets, tried = time_fbgemm(shape, peer, args, l2, props.total_memory)
            print(f"    {peer.name} median us by split count: {tried}")
            if best is None:
                continue
            add(peer.name, peer.scheme(shape.D), best[1], best[0], sets, fbgemm_bytes(shape, peer.groups))
        for peer in flashinfer_peers:
            if (peer.name, flashinfer_tensor_cores(shape), shape.D) not in flashinfer_ready:
                continue  # its kernel did not build: said once above
            try:
                ok, detail, us, sets = time_flashinfer(shape, peer, args, l2, props.total_memory, workspace)
            except Exception as e:  # noqa: BLE001  a shape it does not take (plan, run or graph capture raises)
                print(f"{shape.name:<10}{shape.B:>5}{shape.HQ:>4}{shape.HKV:>4}{shape.T:>7}  {peer.name:<20} "
                      f"not supported: {reason(e, 80)}")
                continue
            print(f"[{'OK' if ok else 'FAIL'}] {peer.name} check, {shape.name} B={shape.B} T={shape.T}: {detail}")
            if not ok:
                failed = True
                continue
            add(peer.name, peer.scheme, us, None, sets, flashinfer_bytes(shape, peer.kv_bytes))
        torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.out} ({len(rows)} rows)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
