"""experiments/bench/targets.py: speed targets judged from one run's CSVs."""
import csv
import io
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "experiments", "bench"))
import targets  # noqa: E402

SHAPES = {"seed000": (8, 1, 128), "llama8b": (32, 8, 128), "smollm2": (9, 3, 64)}


def decode_row(kernel, scheme, us, shape="seed000", b=128, t=8192, v=None, layout="", vs_cudnn=""):
    hq, hkv, d = SHAPES[shape]
    return {"shape": shape, "B": str(b), "HQ": str(hq), "HKV": str(hkv), "T": str(t), "D": str(d), "kernel": kernel,
            "k_scheme": scheme, "v_scheme": v or scheme, "layout": layout, "median_us": str(us), "vs_cudnn": vs_cudnn,
            "gpu": "NVIDIA H100 80GB HBM3", "_path": "decode.csv"}


def judged(target_name, rows):
    (t,) = [t for t in targets.TARGETS if t.name.startswith(target_name)]
    return t, sorted(t.cases(rows))


def test_decode_ratios_come_from_cudnn_in_the_same_run():
    rows = [decode_row("cudnn", "bf16", 100.0), decode_row("decode-tc", "int4-head-asym", 29.0),
            decode_row("decode-tc", "int4-head-asym", 50.0, layout="fbgemm-rows"),  # FBGEMM's rows: another kernel
            decode_row("cudnn", "bf16", 10.0, b=32), decode_row("decode-tc", "int4-head-asym", 9.0, b=32)]  # B < 128
    t, cases = judged("int4-head-asym", rows)
    assert cases == [("int4-head-asym seed000 B=128 T=8192", 0.29)]
    assert t.met(0.29) and not t.met(0.31)


def test_the_vs_cudnn_column_wins_and_rows_without_a_peer_are_not_judged():
    rows = [decode_row("decode-tc", "bf16", 120.0, vs_cudnn="0.950"), decode_row("decode-tc", "bf16", 50.0, b=64)]
    _, cases = judged("bf16", rows)
    assert cases == [("bf16 seed000 B=128 T=8192", 0.95)]


def test_windows_against_their_plain_scheme_at_seed000_only():
    rows = [decode_row("decode-tc", "int4-g32-asym", 100.0, b=b) for b in (32, 512)]
    rows += [decode_row("decode-tc", "int4-g32-asym+w128", us, b=b) for b, us in ((32, 118.0), (512, 104.0))]
    rows += [decode_row("decode-tc", "int4-g32-asym", 10.0, shape="llama8b", b=1, t=1024),
             decode_row("decode-tc", "int4-g32-asym+w128", 20.0, shape="llama8b", b=1, t=1024)]
    t, cases = judged("+wW", rows)
    assert [(c, round(v, 3)) for c, v in cases] == [
        ("int4-g32-asym+w128 seed000 B=32 T=8192 / int4-g32-asym", 1.18),
        ("int4-g32-asym+w128 seed000 B=512 T=8192 / int4-g32-asym", 1.04)]
    assert [t.met(v) for _, v in cases] == [False, True]


def test_block_formats_against_q4_1_at_smollm2_b64():
    rows = [decode_row("decode-tc", s, us, shape="smollm2", b=64) for s, us in
            (("q4_1", 80.0), ("q5_0", 84.0), ("q5_1", 100.0), ("nvfp4", 85.0), ("q8_0", 200.0))]
    rows.append(decode_row("decode-tc", "q5_0", 90.0, shape="smollm2", b=64, v="q8_0"))  # a mixed pair: not this target
    _, cases = judged("q5_0", rows)
    assert [(c, v) for c, v in cases] == [("nvfp4 smollm2 B=64 T=8192 / q4_1", 85 / 80),
                                          ("q5_0 smollm2 B=64 T=8192 / q4_1", 84 / 80),
                                          ("q5_1 smollm2 B=64 T=8192 / q4_1", 100 / 80)]


def quantize_row(scheme, variant, pct, hkv=8, layout="planar", scale="computed"):
    return {"scheme": scheme, "layout": layout, "HKV": str(hkv), "variant": variant, "tensor_scale": scale,
            "pct_of_copy": str(pct), "gpu": "NVIDIA H100 80GB HBM3", "_path": "q.csv"}


def test_quantize_takes_each_case_fastest_variant():
    rows = [quantize_row("int8-head", "quantize-generic", 9.1), quantize_row("int8-head", "quantize-groupthread", 86.0),
            quantize_row("int8-tensor", "quantize-tensor2pass", 71.0),
            quantize_row("int8-tensor", "quantize-tensor2pass", 110.0, scale="given")]
    t, cases = judged("quantize per-head", rows)
    assert cases == [("int8-head planar Hkv=8 [quantize-groupthread]", 0.86)] and t.met(0.86)
    _, cases = judged("quantize per-tensor", rows)
    assert cases == [("int8-tensor planar Hkv=8 [quantize-tensor2pass]", 0.71)]  # the given scale's row is another case


def test_quantize_targets_judge_one_input_uniform_by_default(tmp_path, capsys):
    faster = dict(quantize_row("int8-head", "quantize-groupthread", 99.0), input="gaussian-rows")
    rows = [quantize_row("int8-head", "quantize-groupthread", 80.0), faster]
    path = tmp_path / "q.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k in faster if not k.startswith("_")])
        w.writeheader()
        for r in rows:  # the uniform row's input left empty, as in runs before the column
            w.writerow({k: v for k, v in r.items() if not k.startswith("_")})
    targets.main(["--quantize", str(path), "--all"])
    out = capsys.readouterr().out
    assert "0.800  int8-head planar Hkv=8" in out and "0.990" not in out  # the uniform row, not the faster one
    targets.main(["--quantize", str(path), "--all", "--input", "gaussian-rows"])
    out = capsys.readouterr().out
    assert "0.990  int8-head planar Hkv=8" in out and "0.800" not in out
    with pytest.raises(SystemExit):
        targets.main(["--quantize", str(path), "--input", "normal"])
    assert "no rows of input 'normal' (it holds gaussian-rows, uniform)" in capsys.readouterr().err


def test_paged_from_batch_8():
    rows = [{"layout": "nhd", "pool_order": "shuffled", "shape": "seed000", "B": str(b), "T": "8192", "k": "int8-head",
             "v": "int8-head", "page_tokens": "16", "paged_over_contiguous": str(r), "_path": "p.csv"}
            for b, r in ((1, 1.30), (8, 1.04), (64, 1.06))]
    t, cases = judged("paged", rows)
    assert {c.split()[-2]: (v, t.met(v)) for c, v in cases} == {"B=8": (1.04, True), "B=64": (1.06, False)}


def test_report_verdicts_and_what_is_not_judged():
    rows = [decode_row("cudnn", "bf16", 100.0), decode_row("decode-tc", "bf16", 99.0),
            decode_row("cudnn", "bf16", 10.0, shape="llama8b", b=1, t=1024),
            decode_row("decode-tc", "bf16", 9.0, shape="llama8b", b=1, t=1024)]
    out = io.StringIO()
    met, n = targets.report({"decode": rows}, out=out)
    text = out.getvalue()
    assert (met, n) == (1, 2)
    assert "bf16 <= 1.0x cuDNN at every shape: MET (2 of 2 cases" in text
    assert "llama8b B=1 T=1K: int8-head and bf16 <= 0.8x cuDNN: NOT MET (0 of 1 cases" in text
    assert "  MISS   0.900  bf16 llama8b B=1 T=1024" in text
    assert "  quantize per-token >= 70% of the copy (no --quantize CSV)" in text
    assert "  smollm2 B=1: int8-head and bf16 <= 0.9x cuDNN (no case of it in --decode)" in text
    assert text.endswith("1 of 2 targets judged are met (11 not judged)\n")


def test_a_csv_of_another_tool_is_refused_by_name(tmp_path):
    path = tmp_path / "wrong.csv"
    path.write_text("scheme,median_us\nint8-head,1.0\n")
    with pytest.raises(SystemExit, match=r"wrong.csv: no column shape, B, HQ"):
        targets.main(["--decode", str(path)])


def test_a_committed_run_reads_as_its_own_vs_cudnn_column(capsys):
    path = os.path.join(ROOT, "experiments", "results", "nvidia-h200", "decode-vs-cudnn", "decode.csv")
    with open(path, newline="") as f:
        want = {(r["shape"], r["B"], r["T"]): float(r["vs_cudnn"]) for r in csv.DictReader(f)
                if r["kernel"] == "decode-tc" and r["k_scheme"] == "int4-head-asym" and int(r["B"]) >= 128}
    assert want
    _, cases = judged("int4-head-asym", targets.read_rows(path, targets.NEEDED["decode"]))
    assert sorted(v for _, v in cases) == sorted(want.values())
    targets.main(["--decode", path])
    out = capsys.readouterr().out
    assert out.startswith("GPU: NVIDIA H200 (targets set on the NVIDIA H100 80GB HBM3)")
