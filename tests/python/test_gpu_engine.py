"""kvq eval's GPU engine (experiments/eval/gpu_engine.py) against the CPU path it replaces: the
quantized values bit-identical to kvq.quantize for every default scheme, attention with the
quantize-on-append rule equal to sequence_eval.attend, and whole runs (GGUF in both channel orders,
a Hugging Face model, windows, two GPUs where there are two) equal to the CPU engine's. Skipped
where kvq was built without its kernels, torch is missing or there is no CUDA device (CI);
scripts/device_run.sh runs it."""
import os
import sys

import numpy as np
import pytest

import kvq
import kvq.gpu

if not kvq.gpu.available():
    pytest.skip(kvq.gpu.why_unavailable(), allow_module_level=True)

import torch  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "experiments", "eval"))
sys.path.insert(0, os.path.join(ROOT, "data"))
import eval_engines  # noqa: E402
import gpu_engine  # noqa: E402
import kvq_eval  # noqa: E402
import sequence_eval  # noqa: E402


def default_schemes(head_dim):
    names = {s.name for pair in kvq.default_pairs(head_dim) for s in pair}
    return sorted(names | {"int4-chan-t32-asym+w128", "int8-token+w16", "q4_0+had", "nvfp4", "int4-head-asym+had+w8"})


def kv_like(shape, seed):
    """K-like values: outlier channels, a large first token (an attention sink)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * (1 + 8 * (torch.rand(shape[-1], generator=g) > 0.9))
    x[..., 0, :] *= 20
    return x


@pytest.mark.parametrize("head_dim", [64, 128])
def test_quantized_values_are_bit_identical_to_kvq_quantize(head_dim):
    x = kv_like((1, 3, 203, head_dim), 3)
    for name in default_schemes(head_dim):
        base = gpu_engine.base_scheme(name)
        cache, values = gpu_engine.quantized(x[0].cuda(), base)
        want = kvq.quantize(x.numpy(), base)
        assert cache.data.cpu().numpy().tobytes() == np.asarray(want.codes).tobytes(), name
        assert np.array_equal(values.cpu().numpy().view(np.uint32), want.dequantized[0].view(np.uint32)), name
        got = gpu_engine.stored_values(x[0].cuda(), name).cpu().numpy()
        np.testing.assert_array_equal(got, sequence_eval.stored_values(x[0].numpy(), name), err_msg=name)


def test_dequantize_refuses_what_it_cannot_read():
    c = kvq.gpu.quantize(kv_like((1, 2, 8, 64), 1).cuda(), "int8-head")
    with pytest.raises(kvq.InputError, match="out"):
        kvq.gpu._gpu.dequantize(c.data, "int8-head", 64, c.scales.view(torch.uint8), None, None,
                                torch.empty(1, 2, 8, 32, device="cuda"), 0)
    with pytest.raises(kvq.InputError, match="planar Cache"):
        kvq.gpu.dequantize(kvq.gpu.raw(torch.zeros(1, 1, 2, 64, dtype=torch.bfloat16, device="cuda")))


@pytest.mark.parametrize("k_name,v_name", [("int4-chan-t32-asym+w128", "int4-g32-asym+w128"), ("int8-chan-t8", "none"),
                                           ("q4_0+had", "int8-token+w5"), ("fp16", "int4-head-asym")])
def test_attention_equals_the_cpu_paths(k_name, v_name):
    Hq, Hkv, T, D = 6, 2, 300, 64
    q, k, v = kv_like((1, Hq, T, D), 1)[0], kv_like((1, Hkv, T, D), 2)[0], kv_like((1, Hkv, T, D), 3)[0] * 0.1
    scale = 0.125
    want = sequence_eval.attend(q.numpy(), sequence_eval.CacheView(k.numpy(), k_name),
                                sequence_eval.CacheView(v.numpy(), v_name), scale, block=64)
    saved = gpu_engine.SCORE_BYTES
    gpu_engine.SCORE_BYTES = 4 * Hq * T * 37  # blocks of 37 queries: the band logic across block edges
    try:
        with gpu_engine.float32_arithmetic():
            got = gpu_engine.attend(q.cuda(), gpu_engine.CacheView(k.cuda(), k_name),
                                    gpu_engine.CacheView(v.cuda(), v_name), scale)
    finally:
        gpu_engine.SCORE_BYTES = saved
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=2e-4, atol=2e-5)


def test_attention_error_equals_the_cpu_paths():
    Hq, Hkv, T, D = 4, 2, 96, 64
    q, k, v = kv_like((1, Hq, T, D), 4), kv_like((1, Hkv, T, D), 5), kv_like((1, Hkv, T, D), 6)
    layers = [{"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "softmax_scale": 0.125}]
    rec = gpu_engine.Recorded()
    rec.add(0, q[0].cuda(), k[0].cuda(), v[0].cuda(), 0.125)
    for pair in [("int4-head-asym", "int8-token+w16"), ("int4-chan-t32-asym+w40", "none")]:
        want = eval_engines.attention_error(layers, *pair)
        with torch.inference_mode(), gpu_engine.float32_arithmetic():
            got = rec.error(*pair)
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-3), (pair, key)


def close(gpu_row, cpu_row, rel=0.01):
    for key in ("kld_mean", "kld_max", "ppl_delta", "out_rel_l2_mean"):
        g, c = gpu_row[key], cpu_row[key]
        assert abs(g - c) <= max(1e-7, rel * abs(c)), (gpu_row["k_scheme"], gpu_row["v_scheme"], key, g, c)


PAIRS = [("none", "none"), ("fp16", "fp16"), ("int8-head", "int8-head"), ("int4-chan-t32-asym+w128", "int4-g32-asym+w128"),
         ("q4_0", "q4_0"), ("q8_0+had", "fp16"), ("nvfp4", "nvfp4")]


@pytest.fixture(scope="module")
def smollm2():
    gguf_llama = pytest.importorskip("gguf_llama")
    try:
        gguf_llama.find_model(None)
    except (OSError, ValueError) as e:
        pytest.skip(f"SmolLM2's GGUF file: {e}")
    return kvq_eval.REAL_TEXT


@pytest.mark.parametrize("order", ["hf", "llamacpp"])
def test_gguf_engine_equals_the_cpu_path(smollm2, order):
    """In float64 (float32's rounding noise alone moves a KLD by a few %: a code near a rounding
    boundary flips, and the flip propagates through the later layers), the two engines agree."""
    cpu = eval_engines.CpuEngine(kvq_eval.GgufRunner("smollm2", order, "float64"))
    gpu = eval_engines.gguf_gpu_engine("smollm2", order, 1, "float64")
    with open(smollm2) as f:
        tokens = cpu.tokenize(f.read())[:160]
    quiet = lambda *_: None  # noqa: E731
    for c, g in zip(kvq_eval.evaluate(cpu, [tokens], PAIRS, log=quiet), kvq_eval.evaluate(gpu, [tokens], PAIRS, log=quiet)):
        close(g, c)
    exact = kvq_eval.evaluate(gpu, [tokens], PAIRS[:1], log=quiet)[0]
    assert (exact["kld_max"], exact["ppl_delta"], exact["out_rel_l2_mean"]) == (0.0, 0.0, 0.0)


def test_windows_and_two_gpus(smollm2, tmp_path):
    """--ctx windows give per-window rows whose positions add up; a model over two GPUs (where there
    are two) gives the one-GPU numbers."""
    gpu = eval_engines.gguf_gpu_engine("smollm2", "hf", 1)
    with open(smollm2) as f:
        tokens = gpu.tokenize(f.read())[:300]
    wins = [tokens[:100], tokens[100:200], tokens[200:300]]
    quiet = lambda *_: None  # noqa: E731
    rows = kvq_eval.evaluate(gpu, wins, PAIRS[2:4], log=quiet)
    for r in rows:
        assert [w["first_token"] for w in r["windows"]] == [0, 100, 200]
        assert r["kld_mean"] == pytest.approx(np.mean([w["kld_mean"] for w in r["windows"]]), rel=1e-12)
        assert r["kld_max"] == max(w["kld_max"] for w in r["windows"])
    one = kvq_eval.evaluate(gpu, wins[:1], PAIRS[2:4], log=quiet)
    for r, o in zip(rows, one):
        assert r["windows"][0]["kld_mean"] == o["kld_mean"]
    if torch.cuda.device_count() < 2:
        pytest.skip("one CUDA device: the two-GPU placement runs on the 2-GPU machine")
    two = kvq_eval.evaluate(eval_engines.gguf_gpu_engine("smollm2", "hf", 2), wins[:1], PAIRS[2:4], log=quiet)
    for r, o in zip(two, one):
        close(r, o)


def test_hf_engine_equals_the_token_by_token_path():
    pytest.importorskip("transformers")
    import gpu_models
    config = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=300, max_position_embeddings=512, tie_word_embeddings=False)
    model = gpu_models.random_hf_model(config, torch.float32, seed=1, device="cuda:0")
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, 300, 96)]
    gpu = eval_engines.GpuEngine(gpu_models.HfModel(model), "hf", 2, 32, 512, 32, None)
    cpu = eval_engines.CpuEngine(kvq_eval.HfRunner(None, "cuda", "float32", model=model))  # token by token, same weights
    pairs = [("none", "none"), ("int8-head", "int4-token-asym"), ("int4-chan-t16-asym+w32", "int8-head+w8")]
    quiet = lambda *_: None  # noqa: E731
    for c, g in zip(kvq_eval.evaluate(cpu, [tokens], pairs, log=quiet), kvq_eval.evaluate(gpu, [tokens], pairs, log=quiet)):
        for key in ("kld_mean", "ppl_delta"):  # decode steps vs one prefill: float32 GEMMs differ by ~1e-6
            assert abs(g[key] - c[key]) <= max(1e-6, 0.02 * abs(c[key])), (g["k_scheme"], key, g[key], c[key])
