"""kvq quantize / reference outputs read back with h5py and checked against numpy, and the
command line's exit codes. KVQ_BIN names the kvq binary (ctest sets it)."""
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "data"))
import kvq_dump  # noqa: E402
BUNDLED = os.path.join(ROOT, "data", "dumps", "stories260k.h5")


def kvq(*args):
    binary = os.environ.get("KVQ_BIN", os.path.join(ROOT, "build", "experiments", "kvq"))
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True)


def unpack(codes, bits, asymmetric):
    """Planar codes -> integer codes [.., D] (int4: element 2i in the low nibble)."""
    if bits == 8:
        return codes.astype(np.int64)
    lo, hi = (codes & 0xF).astype(np.int64), (codes >> 4).astype(np.int64)
    q = np.stack([lo, hi], axis=-1).reshape(*codes.shape[:-1], codes.shape[-1] * 2)
    return q if asymmetric else np.where(q >= 8, q - 16, q)


def expand(params, granularity, group, shape):
    """Per-group scales -> per-element [B, H, T, D]."""
    B, H, T, D = shape
    p = params.astype(np.float32)
    if granularity == "tensor":
        return np.broadcast_to(p.reshape(1, 1, 1, 1), shape)
    if granularity == "token":
        return np.broadcast_to(p[:, None, :, None], shape)
    if granularity == "head":
        return np.broadcast_to(p[..., None], shape)
    if granularity == "group":
        return np.repeat(p, group, axis=-1)
    return np.repeat(p, group, axis=2)[:, :, :T, :]  # channel: token groups along T


@pytest.mark.parametrize("k_scheme,v_scheme", [("int4-head-asym", "int8-head"), ("int8-token", "int4-g4"),
                                               ("int8-tensor-asym", "int4-chan-t32-asym")])
def test_quantize_output_round_trips_through_h5py(tmp_path, k_scheme, v_scheme):
    out = tmp_path / "q.h5"
    r = kvq("quantize", BUNDLED, "--k", k_scheme, "--v", v_scheme, "--out", out)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f, h5py.File(BUNDLED) as src:
        assert kvq_dump.text(f.attrs["k_scheme"]) == k_scheme and kvq_dump.text(f.attrs["v_scheme"]) == v_scheme
        for layer in f["layers"]:
            for name in ("k", "v"):
                g = f[f"layers/{layer}/{name}"]
                a = {key: kvq_dump.text(v) if isinstance(v, bytes) else v for key, v in g.attrs.items()}
                original = src[f"layers/{layer}/{name}"][...]
                q = unpack(g["codes"][...], a["bits"], a["asymmetric"])
                s = expand(g["scales"][...], a["granularity"], a["group"], original.shape)
                # fp16 scales and <= 8-bit codes: q*s is exact in fp32, so q*s + z rounds once, like the codec's fma
                x = q.astype(np.float32) * s
                if a["asymmetric"]:
                    x = x + expand(g["zero_points"][...], a["granularity"], a["group"], original.shape)
                np.testing.assert_array_equal(x, g["dequantized"][...])
                err = np.sum((original - x) ** 2)
                assert a["sqnr_db"] == pytest.approx(10 * np.log10(np.sum(original.astype(np.float64) ** 2) / err), rel=1e-6)


def fp8_values(codes, mantissa_bits, bias):
    """FP8 bytes -> float32, from the format's definition (finite codes only)."""
    c = codes.astype(np.int64)
    e, m = (c & 0x7F) >> mantissa_bits, c & ((1 << mantissa_bits) - 1)
    mag = np.where(e == 0, m * 2.0 ** (1 - bias - mantissa_bits), (1 + m / 2 ** mantissa_bits) * 2.0 ** (e - bias))
    return np.where(c & 0x80, -mag, mag).astype(np.float32)


def test_quantize_writes_fp8_codes_windows_and_rotations(tmp_path):
    out = tmp_path / "q.h5"
    r = kvq("quantize", BUNDLED, "--k", "fp8-e4m3-head+w100", "--v", "fp8-e5m2", "--out", out)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f, h5py.File(BUNDLED) as src:
        T = src["layers/0/k"].shape[2]
        for layer in f["layers"]:
            k, v = f[f"layers/{layer}/k"], f[f"layers/{layer}/v"]
            assert kvq_dump.text(k.attrs["format"]) == "fp8-e4m3" and k.attrs["window"] == 100
            assert k["codes"].dtype == np.uint8 and "scales" not in v and kvq_dump.text(v.attrs["scale_dtype"]) == "none"
            lq = k["quantized_tokens"][...]
            assert (lq == T - 100).all()  # every sequence of the bundled dump is T tokens long
            original = src[f"layers/{layer}/k"][...].astype(np.float32)
            x = fp8_values(k["codes"][...], 3, 7) * k["scales"][...].astype(np.float32)[..., None]
            np.testing.assert_array_equal(x[:, :, :lq[0]], k["dequantized"][:, :, :lq[0]])
            np.testing.assert_array_equal(original[:, :, lq[0]:], k["dequantized"][:, :, lq[0]:])  # the window
            assert (k["codes"][:, :, lq[0]:] == 0).all()
            np.testing.assert_array_equal(fp8_values(v["codes"][...], 2, 15), v["dequantized"][...])
    r = kvq("quantize", BUNDLED, "--k", "int8-head+had", "--v", "int8-head", "--out", out)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f, h5py.File(BUNDLED) as src:
        original = src["layers/0/k"][...].astype(np.float64)
        D = original.shape[-1]
        h = np.array([[1.0]])
        while h.shape[0] < D:
            h = np.block([[h, h], [h, -h]])
        rotated = original @ (h / np.sqrt(D))  # H is symmetric
        g = f["layers/0/k"]
        assert g.attrs["hadamard"]
        err = np.abs(g["dequantized"][...] - rotated).max()
        assert err <= np.abs(rotated).max() / 127  # within one int8 step of the rotated K, far from the unrotated
        assert np.abs(g["dequantized"][...] - original).max() > 10 * err


def test_reference_output_matches_numpy_attention(tmp_path):
    out = tmp_path / "ref.h5"
    r = kvq("reference", BUNDLED, "--out", out, "--layers", "1")
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f, h5py.File(BUNDLED) as src:
        assert list(f["layers"]) == ["1"]
        o, lse = f["layers/1/o"][...], f["layers/1/lse"][...]
        q, k, v = (src[f"layers/1/{n}"][0].astype(np.float64) for n in ("q", "k", "v"))
    T = q.shape[1]
    for h in range(q.shape[0]):
        s = q[h] @ k[h // 2].T / np.sqrt(q.shape[2])
        s[np.triu_indices(T, 1)] = -np.inf
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        np.testing.assert_allclose(o[0, h], (p / p.sum(axis=1, keepdims=True)) @ v[h // 2], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(lse[0, h], (m + np.log(p.sum(axis=1, keepdims=True)))[:, 0], rtol=1e-12)


def test_reference_options_change_the_result(tmp_path):
    plain, alibi = tmp_path / "plain.h5", tmp_path / "alibi.h5"
    assert kvq("reference", BUNDLED, "--out", plain, "--layers", "0").returncode == 0
    assert kvq("reference", BUNDLED, "--out", alibi, "--layers", "0", "--alibi", "--scale", "0.1").returncode == 0
    with h5py.File(plain) as a, h5py.File(alibi) as b:
        assert bool(b["layers/0"].attrs["alibi"]) and b["layers/0"].attrs["softmax_scale"] == 0.1
        assert not np.allclose(a["layers/0/o"][...], b["layers/0/o"][...])


@pytest.mark.parametrize("args,code,message", [
    (["sweep", BUNDLED, "--k", "int4-g3"], 3, f"kvq: error: {BUNDLED}: int4-g3: group size 3 does not divide head_dim 8"),
    (["sweep", BUNDLED, "--k", "int5-head"], 3, "kvq: error: unknown scheme 'int5-head': bits 'int5' must be int8, int4 or fp8"),
    (["quantize", BUNDLED, "--k", "int8-head"], 2, "--v is required"),
    (["sweep", "/nonexistent.h5"], 2, "File does not exist"),
    (["sweep", BUNDLED, "--layers", "9"], 3, "--layers 9: not in the dump (its layers: 0-4)"),
    (["sweep", BUNDLED, "--layers", "1", "7", "-2", "7"], 3, "--layers 7, -2: not in the dump (its layers: 0-4)"),
    (["quantize", BUNDLED, "--k", "int8-head", "--v", "int8-head", "--layers", "0", "5"], 3,
     "--layers 5: not in the dump (its layers: 0-4)"),
    (["recommend", BUNDLED, "--max-rel-l2", "0.1"], 3, f"kvq: error: {BUNDLED}: line "),
    (["reference", BUNDLED, "--scale", "0"], 3, "--scale 0: the softmax scale must be positive and finite"),
    (["bench-cpu", "--filter", "llama9b"], 3, "--filter 'llama9b' matches none of the shapes"),
    (["bench-cpu", "--filter", "seed0(0"], 3, "--filter 'seed0(0': not a valid regular expression"),
    (["bench-cpu", "--min-seconds", "-1"], 2, "--min-seconds: -1 is negative (need >= 0)"),
    (["frobnicate"], 2, ""),
])
def test_errors_are_one_line_with_exit_codes(tmp_path, args, code, message):
    out = {"sweep": tmp_path / "o", "quantize": tmp_path / "o.h5", "reference": tmp_path / "r.h5"}.get(args[0])
    r = kvq(*args, *(["--out", out] if out else []))
    assert r.returncode == code, (r.stdout, r.stderr)
    assert message in r.stderr
    assert "Traceback" not in r.stderr and "HDF5-DIAG" not in r.stderr


@pytest.mark.parametrize("args,message", [
    (["--batch", "0"], "--batch: 0 is not positive (need > 0)"),
    (["--outlier-channels", "-1"], "synthetic: bad parameters: outlier_channels=-1 (need 0 .. D/2 = 64)"),
    (["--layers", "0"], "--layers: 0 is not positive (need > 0)"),
    (["--head-dim", "abc"], "--head-dim: abc is not a number"),
    (["--token-spread", "-1", "--rope-theta", "nan"],
     "kvq: error: synthetic: bad parameters: token_spread=-1 (need finite, >= 0); rope_theta=nan (need finite, > 0)"),
])
def test_option_errors_say_the_rule(tmp_path, args, message):
    r = kvq("synth", "--out", tmp_path / "s.h5", *args)
    assert r.returncode in (2, 3) and message in r.stderr, r.stderr
    assert "not in range" not in r.stderr and len(r.stderr) < 300
    assert not (tmp_path / "s.h5").exists()


@pytest.mark.parametrize("command", [["quantize", "--k", "int8-head", "--v", "int4-g8-asym"], ["reference"]])
def test_an_output_over_the_input_dump_is_refused_and_the_dump_kept(tmp_path, command):
    dump = tmp_path / "d.h5"
    dump.write_bytes(open(BUNDLED, "rb").read())
    (tmp_path / "link.h5").symlink_to(dump)
    before = dump.read_bytes()
    for out in (dump, tmp_path / "link.h5", f"{tmp_path}/./d.h5", os.path.relpath(dump)):
        r = kvq(command[0], dump, *command[1:], "--out", out)
        assert r.returncode == 3, r.stderr
        assert r.stderr == f"kvq: error: {dump}: --out {out} is the input dump, which the output would replace; " \
                           "write it elsewhere\n"
    assert dump.read_bytes() == before
    r = kvq(command[0], dump, *command[1:], "--out", tmp_path / "o.h5")
    assert r.returncode == 0, r.stderr


def test_layers_checks_only_the_layers_asked_for(tmp_path):
    """A layer left out by --layers may lack Q (reference) or have a head_dim the scheme does not fit (quantize)."""
    rng = np.random.default_rng(2)
    kv = lambda d: rng.normal(size=(1, 2, 6, d)).astype(np.float32)  # noqa: E731
    path = tmp_path / "mixed.h5"
    kvq_dump.write_dump(path, [{"k": kv(12), "v": kv(12), "num_q_heads": 2},
                               {"k": kv(16), "v": kv(16), "q": rng.normal(size=(1, 2, 1, 16)), "num_q_heads": 2}],
                        source="mixed", created_by="test", rope="none")
    r = kvq("reference", path, "--layers", "1", "--out", tmp_path / "r.h5")
    assert r.returncode == 0, r.stderr
    with h5py.File(tmp_path / "r.h5") as f:
        assert list(f["layers"]) == ["1"] and f["layers/1/o"].shape == (1, 2, 1, 16)
    r = kvq("quantize", path, "--k", "int4-g16", "--v", "int8-head", "--layers", "1", "--out", tmp_path / "q.h5")
    assert r.returncode == 0, r.stderr
    r = kvq("reference", path, "--out", tmp_path / "r0.h5")  # every layer: layer 0 is still named
    assert (r.returncode, r.stderr) == (3, f"kvq: error: {path}: /layers/0/q: missing dataset (kvq reference needs "
                                           "decode queries)\n")
    r = kvq("quantize", path, "--k", "int4-g16", "--v", "int8-head", "--out", tmp_path / "q0.h5")
    assert r.returncode == 3 and r.stderr.startswith(f"kvq: error: {path}: /layers/0: int4-g16: group size 16"), r.stderr
    assert not (tmp_path / "r0.h5").exists() and not (tmp_path / "q0.h5").exists()


def test_bench_cpu_csv_that_cannot_be_written_whole_leaves_the_earlier_file(tmp_path):
    import resource
    import signal

    def small_files():  # a write past 120 bytes fails (EFBIG), as on a full disk, instead of killing kvq
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (120, 120))

    out = tmp_path / "cpu.csv"
    out.write_text("earlier results\n")
    binary = os.environ.get("KVQ_BIN", os.path.join(ROOT, "build", "experiments", "kvq"))
    r = subprocess.run([binary, "bench-cpu", "--filter", "seed002", "--min-reps", "1", "--min-seconds", "0", "--csv",
                        str(out)], capture_output=True, text=True, preexec_fn=small_files)
    assert (r.returncode, r.stderr) == (3, f"kvq: error: cannot write '{out}.tmp'\n")
    assert out.read_text() == "earlier results\n"


def test_a_dump_given_twice_is_refused_before_any_work(tmp_path):
    (tmp_path / "link.h5").symlink_to(BUNDLED)
    for name, command in (("sweep", ["sweep"]), ("plan sweep", ["plan", "sweep", "--shards", "2"])):
        for again in (BUNDLED, tmp_path / "link.h5"):
            out = tmp_path / "out"
            r = kvq(*command, BUNDLED, again, "--k", "int8-head", "--out", out)
            assert (r.returncode, r.stderr) == (3, f"kvq: error: {name}: {again} is given twice (as {BUNDLED}): its "
                                                   "rows would count twice\n")
            assert not out.exists()


@pytest.mark.parametrize("command,made_by", [(["quantize", "--k", "int8-head", "--v", "int4-g8-asym"], "kvq quantize"),
                                             (["reference"], "kvq reference")])
def test_an_output_of_quantize_or_reference_read_as_a_dump_is_named(tmp_path, command, made_by):
    out = tmp_path / "o.h5"
    assert kvq(command[0], BUNDLED, *command[1:], "--out", out).returncode == 0
    for use in (["inspect", out], ["sweep", out, "--out", tmp_path / "s"]):
        r = kvq(*use)
        assert r.returncode == 3
        assert f"{out}: / attribute kvq_schema: missing: this file is {made_by}'s output" in r.stderr, r.stderr
        assert f"not a dump; its input dump was {BUNDLED}" in r.stderr, r.stderr


def test_an_out_that_is_a_file_is_an_input_error_naming_the_path(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("not a directory")
    r = kvq("sweep", BUNDLED, "--k", "int8-head", "--v", "int8-head", "--out", taken)
    assert r.returncode == 3
    assert r.stderr == f"kvq: error: {taken}/checkpoint: cannot create directories: Not a directory\n"
    assert taken.read_text() == "not a directory"


def test_two_dumps_with_one_source_are_told_apart_by_the_dump_column(tmp_path):
    """Two captures of one model and text (the same source): sweep.csv says which row is whose, and
    recommend judges each dump's layer on its own rows, not the easier dump's for both."""
    import csv
    import json
    rng = np.random.default_rng(0)
    dumps = []
    for name, scale in (("easy.h5", 1.0), ("hard.h5", 3.0)):  # larger K: sharper softmax, larger output error
        k = rng.standard_normal((1, 2, 64, 32)).astype(np.float32) * scale
        layer = {"k": k, "v": rng.standard_normal((1, 2, 64, 32)).astype(np.float32),
                 "q": rng.standard_normal((1, 4, 2, 32)).astype(np.float32), "num_q_heads": 4}
        kvq_dump.write_dump(tmp_path / name, [layer], source="hf:m (64 tokens, torch.float32)",
                            created_by="test", rope="none")
        dumps.append(tmp_path / name)
    out = tmp_path / "out"
    r = kvq("sweep", *dumps, "--k", "int8-head,int4-head,int4-g8", "--v", "int8-head", "--out", out, "--no-latency")
    assert r.returncode == 0, r.stderr
    with open(out / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["dump"] for r in rows] == ["0"] * 3 + ["1"] * 3
    with open(out / "sweep_heads.csv") as f:
        assert {r["dump"] for r in csv.DictReader(f)} == {"0", "1"}
    meta = json.loads((out / "sweep.json").read_text())
    assert [(m["dump"], m["file"]) for m in meta] == [(0, str(dumps[0])), (1, str(dumps[1]))]
    error = {d: min(float(r["out_rel_l2_mean"]) for r in rows if r["dump"] == d) for d in ("0", "1")}
    assert error["0"] < error["1"]
    budget = (error["0"] + error["1"]) / 2  # some pair fits on the easy dump, none on the hard one
    r = kvq("recommend", out / "sweep.csv", "--max-rel-l2", budget)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    hard = lines.index("dump 1: hf:m (64 tokens, torch.float32)")
    assert lines[hard - 2] == "dump 0: hf:m (64 tokens, torch.float32)" and "no scheme pair" not in lines[hard - 1]
    assert lines[hard + 1].split() == ["layer", "0", "no", "scheme", "pair", "meets", "the", "budget"]

    # A file written before the column cannot tell the two apart: refused, not averaged or mixed.
    old = tmp_path / "old.csv"
    with open(out / "sweep.csv") as f, open(old, "w", newline="") as g:
        reader = csv.DictReader(f)
        writer = csv.DictWriter(g, [c for c in reader.fieldnames if c != "dump"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(reader)
    r = kvq("recommend", old, "--max-rel-l2", budget)
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr == (f"kvq: error: {old}: lines 2 and 5: the same layer 0 and pair int8-head / int8-head twice "
                        "(two dumps with the source 'hf:m (64 tokens, torch.float32)' in a file without the dump "
                        "column, which kvq sweep now writes: sweep them again)\n")


def test_a_copy_of_a_dump_is_not_reported_as_resumed_from_an_earlier_run(tmp_path):
    import shutil
    copies = [tmp_path / "a.h5", tmp_path / "b.h5"]  # the same bytes: one checkpoint per layer serves both
    for copy in copies:
        shutil.copy(BUNDLED, copy)
    r = kvq("sweep", *copies, "--layers", "0", "--k", "int8-head", "--v", "int8-head", "--no-latency",
            "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert "reused" not in r.stdout and "wrote " in r.stdout


def test_recommend_names_a_missing_column(tmp_path):
    csv = tmp_path / "partial.csv"
    csv.write_text("source,layer,k_scheme\nm,0,int8-head\n")
    r = kvq("recommend", csv, "--max-rel-l2", "0.1")
    assert r.returncode == 3 and r.stderr == (f"kvq: error: {csv}: not kvq sweep's results (sweep.csv): no columns "
                                              "v_scheme, k_bytes_per_token_head, v_bytes_per_token_head, "
                                              "out_rel_l2_mean\n")


def test_bench_cpu_vs_torch_passes_on_kvqs_refusal_without_a_traceback(tmp_path):
    pytest.importorskip("torch")
    script = os.path.join(ROOT, "experiments", "bench", "bench_cpu_vs_torch.py")
    binary = os.environ.get("KVQ_BIN", os.path.join(ROOT, "build", "experiments", "kvq"))
    run = lambda *a: subprocess.run([sys.executable, script, "--out", str(tmp_path), *a],  # noqa: E731
                                    capture_output=True, text=True)
    refused = run("--kvq", binary, "--filter", "llama70b")
    assert refused.returncode == 3 and "--filter 'llama70b' matches none of the shapes" in refused.stderr
    assert "Traceback" not in refused.stderr
    missing = run("--kvq", str(tmp_path / "no-kvq"))
    assert missing.returncode == 2 and "cannot run it (No such file or directory)" in missing.stderr
