"""kvq plan / sweep --shard / merge against single-process runs (no Slurm: the shards run here one
after another), a shard killed mid-run, and the errors of the merge. KVQ_BIN names the kvq binary."""
import csv
import json
import os
import signal
import subprocess
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUNDLED = os.path.relpath(os.path.join(ROOT, "data", "dumps", "stories260k.h5"))
HOST_FIELDS = {"hostname", "cpu", "threads", "time_utc"}


def binary():
    return os.environ.get("KVQ_BIN", os.path.join(ROOT, "build", "experiments", "kvq"))


def kvq(*args, check=True):
    r = subprocess.run([binary(), *map(str, args)], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"kvq {' '.join(map(str, args))}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def assert_same_sweep(merged, single):
    for name in ("sweep.csv", "sweep_heads.csv"):
        with open(os.path.join(merged, name), "rb") as a, open(os.path.join(single, name), "rb") as b:
            assert a.read() == b.read(), name
    records = [[{k: v for k, v in r.items() if k not in HOST_FIELDS} for r in json.load(open(os.path.join(d, "sweep.json")))]
               for d in (merged, single)]
    assert records[0] == records[1]


def run_study(study, shards, *plan_args):
    kvq("plan", "sweep", *plan_args, "--shards", shards, "--out", study)
    for i in range(shards):
        kvq("sweep", "--plan", study / "plan.json", "--shard", i, "--out", study / "shards" / str(i))
    kvq("merge", *[study / "shards" / str(i) for i in range(shards)], "--out", study / "results")
    return study / "results"


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    kvq("sweep", BUNDLED, "--no-latency", "--out", out)
    return out


@pytest.mark.parametrize("shards", [1, 3, 7])
def test_any_number_of_shards_merges_to_the_single_run(tmp_path, single, shards):
    merged = run_study(tmp_path / "study", shards, BUNDLED)
    assert_same_sweep(merged, single)
    manifest = json.load(open(merged / "manifest.json"))
    assert manifest["units"] == 110 and len({u["unit"] for u in manifest["unit_runs"]}) == 110


def test_a_study_of_two_dumps_keeps_each_rows_dump_index(tmp_path):
    dumps = [tmp_path / "a.h5", tmp_path / "b.h5"]
    for seed, dump in enumerate(dumps):
        kvq("synth", "--out", dump, "--layers", 2, "--tokens", 64, "--seed", 3 + seed)
    schemes = ("--k", "int8-head,int4-head", "--v", "int8-head")
    single = tmp_path / "single"
    kvq("sweep", *dumps, *schemes, "--no-latency", "--out", single)
    merged = run_study(tmp_path / "study", 3, *dumps, *schemes)
    assert_same_sweep(merged, single)
    with open(merged / "sweep.csv") as f:
        assert [r["dump"] for r in csv.DictReader(f)] == ["0"] * 4 + ["1"] * 4


def test_shard_without_a_plan_file_runs_the_same_units(tmp_path):
    kvq("plan", "sweep", BUNDLED, "--layers", "1,3", "--k", "int8-head,int4-head", "--v", "int8-head", "--shards", 2,
        "--out", tmp_path / "planned")
    kvq("sweep", BUNDLED, "--layers", "1,3", "--k", "int8-head,int4-head", "--v", "int8-head", "--shard", "1/2",
        "--out", tmp_path / "direct")
    assert json.load(open(tmp_path / "direct" / "plan.json")) == json.load(open(tmp_path / "planned" / "plan.json"))
    assert sorted(os.listdir(tmp_path / "direct" / "units")) == ["d0-L3-int4-head__int8-head.json",
                                                                 "d0-L3-int8-head__int8-head.json"]


def test_a_killed_shard_loses_at_most_its_unit_in_flight(tmp_path):
    dump = tmp_path / "long.h5"
    kvq("synth", "--out", dump, "--layers", 2, "--tokens", 1024, "--q-len", 128)  # ~70 ms a unit (plain build)
    pairs = ["--k", "int8-head,int4-g32-asym,int4-head-asym", "--v", "int8-head,int4-g32-asym"]
    study = tmp_path / "study"
    kvq("plan", "sweep", dump, *pairs, "--shards", 2, "--out", study)
    shard0 = study / "shards" / "0"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # At the lowest priority, so that on a loaded machine the watcher below is not starved while the
    # shard finishes its other units.
    p = subprocess.Popen([binary(), "sweep", "--plan", study / "plan.json", "--shard", "0", "--out", shard0],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, preexec_fn=lambda: os.nice(19))
    # Killed once two units are finished: a unit file gets its final name (*.json) only when whole.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and p.poll() is None and len(list((shard0 / "units").glob("*.json"))) < 2:
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL, "shard 0 finished (or failed) before two units were written"
    kept = sorted(f.name for f in (shard0 / "units").glob("*.json"))
    assert 2 <= len(kept) < 6, kept  # killed mid-run, finished units kept whole
    for f in kept:
        json.load(open(shard0 / "units" / f))
    kvq("sweep", "--plan", study / "plan.json", "--shard", 1, "--out", study / "shards" / "1")
    r = kvq("merge", shard0, study / "shards" / "1", "--out", study / "results", check=False)
    assert r.returncode == 3 and f"{6 - len(kept)} of 12 unit(s) in none of the 2 folder(s)" in r.stderr
    assert "shard 0/2" in r.stderr
    r = kvq("sweep", "--plan", study / "plan.json", "--shard", 0, "--out", shard0)
    assert f"{6 - len(kept)} unit(s) run, {len(kept)} reused" in r.stdout
    kvq("merge", shard0, study / "shards" / "1", "--out", study / "results")
    kvq("sweep", dump, *pairs, "--no-latency", "--out", tmp_path / "single")
    assert_same_sweep(study / "results", tmp_path / "single")


def test_merge_and_shard_errors(tmp_path):
    dump = tmp_path / "x.h5"
    kvq("synth", "--out", dump, "--layers", 2, "--tokens", 64)
    kvq("plan", "sweep", dump, "--k", "int8-head", "--v", "int8-head,int4-head", "--shards", 2, "--out", tmp_path / "s")
    for i in range(2):
        kvq("sweep", "--plan", tmp_path / "s" / "plan.json", "--shard", i, "--out", tmp_path / "s" / str(i))
    # the same shard into a second folder: every unit of it found twice
    kvq("sweep", "--plan", tmp_path / "s" / "plan.json", "--shard", 1, "--out", tmp_path / "s" / "again")
    r = kvq("merge", tmp_path / "s" / "0", tmp_path / "s" / "1", tmp_path / "s" / "again", "--out", tmp_path / "m",
            check=False)
    assert r.returncode == 3 and "2 unit(s) found more than once" in r.stderr
    assert f"{tmp_path}/s/1/units/d0-L1-int8-head__int8-head.json and {tmp_path}/s/again/units/" in r.stderr
    # one folder named twice (by another path): said so, not as its units found twice
    r = kvq("merge", tmp_path / "s" / "0", tmp_path / "s" / "1", f"{tmp_path}/s/./0", "--out", tmp_path / "m", check=False)
    assert r.returncode == 3 and f"merge: {tmp_path}/s/./0 is given twice (as {tmp_path}/s/0)" in r.stderr
    # another study's folder
    kvq("plan", "sweep", dump, "--k", "int8-head", "--v", "int8-head", "--shards", 1, "--out", tmp_path / "other")
    kvq("sweep", "--plan", tmp_path / "other" / "plan.json", "--shard", 0, "--out", tmp_path / "other" / "0")
    r = kvq("merge", tmp_path / "s" / "0", tmp_path / "other" / "0", "--out", tmp_path / "m", check=False)
    assert r.returncode == 3 and "plan.json differs" in r.stderr
    r = kvq("sweep", "--plan", tmp_path / "other" / "plan.json", "--shard", 0, "--out", tmp_path / "s" / "0", check=False)
    assert r.returncode == 3 and "holds the results of another plan" in r.stderr
    # a dump that changed after the plan
    kvq("synth", "--out", dump, "--layers", 2, "--tokens", 64, "--seed", 5)
    r = kvq("sweep", "--plan", tmp_path / "s" / "plan.json", "--shard", "0/3", "--out", tmp_path / "s" / "n3", check=False)
    assert r.returncode == 3 and f"{dump}: changed since the plan was made" in r.stderr
    r = kvq("sweep", "--plan", tmp_path / "s" / "plan.json", "--shard", "2/2", "--out", tmp_path / "s" / "x", check=False)
    assert r.returncode == 3 and "expected 0 <= I < N, got I = 2, N = 2" in r.stderr


def test_bench_and_slurm_plans(tmp_path):
    r = kvq("plan", "bench", "--gpus", "h100,l40s", "--variants", "decode-tc,decode-splitk", "--shapes", "seed000",
            "--shards", 3, "--out", tmp_path / "b")
    assert "20 units in 3 shard(s)" in r.stdout and "l40s shard 2" in r.stdout
    plan = json.load(open(tmp_path / "b" / "plan.json"))
    assert {u["key"]["gpu"] for u in plan["units"]} == {"h100", "l40s"}
    r = kvq("slurm", "submit", tmp_path / "b", "--dry-run", "--partition", "gpu")
    lines = [line for line in r.stdout.splitlines() if line.startswith("sbatch")]
    assert len(lines) == 3  # an array per GPU type, the merge after both
    assert "--array=0-2" in lines[0] and "--gres='gpu:h100:1'" in lines[0] and "bench.sbatch" in lines[0]
    assert "--gres='gpu:l40s:1'" in lines[1]
    assert "--dependency=afterok:ARRAY0:ARRAY1" in lines[2] and "merge.sbatch" in lines[2]
    r = kvq("bench", "--plan", tmp_path / "b" / "plan.json", "--shard", 0, "--gpu", "h100", check=False)
    if "built without CUDA" in r.stderr:  # a CPU build: the GPU shards report unavailable
        assert r.returncode == 3


def test_eval_shards_merge_to_the_single_run(tmp_path):
    pytest.importorskip("kvq", reason="the kvq Python module (build/python) runs kvq eval")
    import csv
    py = os.environ.get("KVQ_PYTHON", os.path.join(ROOT, ".venv", "bin", "python"))
    eval_py = os.path.join(ROOT, "experiments", "eval", "kvq_eval.py")
    options = ["--model", "stories260k", "--k", "int8-head,int4-head", "--v", "int8-head,fp16", "--no-plot"]
    env = dict(os.environ, KVQ_PYTHON=py)

    def run(*args):
        r = subprocess.run([*map(str, args)], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        return r

    run(binary(), "plan", "eval", "--shards", 3, "--out", tmp_path / "study", *options)
    shards = [tmp_path / "study" / "shards" / str(i) for i in range(3)]
    for i, out in enumerate(shards):
        run(py, eval_py, "--plan", tmp_path / "study" / "plan.json", "--shard", i, "--out", out)
    again = run(py, eval_py, "--plan", tmp_path / "study" / "plan.json", "--shard", 1, "--out", shards[1])
    assert "0 unit(s) run, 2 reused" in again.stdout
    missing = subprocess.run([binary(), "merge", shards[0], shards[2], "--out", tmp_path / "m"], capture_output=True,
                             text=True, env=env)
    assert missing.returncode == 3 and "2 of 4 unit(s) in none of the 2 folder(s)" in missing.stderr
    run(binary(), "merge", *shards, "--out", tmp_path / "merged")
    run(py, eval_py, *options, "--out", tmp_path / "single")

    def table(d):  # eval.csv without its timing column, eval.json without timing and host fields
        rows = [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(open(d / "eval.csv"))]
        meta = [{k: v for k, v in m.items() if k not in {"seconds", "hostname", "machine", "time_utc"}}
                for m in json.load(open(d / "eval.json"))]
        return rows, meta
    assert table(tmp_path / "merged") == table(tmp_path / "single")
    assert len(table(tmp_path / "single")[0]) == 4
    with open(tmp_path / "merged" / "eval.csv", "rb") as a, open(tmp_path / "single" / "eval.csv", "rb") as b:
        strip = [b",".join(line.split(b",")[:-1]) for line in a.read().splitlines()]
        assert strip == [b",".join(line.split(b",")[:-1]) for line in b.read().splitlines()]  # byte for byte but seconds
