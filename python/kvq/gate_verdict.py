"""The gate's verdict and reports: DESIGN.md's tolerance rule over a kernel's O and LSE (exactly as
check_tolerance in experiments/gate/validate_decode.cpp), and the per-case and per-kernel reports,
printed and written as `kvq validate --report` writes them. kvq.gate re-exports every public name."""
import json
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ._core import __version__, round_to_format

__all__ = ["Tolerance", "tolerance", "bf16_noise", "CaseReport", "GateReport"]


def _index(flat, shape, batch_ids=None):
    """Index of a flat position; batch_ids: the sequence each batch row stands for (rows not judged left out)."""
    index = [int(i) for i in np.unravel_index(flat, shape)]
    if batch_ids is not None and index:
        index[0] = int(batch_ids[index[0]])
    return index


def _bf16(x):
    return np.asarray(round_to_format(np.asarray(x, np.float32), "bf16"), np.float64)


def bf16_noise(r):
    """FlashAttention's atol, as in the C++ gate: bf16's rounding noise at r, |bf16(bf16(r+0.3)-0.3) - r|."""
    r = np.asarray(r, np.float64)
    return np.abs(_bf16(_bf16(r + 0.3) - 0.3) - r)


@dataclass
class Tolerance:
    ok: bool
    detail: str
    max_err: float = 0.0
    max_bound: float = 0.0
    mean_err: float = 0.0
    mean_bound: float = 0.0
    lse_err: float = 0.0
    lse_bound: float = 0.0
    worst: Optional[tuple] = None  # (index into O [B, Hq, D], O value, reference value)
    problem: str = ""


def tolerance(o, lse, ref_o, ref_lse, mimic_o, mimic_lse, batch_ids=None):
    """DESIGN.md's rule, exactly as check_tolerance (experiments/gate/validate_decode.cpp): O within
    2 x the mimic's max and mean error + floor (2 x bf16 noise at the reference), LSE within 2 x the
    mimic's + 8 fp32 ulps at max(|LSE|, 1); O finite; empty key sets give O = 0 and LSE = -inf exactly.
    lse None: the kernel returns no LSE (only O is judged). batch_ids: the sequence of each row, for messages."""
    shape = ref_o.shape
    out = np.asarray(o, np.float64).reshape(-1)
    ref, mimic = np.asarray(ref_o, np.float64).reshape(-1), np.asarray(mimic_o, np.float64).reshape(-1)
    n, rows = ref.size, ref_lse.size
    d = n // rows if rows else 0
    problem = ""
    err = np.abs(out - ref)
    bad = np.flatnonzero(~np.isfinite(out))
    if bad.size:
        problem = f"O{_index(bad[0], shape, batch_ids)} = {out[bad[0]]} (ref {ref[bad[0]]:.6g})"
    max_err = float(np.nanmax(err)) if n and not np.isnan(err).all() else 0.0
    mean_err = float(err.sum() / n) if n else 0.0
    mimic_max = float(np.max(np.abs(mimic - ref))) if n else 0.0
    mimic_mean = float(np.abs(mimic - ref).sum() / n) if n else 0.0
    floor = float(2 * bf16_noise(ref).max()) if n else 0.0
    r_lse = np.asarray(ref_lse, np.float64).reshape(-1)
    k_lse = None if lse is None else np.asarray(lse, np.float64).reshape(-1)
    empty = np.isinf(r_lse)
    for r in np.flatnonzero(empty):  # no keys: exactly O = 0 and LSE = -inf
        zero = bool(np.all(out[r * d:(r + 1) * d] == 0.0)) and (k_lse is None or k_lse[r] == -np.inf)
        if not zero and not problem:
            what = "O != 0" if k_lse is None else f"O != 0 or LSE = {k_lse[r]}"
            problem = f"row {_index(r, ref_lse.shape, batch_ids)} has no keys but {what}"
    lse_err = lse_bound = 0.0
    if k_lse is not None:
        keep = ~empty
        e = np.abs(k_lse[keep] - r_lse[keep])
        lse_err = float(np.nanmax(e)) if e.size and not np.isnan(e).all() else 0.0
        nonfinite = np.flatnonzero(keep & ~np.isfinite(k_lse))
        if nonfinite.size and not problem:
            problem = f"LSE{_index(nonfinite[0], ref_lse.shape, batch_ids)} = {k_lse[nonfinite[0]]}"
        lse_mimic = float(np.max(np.abs(np.asarray(mimic_lse).reshape(-1)[keep] - r_lse[keep]))) if keep.any() else 0.0
        lse_scale = float(np.max(np.abs(r_lse[keep]))) if keep.any() else 0.0
        lse_bound = 2 * lse_mimic + 8 * np.ldexp(max(lse_scale, 1.0), -23)
    max_bound, mean_bound = 2 * mimic_max + floor, 2 * mimic_mean + floor
    ok = (not problem and max_err <= max_bound and mean_err <= mean_bound
          and (k_lse is None or lse_err <= lse_bound))
    worst = None
    if n:
        i = int(bad[0]) if bad.size else int(np.nanargmax(err))
        worst = (tuple(_index(i, shape, batch_ids)), float(out[i]), float(ref[i]))

    def cmp(a, b):
        return "<=" if a <= b else ">"
    detail = (f"max |O-ref| {max_err:.3g} {cmp(max_err, max_bound)} {max_bound:.3g}, mean {mean_err:.3g} "
              f"{cmp(mean_err, mean_bound)} {mean_bound:.3g} (mimic {mimic_max:.3g}/{mimic_mean:.3g}, "
              f"floor {floor:.3g}); ")
    detail += ("LSE not returned (declared)" if k_lse is None else
               f"max |LSE-ref| {lse_err:.3g} {cmp(lse_err, lse_bound)} {lse_bound:.3g}")
    if worst and not ok and not bad.size:  # (a non-finite O is the problem, named below)
        detail += f"; worst O{list(worst[0])} = {worst[1]:.6g} vs ref {worst[2]:.6g}"
    if problem:
        detail += "; " + problem
    return Tolerance(ok, detail, max_err, max_bound, mean_err, mean_bound, lse_err, lse_bound, worst, problem)


# ---- reports ----

@dataclass
class CaseReport:
    family: str
    name: str
    shape: str
    scheme: str
    dtype: str
    layout: str
    status: str = "OK"  # "OK", "FAIL", "REFUSED" (the kernel said it does not take the case) or "SKIP"
    detail: str = ""
    values: int = 0
    tolerance: Optional[Tolerance] = None

    @property
    def label(self):
        return f"{self.name} {self.shape}"

    @property
    def ok(self):
        return self.status != "FAIL"

    @property
    def skipped(self):
        return self.status == "SKIP"

    @property
    def worst(self):
        return self.tolerance.worst if self.tolerance else None

    def line(self, kernel_name):
        tag = {"OK": "[OK]  ", "FAIL": "[FAIL]", "SKIP": "[SKIP]", "REFUSED": "[REFUSED]"}[self.status]
        return f"{tag} {kernel_name} {self.name} {self.scheme} {self.shape}: {self.detail}"

    def to_json(self, kernel_name):
        """kvq validate's case fields (experiments/gate/validate_quantize.cpp to_json) and the gate's own."""
        j = {"variant": kernel_name, "case": self.name, "scheme": self.scheme, "dtype": self.dtype,
             "layout": self.layout, "shape": self.shape, "values": self.values, "ok": self.ok,
             "skipped": self.skipped, "detail": self.detail, "family": self.family, "status": self.status}
        t = self.tolerance
        if t is not None:
            def number(x):  # JSON has no NaN or inf: null, as kvq validate's nlohmann::json writes them
                return float(x) if np.isfinite(x) else None
            j["error"] = {"max": number(t.max_err), "mean": number(t.mean_err), "lse": number(t.lse_err)}
            j["bound"] = {"max": number(t.max_bound), "mean": number(t.mean_bound), "lse": number(t.lse_bound)}
            if t.worst:
                j["worst"] = {"index": list(t.worst[0]), "value": number(t.worst[1]), "reference": number(t.worst[2])}
        return j


@dataclass
class GateReport:
    kernel: str
    declarations: dict
    k: str
    v: str
    device: str
    cases: list = field(default_factory=list)

    @property
    def ok(self):
        return all(c.ok for c in self.cases)

    def with_status(self, status):
        return [c for c in self.cases if c.status == status]

    def families(self, status):
        """The families with at least one case of this status."""
        return {c.family for c in self.cases if c.status == status}

    def summary(self):
        failed, skipped, refused = (len(self.with_status(s)) for s in ("FAIL", "SKIP", "REFUSED"))
        values = sum(c.values for c in self.cases if not c.skipped)
        return (f"{'[FAIL]' if failed else '[OK]  '} {self.kernel}: {len(self.cases) - skipped - refused} cases, "
                f"{failed} failed, {refused} refused by the kernel, {skipped} skipped (outside its declarations), "
                f"{values} outputs checked")

    def to_json(self):
        """The document `kvq validate --report` writes (gpu, dump, variants, cases), for the CPU."""
        failed, skipped, refused = (len(self.with_status(s)) for s in ("FAIL", "SKIP", "REFUSED"))
        return {"gpu": _gpu_info() if self.device == "cuda" else None, "dump": None,
                "gate": {"device": self.device, "kvq_version": __version__, "k": self.k, "v": self.v,
                         "kernel": self.kernel, "declarations": self.declarations},
                "variants": [{"variant": self.kernel, "cases": len(self.cases) - skipped - refused, "failed": failed,
                              "skipped": skipped, "refused": refused,
                              "values_checked": sum(c.values for c in self.cases if not c.skipped)}],
                "cases": [c.to_json(self.kernel) for c in self.cases]}

    def write(self, path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=2, allow_nan=False)
            f.write("\n")


def _gpu_info():
    """The GPU fields of kvq validate's report that torch can tell."""
    import torch
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"name": p.name, "sm_count": p.multi_processor_count, "compute_capability": f"{p.major}.{p.minor}",
            "torch": torch.__version__, "cuda_runtime": torch.version.cuda}
