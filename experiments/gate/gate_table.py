#!/usr/bin/env python3
"""The gate for any kernel, on the GPU machine: kvq.gate's decode cases on the peers (torch SDPA's
backends, FBGEMM's INT4 kernel, FlashInfer's paged decode: python/kvq/gate_peers.py) and on kvq's own
decode variants called from Python (python/kvq/gate_kvq.py), one gate run per (kernel, K/V storage
pair). Writes OUT/<kernel>__<k>__<v>.json (kvq validate's report), OUT/table.csv and OUT/table.md
(kernel x case family -> OK / FAIL / REFUSED / SKIP counts), OUT/failures.md (each failing case: its
shape, lengths and what went wrong: the minimal reproduction) and OUT/refused.md (each refusal and its
message). With --cpp VALIDATE.json (kvq validate's report of the same commit) it compares the verdicts
of kvq's variants through both paths, case by case.

    python3 experiments/gate/gate_table.py --out results/gate --peers sdpa_flash,flashinfer_paged \
        --kvq decode-tc --cpp results/device/validate.json

A peer whose library is missing (FBGEMM, FlashInfer) is reported skipped with the import error.
"""
import argparse
import csv
import json
import os
import re
import sys
import time
from collections import defaultdict

import kvq.gate as gate
import kvq.gate_kvq as gate_kvq
import kvq.gpu as gpu
import kvq.gate_peers as gate_peers

# kvq's variants through Python: (variant, layout) -> the storage pairs (a subset of the C++ gate's)
KVQ_PAIRS = {
    "bnsh": [("bf16", "bf16"), ("fp16", "fp16"), ("int8-head", "int8-head"), ("int8-token-asym", "int8-token-asym"),
             ("int4-g32-asym", "int4-g32-asym"), ("int4-head-asym", "int4-head-asym"), ("fp8-e4m3-head", "fp8-e4m3-head"),
             ("fp8-e4m3", "fp8-e5m2"), ("int4-g32-asym", "int8-head"), ("int8-head", "int4-g32-asym"),
             ("int4-chan-t32-asym", "int4-g32-asym"), ("bf16", "int4-g32-asym")],
    "fbgemm": [("int4-head-asym", "int4-head-asym"), ("int4-g32-asym", "int4-g32-asym")],
}


STATUSES = ("OK", "FAIL", "REFUSED", "SKIP")
ZERO = {s: 0 for s in STATUSES}


def run_one(kern, name, k, v, args, rows, failures, refusals):
    path = os.path.join(args.out, f"{name}__{k}__{v}.json".replace("/", "_"))
    start = time.perf_counter()
    try:
        rep = gate.check(kern, k, v, cases=args.cases, reruns=args.reruns, device="cuda", report=path, log=None)
    except (ValueError, RuntimeError) as e:
        print(f"[SKIP] {name} K {k} / V {v}: {e}", flush=True)
        rows.append({"kernel": name, "k": k, "v": v, "family": "(all)", **ZERO, "note": str(e)})
        return None
    print(f"{rep.summary()} K {k} / V {v} ({time.perf_counter() - start:.0f} s)", flush=True)
    by_family = defaultdict(lambda: dict(ZERO))
    for c in rep.cases:
        by_family[c.family][c.status] += 1
        if c.status == "FAIL":
            failures.append((name, k, v, c))
        elif c.status == "REFUSED":
            refusals.append((name, k, v, c))
    for family, counts in by_family.items():
        rows.append({"kernel": name, "k": k, "v": v, "family": family, **counts, "note": ""})
    return rep


def cell(r):
    """A family's verdict for one (kernel, storages): FAIL if a case failed, else OK and / or the refusals."""
    if r is None:
        return ""
    if int(r["FAIL"]):
        return "FAIL"
    parts = (["OK"] if int(r["OK"]) else []) + ([f"REFUSED {r['REFUSED']}"] if int(r["REFUSED"]) else [])
    return ", ".join(parts) or "skip"


def write_tables(rows, failures, refusals, out):
    with open(os.path.join(out, "table.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["kernel", "k", "v", "family", *STATUSES, "note"])
        w.writeheader()
        w.writerows(rows)
    families = [f for f in gate.FAMILIES if any(r["family"] == f for r in rows)]
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("| kernel | K / V | " + " | ".join(families) + " |\n|---|---|" + "---|" * len(families) + "\n")
        keyed = defaultdict(dict)
        notes = {}
        for r in rows:
            keyed[(r["kernel"], r["k"], r["v"])][r["family"]] = r
            if r["note"]:
                notes[(r["kernel"], r["k"], r["v"])] = r["note"]
        for (kernel, k, v), fams in keyed.items():
            if (kernel, k, v) in notes:
                f.write(f"| {kernel} | {k} / {v} | skipped: {notes[(kernel, k, v)][:120]} |\n")
                continue
            cells = []
            for fam in families:
                r = fams.get(fam)
                cells.append(cell(r))
            f.write(f"| {kernel} | {k} / {v} | " + " | ".join(cells) + " |\n")
    with open(os.path.join(out, "failures.md"), "w") as f:
        f.write("# Failing cases: each is a reproduction (kvq.gate, seed 0: the case's shape, lengths and storage)\n\n")
        for name, k, v, c in failures:
            f.write(f"- **{name}**, K {k} / V {v}, {c.name} ({c.shape}): {c.detail}\n")
            f.write(f"  `python -m kvq.gate <{name}> --k {k} --v {v} --cases {c.family} --device cuda`\n")
    with open(os.path.join(out, "refused.md"), "w") as f:
        f.write("# Refused cases: the kernel said it does not take the case (not failures)\n\n")
        for name, k, v, c in refusals:
            f.write(f"- **{name}**, K {k} / V {v}, {c.name} ({c.shape}): {c.detail}\n")


def compare_with_cpp(cpp_path, reports):
    """kvq validate's verdict of each case kvq's variants ran through both paths (same case name and storages)."""
    with open(cpp_path) as f:
        cpp = json.load(f)["cases"]

    def key(variant, case, scheme, shape):
        """(variant, case, K, V, layout, D): "K a / V b LAYOUT" and "a LAYOUT" name the same pair."""
        w = scheme.split()
        k, v = (w[1], w[4]) if w[0] == "K" else (w[0], w[0])
        d = re.search(r"\bD=(\d+)", shape)
        return variant, case, k, v, w[-1], d.group(1) if d else ""
    cpp_verdict = {}
    for c in cpp:  # kvq validate writes no scheme or shape for its non-decode checks
        if "scheme" in c and "shape" in c:
            cpp_verdict[key(c["variant"], c["case"], c["scheme"], c["shape"])] = (
                "SKIP" if c.get("skipped") else "OK" if c["ok"] else "FAIL")
    same, differ, unmatched = 0, [], 0
    for name, rep in reports:
        variant = name.split(":")[0]
        for c in rep.cases:
            want = cpp_verdict.get(key(variant, c.name, c.scheme, c.shape))
            if want is None:
                unmatched += 1
            elif want == c.status:
                same += 1
            else:
                differ.append(f"{name} {c.name} {c.scheme}: Python {c.status}, C++ {want}")
    print(f"kvq's variants, Python path vs kvq validate: {same} cases with the same verdict, {len(differ)} differ, "
          f"{unmatched} with no C++ counterpart (families only the Python gate runs)")
    for d in differ:
        print("  differs: " + d)
    return not differ


def checked_options(ap, args):
    """(peers, kvq variants, cases) from the options, or a usage error before any run: a misspelt name
    would otherwise fill the table with SKIP rows (and exit 0). A missing --cpp report is warned of
    first (it used to stop the run with a traceback after every kernel had run)."""
    peers = [p for p in args.peers.split(",") if p]
    unknown = [p for p in peers if p not in gate_peers.PEERS]
    if unknown:
        ap.error(f"--peers {','.join(unknown)}: not in gate_peers.PEERS ({', '.join(gate_peers.PEERS)})")
    variants = [v for v in args.kvq.split(",") if v]
    if variants and gpu._gpu is not None:  # the registry answers without a device; a CPU-only build's
        decode = [v["name"] for v in gpu._gpu.variants() if v["kind"] == "decode"]  # runs say why they skip
        unknown = [v for v in variants if v not in decode]
        if unknown:
            ap.error(f"--kvq {','.join(unknown)}: not a decode variant of this build ({', '.join(decode)})")
    cases = args.cases if args.cases in ("quick", "full") else [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in gate.FAMILIES] if isinstance(cases, list) else []
    if unknown or not cases:
        ap.error(f"--cases {args.cases}: expected quick, full or families of {', '.join(gate.FAMILIES)}")
    if args.reruns < 2:  # kvq.gate's rule: a rerun compares at least two calls
        ap.error(f"--reruns {args.reruns}: expected >= 2")
    if args.cpp and not os.path.isfile(args.cpp):  # the kernels still run: their tables are worth having
        print(f"gate_table: warning: --cpp {args.cpp}: no such file (kvq validate --report writes it); the gate runs, "
              "its verdicts are not compared, and the exit status is 1", file=sys.stderr)
    return peers, variants, cases


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/gate")
    ap.add_argument("--peers", default=",".join(gate_peers.PEERS), help="comma-separated names of gate_peers.PEERS")
    ap.add_argument("--kvq", default="decode-tc", help="kvq decode variants to gate through Python (comma-separated)")
    ap.add_argument("--cases", default="full", help="quick, full, or family names separated by commas (kvq.gate.FAMILIES)")
    ap.add_argument("--reruns", type=int, default=10)
    ap.add_argument("--cpp", help="kvq validate's report of the same build, to compare verdicts with")
    args = ap.parse_args(argv)
    peers, variants, args.cases = checked_options(ap, args)
    os.makedirs(args.out, exist_ok=True)
    rows, failures, refusals, kvq_reports = [], [], [], []
    for peer in peers:
        try:
            kern = getattr(gate_peers, peer)
        except Exception as e:  # noqa: BLE001  the peer's library is missing or fails to load
            print(f"[SKIP] {peer}: cannot load: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
            rows.append({"kernel": peer, "k": "", "v": "", "family": "(all)", **ZERO,
                         "note": f"cannot load: {type(e).__name__}: {str(e).splitlines()[0][:200]}"})
            continue
        for k, v in gate_peers.PEERS[peer]:
            run_one(kern, kern.name, k, v, args, rows, failures, refusals)
    for variant in variants:
        for layout, pairs in KVQ_PAIRS.items():
            kern = gate_kvq.kernel(variant, layout)
            for k, v in pairs:
                rep = run_one(kern, kern.name, k, v, args, rows, failures, refusals)
                if rep is not None:
                    kvq_reports.append((kern.name, rep))
    write_tables(rows, failures, refusals, args.out)
    print(f"wrote {args.out}/table.md, table.csv, failures.md ({len(failures)} failing cases), refused.md "
          f"({len(refusals)} refused)")
    for name, k, v, c in failures[:40]:
        print(f"  FAIL {name} K {k} / V {v} {c.name} ({c.shape}): {c.detail[:300]}")
    ok = not args.cpp or os.path.isfile(args.cpp)
    if ok and args.cpp and kvq_reports:
        ok = compare_with_cpp(args.cpp, kvq_reports)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
