#!/usr/bin/env python3
"""Speed targets read from one run's CSVs: each target's cases, the ratio it is judged on and whether
it is met. Every ratio compares two numbers of the same run (a kernel against cuDNN timed beside it,
a scheme against another scheme, paged against contiguous, a quantize kernel against the device copy),
never runs of two machines.

    python3 experiments/bench/targets.py --decode decode.csv [--quantize quantize_bandwidth.csv] \\
        [--input uniform|gaussian-rows] [--paged paged.csv] [--gpu "NVIDIA H100 80GB HBM3"] [--all]

--decode: `kvq bench --peers peers.csv --csv decode.csv` (cuDNN's rows or the vs_cudnn column);
--quantize: `kvq bench-quantize --csv`, its rows of one --input (default uniform, the bench's own,
where the targets were set; gaussian-rows, a cache's spread of scales, judges them there); --paged:
experiments/bench/bench_paged.py --out. Each target whose CSV is missing, or that has no case in it,
says so. --gpu: the GPU the targets were set on;
rows of another GPU are judged and the report says whose they are. The missed cases are listed (--all:
every case). Exit status 0 whatever the verdicts.
"""
import argparse
import csv
import re
import statistics
import sys
from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional, Tuple

from compare_runs import KEY_DEFAULTS  # beside this file: what a column older runs lack meant

Case = Tuple[str, float]  # (what was measured, its ratio)


@dataclass(frozen=True)
class Target:
    name: str
    source: str  # "decode", "quantize" or "paged"
    bound: float
    at_most: bool  # the ratio must be <= bound (else >=)
    cases: Callable[[List[dict]], List[Case]]

    def met(self, value: float) -> bool:
        return value <= self.bound if self.at_most else value >= self.bound


def number(row: dict, field: str, path: str) -> float:
    try:
        return float(row[field])
    except (KeyError, ValueError) as e:
        raise SystemExit(f"targets: {path}: row {row}: field '{field}' is not a number ({e})")


def bench_input(row: dict) -> str:
    return row.get("input") or KEY_DEFAULTS["input"]


def read_rows(path: str, needed: Iterable[str]) -> List[dict]:
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise SystemExit(f"targets: {path}: {e.strerror}")
    missing = [c for c in needed if rows and c not in rows[0]]
    if missing:
        raise SystemExit(f"targets: {path}: no column {', '.join(missing)} (expected the CSV of the tool named in --help)")
    for row in rows:
        row["_path"] = path
    return rows


# ---- decode: `kvq bench` rows

def shape_of(r: dict) -> Tuple[str, int, int]:
    return r["shape"], int(r["B"]), int(r["T"])


def label(r: dict) -> str:
    storage = r["k_scheme"] if r["k_scheme"] == r["v_scheme"] else f"{r['k_scheme']}/{r['v_scheme']}"
    return f"{storage} {r['shape']} B={r['B']} T={r['T']}"


def kvq_rows(rows: List[dict]) -> List[dict]:
    """decode-tc's own rows over planar caches (FBGEMM's rows and peers are other kernels)."""
    return [r for r in rows if r["kernel"] == "decode-tc" and not r.get("layout")]


def vs_cudnn(rows: List[dict]) -> Callable[[dict], Optional[float]]:
    """Each row's time over cuDNN's at its shape in the same run (the vs_cudnn column, else cuDNN's row)."""
    cudnn = {(r["shape"], r["B"], r["HQ"], r["HKV"], r["T"], r["D"]): number(r, "median_us", r["_path"])
             for r in rows if r["kernel"] == "cudnn"}

    def ratio(r: dict) -> Optional[float]:
        if r.get("vs_cudnn"):
            return number(r, "vs_cudnn", r["_path"])
        peer = cudnn.get((r["shape"], r["B"], r["HQ"], r["HKV"], r["T"], r["D"]))
        return number(r, "median_us", r["_path"]) / peer if peer else None

    return ratio


def against_cudnn(schemes: Tuple[str, ...], where: Callable[[str, int, int], bool]) -> Callable[[List[dict]], List[Case]]:
    def cases(rows: List[dict]) -> List[Case]:
        ratio = vs_cudnn(rows)
        out = []
        for r in kvq_rows(rows):
            if r["k_scheme"] == r["v_scheme"] and r["k_scheme"] in schemes and where(*shape_of(r)):
                value = ratio(r)
                if value is not None:
                    out.append((label(r), value))
        return out

    return cases


def against_scheme(pair: Callable[[str], Optional[str]], where: Callable[[str, int, int], bool]) -> Callable[[List[dict]], List[Case]]:
    """Rows of a storage K = V over the row of the storage pair(storage) at the same shape."""

    def cases(rows: List[dict]) -> List[Case]:
        mine = [r for r in kvq_rows(rows) if r["k_scheme"] == r["v_scheme"]]
        by = {(r["k_scheme"],) + shape_of(r): number(r, "median_us", r["_path"]) for r in mine}
        out = []
        for r in mine:
            other = pair(r["k_scheme"])
            if other is None or not where(*shape_of(r)):
                continue
            base = by.get((other,) + shape_of(r))
            if base:
                out.append((f"{label(r)} / {other}", number(r, "median_us", r["_path"]) / base))
        return out

    return cases


def window_plain(storage: str) -> Optional[str]:
    m = re.fullmatch(r"(.+)\+w\d+", storage)
    return m.group(1) if m else None


# ---- quantize: `kvq bench-quantize` rows, the fastest variant of each case

def quantize_cases(pattern: str, given: Optional[bool] = None) -> Callable[[List[dict]], List[Case]]:
    def cases(rows: List[dict]) -> List[Case]:
        best = {}
        for r in rows:
            if not re.fullmatch(pattern, r["scheme"]):
                continue
            if given is not None and (r.get("tensor_scale") == "given") != given:
                continue
            key = (r["scheme"], r["layout"], r["HKV"], r.get("tensor_scale", ""))
            pct = number(r, "pct_of_copy", r["_path"])
            if key not in best or pct > best[key][0]:
                best[key] = (pct, r["variant"])
        return [(f"{s} {layout} Hkv={h}{' (scale given)' if g == 'given' else ''} [{v}]", pct / 100)
                for (s, layout, h, g), (pct, v) in sorted(best.items())]

    return cases


# ---- paged: experiments/bench/bench_paged.py rows

def paged_cases(min_batch: int) -> Callable[[List[dict]], List[Case]]:
    def cases(rows: List[dict]) -> List[Case]:
        out = []
        for r in rows:
            if int(r["B"]) >= min_batch:
                pool = f" {r['pool_order']}" if r.get("pool_order") else ""
                out.append((f"{r['k']}/{r['v']} {r['layout']}{pool} pages of {r['page_tokens']} {r['shape']} B={r['B']} T={r['T']}",
                            number(r, "paged_over_contiguous", r["_path"])))
        return out

    return cases


anywhere = lambda shape, b, t: True  # noqa: E731

# Issue 32 (decode and quantize speed) and 33 (paged caches): their "done when", set on the H100.
TARGETS = [
    Target("llama8b B=1 T=1K: int8-head and bf16 <= 0.8x cuDNN", "decode", 0.8, True,
           against_cudnn(("int8-head", "bf16"), lambda s, b, t: s == "llama8b" and b == 1 and t == 1024)),
    Target("smollm2 B=1: int8-head and bf16 <= 0.9x cuDNN", "decode", 0.9, True,
           against_cudnn(("int8-head", "bf16"), lambda s, b, t: s == "smollm2" and b == 1)),
    Target("llama8b B=8 T=1K: int8-head <= 0.7x cuDNN", "decode", 0.7, True,
           against_cudnn(("int8-head",), lambda s, b, t: s == "llama8b" and b == 8 and t == 1024)),
    Target("bf16 <= 1.0x cuDNN at every shape", "decode", 1.0, True, against_cudnn(("bf16",), anywhere)),
    Target("int4-head-asym <= 0.30x cuDNN at B >= 128", "decode", 0.30, True,
           against_cudnn(("int4-head-asym",), lambda s, b, t: b >= 128)),
    Target("int4-g32-asym <= 0.36x cuDNN at B >= 128", "decode", 0.36, True,
           against_cudnn(("int4-g32-asym",), lambda s, b, t: b >= 128)),
    Target("q5_0 / q5_1 / nvfp4 K within 1.1x of q4_1 at smollm2 B=64", "decode", 1.1, True,
           against_scheme(lambda s: "q4_1" if s in ("q5_0", "q5_1", "nvfp4") else None,
                          lambda s, b, t: s == "smollm2" and b == 64)),
    Target("+wW within 1.1x of its plain scheme at every seed000 batch", "decode", 1.1, True,
           against_scheme(window_plain, lambda s, b, t: s == "seed000")),
    Target("quantize per-head / per-group >= 85% of the copy", "quantize", 0.85, False,
           quantize_cases(r"int[48]-(head|g\d+)(-asym)?")),
    Target("quantize per-token >= 70% of the copy", "quantize", 0.70, False, quantize_cases(r"int[48]-token(-asym)?")),
    Target("quantize per-tensor (scale computed) >= 70% of the copy", "quantize", 0.70, False,
           quantize_cases(r"int[48]-tensor(-asym)?", given=False)),
    Target("quantize mxfp4 / nvfp4 >= 70% of the copy", "quantize", 0.70, False, quantize_cases(r"mxfp4|nvfp4")),
    Target("paged within 1.05x of contiguous at B >= 8", "paged", 1.05, True, paged_cases(8)),
]

NEEDED = {
    "decode": ("shape", "B", "HQ", "HKV", "T", "D", "kernel", "k_scheme", "v_scheme", "median_us"),
    "quantize": ("scheme", "layout", "HKV", "variant", "pct_of_copy"),
    "paged": ("layout", "shape", "B", "T", "k", "v", "page_tokens", "paged_over_contiguous"),
}


def report(sources: dict, targets: List[Target] = TARGETS, gpu: Optional[str] = None, every_case: bool = False,
           out=None) -> Tuple[int, int]:
    """Prints every target's verdict and its missed cases (every_case: the met ones too); returns
    (targets met, targets judged)."""
    out = out or sys.stdout
    met = judged = 0
    gpus = sorted({r["gpu"] for rows in sources.values() for r in rows if r.get("gpu")})
    if gpus:
        print(f"GPU: {', '.join(gpus)}" + (f" (targets set on the {gpu})" if gpu and gpus != [gpu] else ""), file=out)
    not_judged = []
    for t in targets:
        rows = sources.get(t.source)
        cases = t.cases(rows) if rows is not None else []
        if not cases:
            not_judged.append(f"  {t.name} ({'no case of it in' if rows is not None else 'no'} --{t.source}"
                              f"{'' if rows is not None else ' CSV'})")
            continue
        judged += 1
        failing = [c for c in cases if not t.met(c[1])]
        met += not failing
        worst = max(v for _, v in cases) if t.at_most else min(v for _, v in cases)
        print(f"\n{t.name}: {'MET' if not failing else 'NOT MET'} ({len(cases) - len(failing)} of {len(cases)} cases; "
              f"worst {worst:.3f}, median {statistics.median(v for _, v in cases):.3f})", file=out)
        for case, value in sorted(cases, key=lambda c: c[1], reverse=t.at_most):
            if every_case or not t.met(value):
                print(f"  {'ok  ' if t.met(value) else 'MISS'} {value:7.3f}  {case}", file=out)
    if not_judged:
        print("\nNot judged:\n" + "\n".join(not_judged), file=out)
    print(f"\n{met} of {judged} targets judged are met ({len(not_judged)} not judged)", file=out)
    return met, judged


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decode", help="kvq bench CSV (with cuDNN in the same run)")
    ap.add_argument("--quantize", help="kvq bench-quantize CSV")
    ap.add_argument("--input", default=KEY_DEFAULTS["input"],
                    help="the bench-quantize input whose rows are judged (default uniform: the targets were set on it)")
    ap.add_argument("--paged", help="bench_paged.py CSV")
    ap.add_argument("--gpu", default="NVIDIA H100 80GB HBM3", help="the GPU the targets were set on")
    ap.add_argument("--all", action="store_true", help="list the cases that meet their target too")
    a = ap.parse_args(argv)
    sources = {}
    for name in ("decode", "quantize", "paged"):
        path = getattr(a, name)
        if path:
            sources[name] = read_rows(path, NEEDED[name])
    if "quantize" in sources:  # one input's rows: the same case timed on two inputs is two verdicts
        rows = sources["quantize"]
        sources["quantize"] = [r for r in rows if bench_input(r) == a.input]
        if rows and not sources["quantize"]:
            found = ", ".join(sorted({bench_input(r) for r in rows}))
            ap.error(f"{a.quantize}: no rows of input {a.input!r} (it holds {found})")
        print(f"quantize: the rows of input {a.input}")
    if not sources:
        ap.error("give at least one of --decode, --quantize, --paged")
    report(sources, gpu=a.gpu, every_case=a.all)
    return 0


if __name__ == "__main__":
    sys.exit(main())
