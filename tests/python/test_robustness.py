"""kvq on inputs it has never seen: corrupt files end in one line naming the file (exit 4), a sweep
over several dumps keeps the good ones' results, an interrupted sweep resumes, kvq's own files carry
checksums, and non-finite queries are rejected like non-finite K and V. KVQ_BIN names the binary."""
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "data"))
import kvq_dump  # noqa: E402

CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
BINARY = os.environ.get("KVQ_BIN", os.path.join(ROOT, "build", "experiments", "kvq"))
# One thread each, since tests run side by side on few cores. Only the hanging input gets a 2 s dump
# check (so it ends in 2 s); every other run keeps the default 60 s, which a loaded sanitizer build
# never comes near, so no outcome depends on the machine's speed.
ENV = dict(os.environ, OMP_NUM_THREADS="1")
ENV.pop("KVQ_DUMP_CHECK_SECONDS", None)
HANG_ENV = dict(ENV, KVQ_DUMP_CHECK_SECONDS="2")


def kvq(*args, env=ENV):
    return subprocess.run([BINARY, *map(str, args)], capture_output=True, text=True, env=env, timeout=300)


def synth(path, layers=2, tokens=48, q_len=4):
    r = kvq("synth", "--out", path, "--layers", layers, "--batch", 2, "--q-heads", 4, "--kv-heads", 2,
            "--tokens", tokens, "--head-dim", 16, "--q-len", q_len)
    assert r.returncode == 0, r.stderr
    return path


def one_line(r):
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.parametrize("name", ["crash-0e4fbb9f9653.h5", "hang-8e5d0767eb0e.h5"])
@pytest.mark.parametrize("command", [["inspect"], ["quantize", "--k", "int8-head", "--v", "int8-head", "--out", "{tmp}/q.h5"],
                                     ["reference", "--out", "{tmp}/r.h5"], ["sweep", "--out", "{tmp}/s", "--no-latency"]])
def test_inputs_that_crashed_or_hung_kvq_end_in_one_line(tmp_path, name, command):
    path = os.path.join(CORPUS, name)
    args = [command[0], path] + [a.format(tmp=tmp_path) for a in command[1:]]
    r = kvq(*args, env=HANG_ENV if name.startswith("hang") else ENV)
    assert r.returncode == 4, r.stderr
    line = one_line(r)
    assert line.startswith(f"kvq: error: {path}: ")
    assert ("crashed" in line) if name.startswith("crash") else ("did not finish within 2 s" in line)


def test_sweep_writes_the_good_dumps_and_reports_the_corrupt_one_then_resumes(tmp_path):
    a, c = synth(tmp_path / "a.h5"), synth(tmp_path / "c.h5", layers=3, tokens=40)
    bad = os.path.join(CORPUS, "crash-0e4fbb9f9653.h5")
    out = tmp_path / "out"
    r = kvq("sweep", a, bad, c, "--k", "int8-head,int4-g8-asym", "--v", "int8-head", "--out", out, "--no-latency")
    assert r.returncode == 4
    assert one_line(r).startswith(f"kvq: error: {bad}: the HDF5 library crashed")
    with open(out / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == (2 + 3) * 2  # every layer of a and c, two pairs each
    records = json.load(open(out / "sweep.json"))
    assert [r["file"] for r in records] == [str(a), bad, str(c)]
    assert "error" in records[1] and all(r["complete"] for r in records)
    assert len(os.listdir(out / "checkpoint")) == 5  # kept for a rerun

    good = tmp_path / "b.h5"
    synth(good, layers=1, tokens=20)
    r = kvq("sweep", a, good, c, "--k", "int8-head,int4-g8-asym", "--v", "int8-head", "--out", out, "--no-latency")
    assert r.returncode == 0, r.stderr
    assert "reused 5 finished layer(s)" in r.stdout
    assert not (out / "checkpoint").exists()
    with open(out / "sweep.csv") as f:
        assert len(list(csv.DictReader(f))) == 12


def finished_units(checkpoint_dir):
    """The checkpoint's finished unit files (a unit being written is *.json.tmp until it is whole)."""
    try:
        return sorted(name for name in os.listdir(checkpoint_dir) if name.endswith(".json"))
    except FileNotFoundError:
        return []


def test_an_interrupted_sweep_keeps_finished_layers_and_resumes_to_the_same_results(tmp_path):
    dump = synth(tmp_path / "big.h5", layers=8, tokens=160, q_len=16)
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    # ~60 ms a layer (plain build), at the lowest priority so that on a loaded machine the watcher below
    # is not starved while the sweep finishes its other layers.
    proc = subprocess.Popen([BINARY, "sweep", str(dump), "--out", str(out), "--no-latency"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=ENV, preexec_fn=lambda: os.nice(19))
    # Killed once two layers are finished: a unit file gets its final name (*.json) only when whole,
    # and layer i's results files are written before layer i + 1 starts, so the results name >= 1 layer.
    # The deadline only bounds a hang: a loaded machine may starve the niced sweep for minutes.
    deadline = time.monotonic() + 900
    while proc.poll() is None and time.monotonic() < deadline and len(finished_units(out / "checkpoint")) < 2:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)  # a crash: no chance to clean up
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the sweep finished (or failed) before two layers were checkpointed"
    done = finished_units(out / "checkpoint")
    assert 2 <= len(done) < 8, done
    records = json.load(open(out / "sweep.json"))
    # The results files follow each checkpoint; the kill may fall between the two.
    assert not records[0]["complete"] and len(done) - 1 <= len(json.loads(records[0]["layers"])) <= len(done)
    r = kvq("sweep", dump, "--out", out, "--no-latency")
    assert r.returncode == 0, r.stderr
    assert f"reused {len(done)} finished layer(s)" in r.stdout
    assert kvq("sweep", dump, "--out", fresh, "--no-latency").returncode == 0
    for name in ("sweep.csv", "sweep_heads.csv"):
        assert (out / name).read_bytes() == (fresh / name).read_bytes(), name


def test_nan_in_queries_is_one_line_naming_the_dataset_and_index(tmp_path):
    rng = np.random.default_rng(3)
    q = rng.normal(size=(2, 4, 5, 8)).astype(np.float32)
    q[1, 2, 3, 4] = np.nan
    layers = [{"k": rng.normal(size=(2, 2, 5, 8)), "v": rng.normal(size=(2, 2, 5, 8)), "q": q, "num_q_heads": 4}]
    path = tmp_path / "nanq.h5"
    kvq_dump.write_dump(path, layers, source="test", created_by="test", rope="none")
    want = f"kvq: error: {path}: /layers/0/q: non-finite value nan at [1, 2, 3, 4] (attention needs finite queries)"
    r = kvq("sweep", path, "--k", "int8-head", "--v", "int8-head", "--out", tmp_path / "s", "--no-latency")
    assert (r.returncode, one_line(r)) == (3, want)
    r = kvq("reference", path, "--out", tmp_path / "r.h5")
    assert (r.returncode, one_line(r)) == (3, want)
    r = kvq("inspect", path)  # reports the count; computes nothing from Q
    assert r.returncode == 0 and any(line.split()[:1] == ["Q"] and line.endswith(" 1") for line in r.stdout.splitlines())


def test_kvq_files_carry_checksums_and_a_flipped_data_byte_is_a_checksum_error(tmp_path):
    path = synth(tmp_path / "s.h5", layers=1, tokens=64)
    ref = tmp_path / "ref.h5"
    assert kvq("reference", path, "--out", ref).returncode == 0
    written = tmp_path / "py.h5"
    kvq_dump.write_dump(written, [{"k": np.ones((1, 1, 4, 8)), "v": np.ones((1, 1, 4, 8))}], source="t",
                        created_by="t", rope="none", dtype="bfloat16")
    for f in (path, ref, written):
        with open(f, "rb") as fh:
            assert fh.read(9)[8] == 3  # superblock v3: the HDF5 1.10 format, checksummed metadata
        with h5py.File(f) as h:
            datasets = []
            h.visititems(lambda n, o: datasets.append(o) if isinstance(o, h5py.Dataset) else None)
            assert datasets and all(d.fletcher32 for d in datasets)
    with h5py.File(path) as h:
        info = h["layers/0/k"].id.get_chunk_info(0)
        offset = info.byte_offset + info.size // 2
    data = bytearray(open(path, "rb").read())
    data[offset] ^= 0x04
    bad = tmp_path / "flipped.h5"
    bad.write_bytes(bytes(data))
    r = kvq("inspect", bad)
    assert r.returncode == 4
    assert one_line(r) == f"kvq: error: {bad}: /layers/0/k: cannot read the data (checksum mismatch: the file is corrupt)"



def test_a_dump_compressed_with_a_filter_hdf5_lacks_is_named_not_called_corrupt(tmp_path):
    """h5py's lzf is not in libhdf5: such a dump is a valid file kvq cannot decode (exit 3), not a corrupt one."""
    def dump(path, k):
        with h5py.File(path, "w") as f:
            f.attrs.update(kvq_schema=np.int64(1), source="lzf", created_by="h5py", rope="none")
            g = f.create_group("layers/0")
            g.attrs.update(num_q_heads=2, num_kv_heads=1, head_dim=8)
            g.create_dataset("k", data=k, compression="lzf", chunks=(1, 1, 16, 8))
            g.create_dataset("v", data=np.zeros_like(k))
    k = np.zeros((1, 1, 32, 8), np.float32)
    k[0, 0, 16:] = np.random.default_rng(0).normal(size=(16, 8))  # noise lzf cannot shrink: stored unfiltered
    path = tmp_path / "lzf.h5"
    dump(path, k)
    with h5py.File(path) as f:  # chunk 0 went through lzf, chunk 1 skipped it
        assert [f["layers/0/k"].id.get_chunk_info(i).filter_mask for i in range(2)] == [0, 1]
    for args in (["inspect", path], ["sweep", path, "--k", "int8-head", "--v", "int8-head", "--out", tmp_path / "s"]):
        r = kvq(*args)
        assert r.returncode == 3, r.stderr
        assert one_line(r).startswith(f"kvq: error: {path}: /layers/0/k: chunk [0, 0, 0, 0] is stored through HDF5 "
                                      "filter 32000 ('lzf'), which this HDF5 library cannot decode")
    assert not (tmp_path / "s" / "sweep.csv").exists()
    k[0, 0, :16] = np.random.default_rng(1).normal(size=(16, 8))  # no chunk went through lzf: readable
    dump(path, k)
    r = kvq("inspect", path)
    assert r.returncode == 0, r.stderr


def test_padding_never_moves_a_sweep_or_quantize_result_not_even_nan(tmp_path):
    """Positions t >= seq_len may hold anything (docs/data.md): results are those of the valid tokens."""
    rng = np.random.default_rng(7)
    k, v = (rng.normal(size=(3, 2, 40, 32)).astype(np.float32) for _ in range(2))
    k[..., 5] += 4  # a one-signed channel: a padding value outside its range would widen its groups
    q = rng.normal(size=(3, 4, 1, 32)).astype(np.float32)
    lens = np.array([40, 30, 0])
    valid = np.broadcast_to(np.arange(40)[None, None, :, None] < lens[:, None, None, None], k.shape)
    csvs, dequantized = [], []
    for i, fill in enumerate([0.0, 50.0, np.nan]):
        path = tmp_path / f"pad{i}.h5"
        kvq_dump.write_dump(path, [{"k": np.where(valid, k, fill), "v": np.where(valid, v, fill), "q": q,
                                    "num_q_heads": 4}], source="pad", created_by="test", rope="none", seq_lens=lens)
        r = kvq("sweep", path, "--k", "int8-tensor,int4-tensor-asym,int4-chan-t32-asym,q4_1", "--v",
                "int8-token,int4-tensor-asym", "--out", tmp_path / f"s{i}", "--no-latency")
        assert r.returncode == 0, r.stderr
        csvs.append((tmp_path / f"s{i}" / "sweep.csv").read_text())
        out = tmp_path / f"q{i}.h5"
        r = kvq("quantize", path, "--k", "int4-chan-t32-asym", "--v", "int4-tensor-asym", "--out", out)
        assert r.returncode == 0, r.stderr
        with h5py.File(out) as f:
            for name, x in (("k", k), ("v", v)):
                x_hat = f[f"layers/0/{name}/dequantized"][...]
                err = np.where(valid, x_hat.astype(np.float64) - x, 0)
                want = 10 * np.log10((np.where(valid, x, 0).astype(np.float64) ** 2).sum() / (err ** 2).sum())
                assert f[f"layers/0/{name}"].attrs["sqnr_db"] == pytest.approx(want, rel=1e-9)  # valid tokens only
                dequantized.append(x_hat[valid])
    assert csvs[1] == csvs[0] and csvs[2] == csvs[0]
    for i in range(2, 6):
        np.testing.assert_array_equal(dequantized[i], dequantized[i % 2])


def test_bench_quantize_names_a_bad_input_before_it_touches_the_gpu():
    r = kvq("bench-quantize", "--input", "uniform,gaussian-rows,normal", "--csv", "/nonexistent/never-written.csv")
    if "built without CUDA" in r.stderr:
        pytest.skip("this kvq was built without CUDA")
    assert r.returncode == 3, r.stderr
    assert one_line(r) == "kvq: error: bench input 'normal': expected uniform or gaussian-rows"


def test_a_command_that_fails_part_way_leaves_an_earlier_output_as_it_was(tmp_path):
    out = synth(str(tmp_path / "s.h5"))
    before = open(out, "rb").read()
    r = kvq("synth", "--out", out, "--tokens", 4, "--q-len", 8)  # q-len > tokens: refused while writing
    assert r.returncode == 3, r.stderr
    assert "Tq <= T" in one_line(r)
    assert open(out, "rb").read() == before
    assert sorted(os.listdir(tmp_path)) == ["s.h5"]  # no partial file left beside it
