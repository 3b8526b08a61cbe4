"""experiments/eval/compare_evals.py: two kvq eval runs held to a tolerance (the GPU engine against
the CPU path, two GPUs against one)."""
import csv
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "experiments", "eval"))
import compare_evals  # noqa: E402


def write(path, kld_by_pair):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["k_scheme", "v_scheme", *compare_evals.KEYS])
        w.writeheader()
        for (k, v), kld in kld_by_pair.items():
            w.writerow({"k_scheme": k, "v_scheme": v, "kld_mean": kld, "kld_max": 1.0, "ppl_delta": 0.1,
                        "top1_agreement": 0.9, "out_rel_l2_mean": 0.01})
    return str(path)


def test_pairs_agree_within_the_tolerance_and_nan_never_does(tmp_path, capsys):
    a = write(tmp_path / "a.csv", {("int8-head", "int8-head"): 1e-3, ("q4_0", "q8_0"): 2e-2, ("fp8-e4m3", "fp8-e4m3"): "inf",
                                   ("int4-g32-asym", "int4-g32-asym"): 5e-2})
    b = write(tmp_path / "b.csv", {("int8-head", "int8-head"): 1.005e-3, ("q4_0", "q8_0"): "nan",
                                   ("fp8-e4m3", "fp8-e4m3"): "inf", ("int4-g32-asym", "int4-g32-asym"): 6e-2})
    assert compare_evals.main([a, b]) == 1
    out = capsys.readouterr().out
    assert "ok   int8-head" in out and "ok   fp8-e4m3" in out  # 0.5 % apart; equal infinities
    assert "DIFF q4_0                     q8_0                   KLD 2.000000e-02 vs nan (worst rel diff inf) kld_mean: 0.02 vs nan" in out
    assert "DIFF int4-g32-asym" in out and "kld_mean: 0.05 vs 0.06" in out
    assert "2 of 4 pairs agree within 0.01 relative" in out


@pytest.mark.parametrize("option,value", [("--rel", "-0.01"), ("--abs", "nan"), ("--rel", "inf")])
def test_a_tolerance_that_would_pass_or_fail_everything_is_refused(tmp_path, capsys, option, value):
    a = write(tmp_path / "a.csv", {("int8-head", "int8-head"): 1e-3})
    with pytest.raises(SystemExit) as e:
        compare_evals.main([a, a, option, value])
    assert e.value.code == 2 and f"{option} {float(value):g}: expected a finite tolerance >= 0" in capsys.readouterr().err


def test_runs_with_no_pairs_or_a_pair_twice_are_refused(tmp_path, capsys):
    empty = write(tmp_path / "empty.csv", {})  # a header only: "0 of 0 pairs agree" would pass on nothing
    assert compare_evals.main([empty, empty]) == 2
    err = capsys.readouterr().err
    assert f"compare_evals: error: {empty}: no pairs (only a header): nothing to compare" in err
    a = write(tmp_path / "a.csv", {("int8-head", "int8-head"): 1e-3, ("q4_0", "q8_0"): 2e-2})
    twice = tmp_path / "twice.csv"
    lines = open(a).read().splitlines()
    # a stale row first: the old reader kept the last one and passed
    twice.write_text("\n".join([lines[0], lines[1].replace("0.001", "0.5")] + lines[1:]) + "\n")
    assert compare_evals.main([a, str(twice), "--csv-out", str(tmp_path / "cmp.csv")]) == 2
    err = capsys.readouterr().err
    assert (f"{twice}: line 3: the pair K int8-head / V int8-head is listed twice (first on line 2; expected kvq "
            "eval's eval.csv, one row per pair)") in err
    assert not (tmp_path / "cmp.csv").exists()
