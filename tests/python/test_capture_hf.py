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
