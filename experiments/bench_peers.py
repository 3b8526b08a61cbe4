#!/usr/bin/env python3
"""Times the peers a kvq decode kernel is compared with: PyTorch scaled_dot_product_attention with
the cuDNN and FlashAttention-2 backends, bf16, decode (one query per sequence), GQA native, on the
DESIGN.md shapes, the way DESIGN.md prescribes: CUDA events around CUDA-graph replays, rotating
input sets totalling >= 4x L2 (several calls per graph, so the graph launch is amortized, as in
`kvq bench`), warm-up, median / p10 / p90 of >= 30 replays, and a device-to-device copy measured in
the same process. The CSV has `kvq bench`'s schema; `kvq bench --peers` puts the rows beside its own.

    python3 experiments/bench_peers.py --out results/peers/peers.csv [--commit HASH]

Needs a CUDA GPU and torch (the GPU machine's image has it).
"""
import argparse
import csv
import os
import re
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = ([("seed000", b, 8, 1, 8192, 128) for b in (32, 64, 128, 256, 512)] +
          [("seed002", 1, 32, 8, 1024, 128)] +
          [("llama8b", b, 32, 8, t, 128) for b in (1, 8, 64) for t in (1024, 8192, 32768) if (b, t) != (64, 32768)] +
          [("mha_b128", 128, 32, 32, t, 128) for t in (128, 1024, 4096)])
PEERS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash2": SDPBackend.FLASH_ATTENTION}


def percentile(values, q):
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (pos - lo) * (v[hi] - v[lo])


def time_graphs(make_call, sets, reps, warmup=5, calls_per_graph=1):
    """make_call(i) returns a no-argument function enqueueing the work for input set i. Graph g
    captures calls on sets g, g+1, ...; the times returned are per call."""
    stream = torch.cuda.Stream()
    graphs = []
    calls = [make_call(i) for i in range(sets)]
    with torch.cuda.stream(stream):
        for call in calls:
            call()  # warm-up outside the capture (kernel selection, workspace)
        torch.cuda.synchronize()
        for i in range(sets):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                for c in range(calls_per_graph):
                    calls[(i + c) % sets]()
            graphs.append(g)
    for i in range(warmup):
        graphs[i % sets].replay()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    us = []
    for i in range(reps):
        start.record()
        graphs[i % sets].replay()
        stop.record()
        stop.synchronize()
        us.append(start.elapsed_time(stop) * 1e3 / calls_per_graph)
    return us


def copy_gbps(nbytes=2 << 30, reps=30):
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    us = time_graphs(lambda i: (lambda: dst.copy_(src)), 1, reps)
    return 2 * nbytes / (statistics.median(us) * 1e3)


def driver_version():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/peers/peers.csv")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--calls-per-graph", type=int, default=8)
    ap.add_argument("--shapes", default=".", help="regex over shape names")
    ap.add_argument("--commit", default=os.environ.get("KVQ_COMMIT", "unknown"))
    ap.add_argument("--reference", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "peers",
                                                        "peers_h100.csv"), help="earlier peer figures to compare with")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: peers not timed", file=sys.stderr)
        return 1
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    copy = copy_gbps()
    reference = {}
    if os.path.exists(args.reference):
        with open(args.reference) as f:
            for r in csv.DictReader(f):
                reference[(r["shape"], int(r["B"]), int(r["T"]), r["peer"])] = float(r["us"])
    print(f"{props.name}, driver {driver_version()}, torch {torch.__version__}; copy {copy:.0f} GB/s (read + write)")
    print(f"{'shape':<10}{'B':>5}{'Hq':>4}{'Hkv':>4}{'T':>7}  {'peer':<7}{'median us':>10}{'p10':>9}{'p90':>9}"
          f"{'KV GB/s':>9}{'% copy':>8}{'ref us':>8}")
    rows = []
    for name, B, hq, hkv, T, D in SHAPES:
        if not re.search(args.shapes, name):
            continue
        kv_bytes = 2 * B * hkv * T * D * 2
        set_bytes = kv_bytes + 2 * B * hq * D * 2
        sets = max(1, -(-4 * l2 // set_bytes))
        if sets * set_bytes > 0.6 * props.total_memory:
            sets = 1
        data = [(torch.randn(B, hq, 1, D, device="cuda", dtype=torch.bfloat16),
                 torch.randn(B, hkv, T, D, device="cuda", dtype=torch.bfloat16),
                 torch.randn(B, hkv, T, D, device="cuda", dtype=torch.bfloat16)) for _ in range(sets)]
        for peer, backend in PEERS.items():
            def make_call(i, backend=backend):
                q, k, v = data[i]

                def call():
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)
                return call
            try:
                us = time_graphs(make_call, sets, args.reps, calls_per_graph=args.calls_per_graph)
            except RuntimeError as e:  # a backend that does not take the shape: say so, go on
                print(f"{name:<10}{B:>5}{hq:>4}{hkv:>4}{T:>7}  {peer:<7} not supported: {str(e).splitlines()[0][:60]}")
                continue
            med = statistics.median(us)
            kv_gbps = kv_bytes / (med * 1e3)
            ref = reference.get((name, B, T, peer))
            print(f"{name:<10}{B:>5}{hq:>4}{hkv:>4}{T:>7}  {peer:<7}{med:>10.1f}{percentile(us, 0.1):>9.1f}"
                  f"{percentile(us, 0.9):>9.1f}{kv_gbps:>9.0f}{100 * kv_gbps / copy:>7.1f}%"
                  f"{ref if ref is not None else float('nan'):>8.1f}", flush=True)
            cudnn = next((float(r["median_us"]) for r in rows
                          if (r["shape"], r["B"], r["T"], r["kernel"]) == (name, B, T, "cudnn")), None)
            rows.append({"shape": name, "B": B, "HQ": hq, "HKV": hkv, "T": T, "D": D, "kernel": peer,
                         "k_scheme": "bf16", "v_scheme": "bf16", "splits": "", "heads_per_cta": "",
                         "median_us": f"{med:.3f}", "p10_us": f"{percentile(us, 0.1):.3f}",
                         "p90_us": f"{percentile(us, 0.9):.3f}", "reps": len(us),
                         "calls_per_graph": args.calls_per_graph, "input_sets": sets, "bytes": set_bytes,
                         "GBps": f"{set_bytes / (med * 1e3):.1f}", "pct_of_read": "", "read_GBps": "",
                         "copy_GBps": f"{copy:.1f}", "vs_cudnn": f"{med / cudnn:.3f}" if cudnn else "",
                         "gpu": props.name, "driver": driver_version(), "cuda": torch.version.cuda,
                         "commit": args.commit})
        del data
        torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
