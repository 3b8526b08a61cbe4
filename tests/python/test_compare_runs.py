"""experiments/bench/compare_runs.py: the device script's regression check against committed runs."""
import csv
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "experiments", "bench"))
import compare_runs  # noqa: E402

DECODE = ["shape", "B", "HQ", "HKV", "T", "D", "kernel", "k_scheme", "v_scheme", "layout", "splits", "median_us", "gpu",
          "commit"]
GPU = "NVIDIA H100 80GB HBM3"


def decode_row(kernel, scheme, us, commit, splits=4, b=32, layout="planar", gpu=GPU):
    return dict(zip(DECODE, ["seed000", b, 8, 1, 8192, 128, kernel, scheme, scheme, layout, splits, us, gpu, commit]))


def write(path, rows, header=DECODE):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows(rows)


def git(repo, *args, date="2026-01-01T00:00:00"):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})


def test_flags_rows_against_the_newest_committed_run(tmp_path, capsys):
    repo = tmp_path / "repo"
    results = repo / "results"
    git(tmp_path, "init", "-q", str(repo))
    # the older run (its directory name sorts last, so only git's order can put it first)
    write(results / "gpu" / "zz-old" / "decode.csv", [decode_row("decode-tc", "int8-head", 100.0, "aaa"),
                                                      decode_row("decode-tc", "int4-head-asym", 50.0, "aaa")])
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "old")
    write(results / "gpu" / "aa-new" / "decode.csv", [decode_row("decode-tc", "int8-head", 80.0, "bbb"),
                                                      decode_row("cudnn", "bf16", 60.0, "bbb", splits=0),
                                                      decode_row("decode-tc", "int8-head", 10.0, "bbb", gpu="A100")])
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "new", date="2026-02-01T00:00:00")
    new = tmp_path / "run" / "decode.csv"
    write(new, [decode_row("decode-tc", "int8-head", 90.0, "ccc"),           # vs 80 (newest), not 100: +12.5 %
                decode_row("decode-tc", "int4-head-asym", 51.0, "ccc"),      # vs 50: +2 %, within 5 %
                decode_row("cudnn", "bf16", 50.0, "ccc", splits=0),          # vs 60: -16.7 %
                decode_row("decode-tc", "bf16", 70.0, "ccc", splits=3)])     # no committed row
    assert compare_runs.main([str(new), "--results", str(results), "--csv-out", str(tmp_path / "flagged.csv")]) == 0
    out = capsys.readouterr().out
    assert "3 compared, 1 more than 5% slower, 1 more than 5% faster (1 without a committed row, 0 ambiguous" in out
    assert "[SLOWER] decode decode-tc int8-head seed000/B32/T8192 splits=4: 80.0 -> 90.0 us (+12.5%; bbb gpu/aa-new" in out
    assert "[FASTER] decode cudnn bf16 seed000/B32/T8192: 60.0 -> 50.0 us (-16.7%; bbb" in out
    flagged = list(csv.DictReader(open(tmp_path / "flagged.csv")))
    assert [(r["old_commit"], r["new_commit"]) for r in flagged] == [("bbb", "ccc"), ("bbb", "ccc")]


def test_a_changed_split_heuristic_is_compared_and_named(tmp_path, capsys):
    results = tmp_path / "results"
    write(results / "gpu" / "run" / "decode.csv", [decode_row("decode-tc", "int8-head", 100.0, "aaa", splits=8)])
    new = tmp_path / "decode.csv"
    write(new, [decode_row("decode-tc", "int8-head", 120.0, "bbb", splits=6)])
    compare_runs.main([str(new), "--results", str(results)])
    out = capsys.readouterr().out
    assert "100.0 -> 120.0 us (+20.0%" in out and "[splits 8 -> 6]" in out


def test_rows_a_file_holds_twice_are_ambiguous(tmp_path, capsys):
    header = [c for c in DECODE if c != "layout"]  # an old file: FBGEMM rows and planar look alike
    rows = [{k: v for k, v in decode_row("decode-tc", "int4-head-asym", us, "aaa").items() if k != "layout"}
            for us in (50.0, 70.0)]
    write(tmp_path / "results" / "old" / "decode.csv", rows, header)
    new = tmp_path / "decode.csv"
    write(new, [{k: v for k, v in decode_row("decode-tc", "int4-head-asym", 90.0, "b").items() if k != "layout"}],
          header)
    compare_runs.main([str(new), "--results", str(tmp_path / "results")])
    assert "0 compared, 0 more than 5% slower, 0 more than 5% faster (0 without a committed row, 1 ambiguous" in \
        capsys.readouterr().out


def test_bad_inputs(tmp_path, capsys):
    assert compare_runs.main([str(tmp_path / "absent.csv")]) == 2
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    assert compare_runs.main([str(tmp_path / "x.csv")]) == 2
    assert "not a kvq bench or bench-quantize CSV" in capsys.readouterr().err
    for threshold in ("nan", "-0.05"):  # NaN flagged no row at all
        with pytest.raises(SystemExit):
            compare_runs.main([str(tmp_path / "x.csv"), "--threshold", threshold])
        assert f"--threshold {float(threshold):g}: expected a finite fraction >= 0" in capsys.readouterr().err


def test_a_tree_without_git_orders_runs_by_the_written_times(tmp_path, capsys):
    repo = tmp_path / "repo"
    results = repo / "results"
    git(tmp_path, "init", "-q", str(repo))
    write(results / "gpu" / "zz-old" / "decode.csv", [decode_row("decode-tc", "int8-head", 100.0, "aaa")])
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "old")
    write(results / "gpu" / "aa-new" / "decode.csv", [decode_row("decode-tc", "int8-head", 80.0, "bbb")])
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "new", date="2026-02-01T00:00:00")
    times = results / ".run_times.json"
    assert compare_runs.main(["--results", str(results), "--write-times", str(times)]) == 0
    assert "2 committed runs" in capsys.readouterr().out
    # the tree as a GPU machine gets it: no .git; the written times still pick aa-new (80 us)
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(results), str(copy)], check=True)
    new = tmp_path / "run" / "decode.csv"
    write(new, [decode_row("decode-tc", "int8-head", 90.0, "ccc")])
    assert compare_runs.main([str(new), "--results", str(copy)]) == 0
    out = capsys.readouterr().out
    assert "80.0 -> 90.0 us" in out and "warning" not in out
    # without the times: ordered by path (zz-old last, 100 us), and the report says so
    os.remove(copy / ".run_times.json")
    assert compare_runs.main([str(new), "--results", str(copy)]) == 0
    out = capsys.readouterr().out
    assert "100.0 -> 90.0 us" in out
    assert "warning: 2 committed runs on NVIDIA H100 80GB HBM3 have no known time" in out


QUANTIZE = ["B", "HKV", "T", "D", "input_dtype", "scheme", "layout", "variant", "median_us", "gpu", "commit"]


def test_quantize_rows_before_the_tensor_scale_column_count_as_computed(tmp_path, capsys):
    results = tmp_path / "results"

    def row(variant, us, commit, scale=None):
        r = dict(zip(QUANTIZE, [128, 1, 8192, 128, "bfloat16", "int8-tensor", "planar", variant, us, GPU, commit]))
        if scale:
            r["tensor_scale"] = scale
        return r

    write(results / "gpu" / "old" / "quantize_bandwidth.csv", [row("quantize-tensor2pass", 100.0, "aaa")], QUANTIZE)
    new = tmp_path / "run" / "quantize_bandwidth.csv"
    write(new, [row("quantize-tensor2pass", 120.0, "bbb", "computed"),  # the old row, +20 %
                row("quantize-tensor2pass", 60.0, "bbb", "given")],      # a row of its own: nothing to compare
          QUANTIZE + ["tensor_scale"])
    assert compare_runs.main([str(new), "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "1 compared, 1 more than 5% slower" in out
    assert "[SLOWER] quantize quantize-tensor2pass int8-tensor planar bfloat16 B128 Hkv1: 100.0 -> 120.0 us" in out
    assert "(given scale)" not in out


def test_quantize_rows_of_another_input_are_cases_of_their_own(tmp_path, capsys):
    results = tmp_path / "results"

    def row(us, commit, values=None):
        r = dict(zip(QUANTIZE, [128, 1, 8192, 128, "bfloat16", "int8-head", "planar", "quantize-groupthread", us, GPU,
                                commit]))
        if values:
            r["input"] = values
        return r

    write(results / "gpu" / "old" / "quantize_bandwidth.csv", [row(100.0, "aaa")], QUANTIZE)  # before --input: uniform
    new = tmp_path / "run" / "quantize_bandwidth.csv"
    write(new, [row(100.0, "bbb", "uniform"), row(150.0, "bbb", "gaussian-rows")], QUANTIZE + ["input"])
    assert compare_runs.main([str(new), "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "1 compared, 0 more than 5% slower" in out  # the Gaussian row has no committed row to meet
    write(results / "gpu" / "mid" / "quantize_bandwidth.csv", [row(100.0, "bbb", "gaussian-rows")], QUANTIZE + ["input"])
    assert compare_runs.main([str(new), "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "[SLOWER] quantize quantize-groupthread int8-head planar bfloat16 gaussian-rows B128 Hkv1: 100.0 -> 150.0 us" in out


def test_slower_rows_say_whether_the_runs_spreads_are_apart(tmp_path, capsys):
    header = DECODE + ["p10_us", "p90_us"]
    spread = lambda row, lo, hi: {**row, "p10_us": lo, "p90_us": hi}  # noqa: E731
    results = tmp_path / "results"
    write(results / "gpu" / "old" / "decode.csv", [spread(decode_row("decode-tc", "int8-head", 10.0, "aaa"), 9.7, 10.3),
                                                   spread(decode_row("decode-tc", "int4-head-asym", 9.6, "aaa"), 9.2, 10.1),
                                                   decode_row("decode-tc", "bf16", 9.0, "aaa")], header)
    new = tmp_path / "run" / "decode.csv"
    write(new, [spread(decode_row("decode-tc", "int8-head", 11.5, "bbb"), 10.6, 11.7),       # 10.6 > 10.3: apart
                spread(decode_row("decode-tc", "int4-head-asym", 10.4, "bbb"), 9.7, 10.7),   # 9.7 <= 10.1: overlap
                spread(decode_row("decode-tc", "bf16", 10.0, "bbb"), 9.5, 10.5)], header)     # the old row has none
    assert compare_runs.main([str(new), "--results", str(results), "--csv-out", str(tmp_path / "flagged.csv")]) == 0
    out = capsys.readouterr().out
    assert "of the slower rows, 1 with p10-p90 ranges apart from the committed run's" in out
    assert "int8-head seed000/B32/T8192 splits=4: 10.0 -> 11.5 us (+15.0%; aaa gpu/old/decode.csv -> bbb) [p10-p90 apart]" in out
    assert "int4-head-asym seed000/B32/T8192 splits=4: 9.6 -> 10.4 us (+8.3%; aaa gpu/old/decode.csv -> bbb) [p10-p90 overlap]" in out
    assert "bf16 seed000/B32/T8192 splits=4: 9.0 -> 10.0 us (+11.1%; aaa gpu/old/decode.csv -> bbb)\n" in out + "\n"
    flagged = {r["case"].split()[2]: r["p10_p90"] for r in csv.DictReader(open(tmp_path / "flagged.csv"))}
    assert flagged == {"int8-head": "apart", "int4-head-asym": "overlap", "bf16": ""}
