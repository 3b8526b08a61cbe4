"""The Hugging Face capture tool on a tiny randomly initialised Llama (GQA) built here, no download.
Run by tests/python/run_hf_tests.py, which reports 'skipped' where torch or transformers is missing."""
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "data"))
import capture_hf  # noqa: E402
import kvq_dump  # noqa: E402

WORDS = "once upon a time there was a little girl named lily she loved to play outside in the park".split()


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-llama")
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(WORDS))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def cache_layer(cache, i):
    if hasattr(cache, "layers"):
        return cache.layers[i].keys, cache.layers[i].values
    return cache[i][0], cache[i][1]


def test_capture_matches_the_models_cache_and_attention(tiny_model_dir, tmp_path):
    text = " ".join(WORDS)
    out = tmp_path / "tiny.h5"
    assert capture_hf.main(["--model", str(tiny_model_dir), "--prompt", text, "--out", str(out), "--device", "cpu",
                            "--torch-dtype", "float32"]) == 0
    dump = kvq_dump.read_dump(out)
    assert dump["attrs"]["rope"] == "post"
    assert len(dump["layers"]) == 2

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor(dump["tokens"], dtype=torch.long)
    assert ids.shape == (1, len(WORDS))
    with torch.inference_mode():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    records, _ = capture_hf.capture(model, ids)
    for i, layer in enumerate(dump["layers"]):
        keys, values = cache_layer(cache, i)
        assert layer["k"].shape == (1, 2, len(WORDS), 16)  # Hkv = 2: GQA kept, not repeated
        np.testing.assert_array_equal(layer["k"], keys.numpy())
        np.testing.assert_array_equal(layer["v"], values.numpy())
        # The captured queries reproduce the model's attention output (causal, GQA 2:1).
        q, k, v = (layer[n][0].astype(np.float64) for n in ("q", "k", "v"))
        T = q.shape[1]
        want = records[i]["out"][0].numpy()  # [T, Hq, D]
        for h in range(q.shape[0]):
            s = q[h] @ k[h // 2].T * layer["softmax_scale"]
            s[np.triu_indices(T, 1)] = -np.inf
            p = np.exp(s - s.max(axis=1, keepdims=True))
            o = (p / p.sum(axis=1, keepdims=True)) @ v[h // 2]
            np.testing.assert_allclose(o, want[:, h], rtol=1e-4, atol=1e-5)


def test_bf16_model_stored_exactly_as_bfloat16(tiny_model_dir, tmp_path):
    out = tmp_path / "tiny-bf16.h5"
    capture_hf.main(["--model", str(tiny_model_dir), "--prompt", "once upon a time", "--out", str(out),
                     "--device", "cpu", "--torch-dtype", "bfloat16"])
    import h5py
    with h5py.File(out) as f:
        t = f["layers/0/k"].id.get_type()
        assert (t.get_size(), t.get_fields(), t.get_ebias()) == (2, (15, 7, 8, 0, 7), 127)


# ---- kvq eval through the attention hook (needs the kvq module too) -------------------------------
def eval_module():
    kvq = pytest.importorskip("kvq", reason="the kvq Python module (pip install . or PYTHONPATH=build/python)")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "eval"))
    import kvq_eval
    return kvq, kvq_eval


def test_eval_reports_exact_zero_for_an_unquantized_cache(tiny_model_dir, tmp_path):
    _, kvq_eval = eval_module()
    text = tmp_path / "text.txt"
    text.write_text(" ".join(WORDS * 2))
    out = tmp_path / "eval"
    assert kvq_eval.main(["--model", str(tiny_model_dir), "--text", str(text), "--device", "cpu", "--torch-dtype",
                          "float32", "--k", "none,int8-head,int4-chan-t4-asym", "--v", "none,int4-token",
                          "--out", str(out), "--no-plot"]) == 0
    import csv
    rows = {(r["k_scheme"], r["v_scheme"]): r for r in csv.DictReader(open(out / "eval.csv"))}
    assert len(rows) == 6 and all(r["tokens"] == str(2 * len(WORDS)) for r in rows.values())
    exact = rows[("none", "none")]
    assert (float(exact["kld_mean"]), float(exact["kld_max"]), float(exact["ppl_delta"])) == (0.0, 0.0, 0.0)
    assert float(rows[("int4-chan-t4-asym", "int4-token")]["kld_mean"]) > 0
    assert float(rows[("int8-head", "none")]["out_rel_l2_mean"]) > 0


def test_reference_run_is_the_models_own_forward_pass(tiny_model_dir):
    _, kvq_eval = eval_module()
    runner = kvq_eval.HfRunner(str(tiny_model_dir), "cpu", "float32")
    tokens = runner.tokenize(" ".join(WORDS))
    logits, layers = runner.run(tokens, "none", "none", record=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        want = model(input_ids=torch.tensor([tokens])).logits[0].double().numpy()
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)
    assert layers[0]["k"].shape == (1, 2, len(tokens), 16) and layers[0]["q"].shape == (1, 4, len(tokens), 16)


def test_bf16_storage_of_a_bf16_model_is_exact(tiny_model_dir):
    _, kvq_eval = eval_module()
    runner = kvq_eval.HfRunner(str(tiny_model_dir), "cpu", "bfloat16")
    rows = kvq_eval.evaluate(kvq_eval.eval_engines.CpuEngine(runner), [runner.tokenize(" ".join(WORDS))],
                             [("bf16", "bf16"), ("int8-head", "int8-head")], log=lambda *_: None)
    assert (rows[0]["kld_max"], rows[0]["ppl_delta"]) == (0.0, 0.0)
    assert rows[1]["kld_max"] > 0


@pytest.mark.parametrize("scheme", ["int8-head", "int4-g8-asym", "int4-chan-t4-asym"])
def test_append_through_the_hook_gives_whole_cache_codes(tiny_model_dir, scheme):
    kvq, _ = eval_module()
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    given = {}

    class Recording(kvq.AppendQuantizer):
        def append(self, x):
            given.setdefault(self.name, []).append(x)
            return super().append(x)

    made = {}

    def storages(layer):
        made[layer] = (Recording(scheme, f"{layer} K"), Recording(scheme, f"{layer} V"))
        return made[layer]

    tokens = list(range(1, 15))
    capture_hf.run_stored(model, tokens, storages)
    for layer, pair in made.items():
        for storage in pair:
            whole = np.concatenate(given[storage.name], axis=2)
            n = storage.quantized_tokens
            assert n == (12 if "chan" in scheme else 14)
            want = kvq.quantize(whole[:, :, :n], scheme)
            assert storage.result().codes.tobytes() == want.codes.tobytes()
            assert storage.result().scales.tobytes() == want.scales.tobytes()


def test_torch_tensors_go_in_without_numpy():
    kvq, _ = eval_module()
    x = torch.randn(2, 3, 5, 8)
    want = kvq.quantize(x.numpy(), "int4-g4-asym")
    assert kvq.quantize(x, "int4-g4-asym").codes.tobytes() == want.codes.tobytes()
    assert kvq.quantize(x.transpose(1, 2), "int4-g4-asym", layout="bsnh").codes.tobytes() == want.codes.tobytes()
    b = x.to(torch.bfloat16)
    assert kvq.quantize(b, "int8-head").codes.tobytes() == kvq.quantize(b.float().numpy(), "int8-head").codes.tobytes()
    o, lse = kvq.attention(x, x[:, :1], x[:, :1])
    assert o.shape == (2, 3, 5, 8)
