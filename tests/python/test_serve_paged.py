"""experiments/eval/serve_paged.py, the serving-loop example, on a small random Llama: the CUDA graph of
the whole decode step replays eager's steps bit for bit, torch.compile(fullgraph=True) runs the same
steps, and the loop's next-token distributions match the eval's quantize-on-append reference (the
model's float32 forward over the same tokens with the same cache storages). Skipped where kvq was
built without its kernels or there is no CUDA device (CI); scripts/device_run.sh runs it."""
import os
import sys
import types

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
import gpu_models  # noqa: E402
import serve_paged  # noqa: E402


def random_gguf_model(seed=0, layers=2, hidden=256, Hq=6, Hkv=2, D=64, inter=512, vocab=300, order="hf"):
    """A GgufModel (float32) of random weights, scaled so that logits are peaked: greedy tokens are
    well defined."""
    rng = np.random.default_rng(seed)
    w = lambda *shape: rng.normal(0.0, shape[-1] ** -0.5, (layers, *shape)).astype(np.float32)  # noqa: E731
    m = types.SimpleNamespace(n_layers=layers, head_dim=D, n_heads=Hq, n_kv_heads=Hkv, rope_theta=10000.0, norm_eps=1e-5,
                              rope_order=order, emb=rng.normal(0, 1, (vocab, hidden)).astype(np.float32),
                              rms_att=np.ones((layers, hidden), np.float32), rms_ffn=np.ones((layers, hidden), np.float32),
                              wq=w(Hq * D, hidden) * 2, wk=w(Hkv * D, hidden) * 2, wv=w(Hkv * D, hidden),
                              wo=w(hidden, Hq * D), w1=w(inter, hidden), w3=w(inter, hidden), w2=w(hidden, inter),
                              rms_final=np.ones(hidden, np.float32))
    m.wcls = rng.normal(0, 4 * hidden ** -0.5, (vocab, hidden)).astype(np.float32)
    return gpu_models.GgufModel(m, [torch.device("cuda:0")], torch.float32)


def loop_against_reference(model, k_name, v_name, prompts, new_tokens):
    """(loop vs its reference, reference vs no quantization): serve_paged.compare of each; asserts
    that the CUDA graph replays the eager steps bit for bit."""
    weights, hp = serve_paged.weights_of(model, torch.float32), serve_paged.hparams_of(model)
    B, p = prompts.shape
    loop = serve_paged.PagedLlama(weights, hp, k_name, v_name, batch=B, max_tokens=p + new_tokens, page_tokens=16)
    tokens, logits, _ = serve_paged.run_loop(loop, prompts, new_tokens, "eager")
    assert torch.equal(tokens[:, :p], prompts)
    graph_tokens, graph_logits, _ = serve_paged.run_loop(loop, prompts, new_tokens, "graph")
    assert torch.equal(graph_tokens, tokens) and torch.equal(graph_logits, logits)
    ref = serve_paged.reference_logits(model, tokens, k_name, v_name)
    return (serve_paged.compare(logits, ref),
            serve_paged.compare(ref, serve_paged.reference_logits(model, tokens, "none", "none")))


@pytest.mark.parametrize("k_name,v_name,order", [("int8-head", "q4_0", "llamacpp"), ("int4-g32-asym+had", "int8-token", "hf"),
                                                 ("int8-head", "int8-head", "hf"),
                                                 ("int4-g32-asym+w16", "int8-head+w8", "hf")])
def test_graph_replays_eager_and_the_loop_matches_the_reference(k_name, v_name, order):
    model = random_gguf_model(order=order)
    prompts = torch.randint(0, model.vocab_size, (3, 9), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    floor, _ = loop_against_reference(model, "bf16", "bf16", prompts, 36)
    got, cost = loop_against_reference(model, k_name, v_name, prompts, 36)
    # float32 weights and activations: the loop differs from its reference by the kernel's bf16 Q, P and
    # O (the floor: the same loop over a bf16 cache) and by codes whose rounding a K or V computed one
    # row at a time (not in the reference's whole-sequence products) tips: small beside what the
    # quantization itself costs (reference vs no quantization)
    assert floor["top1"] >= 0.97 and floor["kl_mean"] < 2e-4, floor
    assert got["top1"] >= 0.97 and got["kl_mean"] < 5 * floor["kl_mean"] + 0.05 * cost["kl_mean"], (got, floor, cost)


def test_compiled_step_has_no_graph_breaks_and_follows_eager():
    model = random_gguf_model(seed=3)
    weights, hp = serve_paged.weights_of(model, torch.float32), serve_paged.hparams_of(model)
    prompts = torch.randint(0, hp["vocab"], (2, 5), device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    loop = serve_paged.PagedLlama(weights, hp, "int8-head", "q4_0", batch=2, max_tokens=20)
    tokens, logits, _ = serve_paged.run_loop(loop, prompts, 15, "eager")
    c_tokens, c_logits, _ = serve_paged.run_loop(loop, prompts, 15, "compile")  # fullgraph: a break raises
    assert serve_paged.compare(c_logits, logits)["kl_max"] < 1e-4
    assert (c_tokens == tokens).float().mean() > 0.9


def test_the_command_times_a_random_published_config(tmp_path, capsys):
    result = serve_paged.main(["--random", "llama3.2-1b", "--pairs", "bf16/bf16,int8-head/q4_0,int4-chan-t32-asym/int8-head+w16",
                               "--batch", "2", "--page-tokens", "32",
                               "--prompt-tokens", "3", "--new-tokens", "4", "--modes", "eager,graph",
                               "--out", str(tmp_path)])
    assert [(r["k"], r["v"]) for r in result["rows"]] == [("bf16", "bf16"), ("int8-head", "q4_0"),
                                                          ("int4-chan-t32-asym", "int8-head+w16")]
    for r in result["rows"]:
        assert r["modes"]["graph"]["tokens_equal_eager"] and r["modes"]["graph"]["logits_bitwise_eager"]
        assert r["append_us"] > 0 and r["decode_us"] > 0 and "vs_reference" not in r
    assert os.path.isfile(tmp_path / "serve_paged.json")
    assert "| int8-head / q4_0 |" in capsys.readouterr().out


def test_the_command_refuses_what_it_cannot_append():
    with pytest.raises(SystemExit, match="nvfp4 appends with a calibrated"):
        serve_paged.parse_pairs("bf16/nvfp4")
    with pytest.raises(kvq.SchemeError, match="does not read a rotated"):
        serve_paged.parse_pairs("int4-chan-t32-asym+had/bf16")
    with pytest.raises(SystemExit, match="--page-tokens 16 is not a multiple of 32"):
        serve_paged.parse_pairs("int4-chan-t32-asym/bf16", 16)
    with pytest.raises(SystemExit, match="is not K/V"):
        serve_paged.parse_pairs("int8-head")


@pytest.mark.parametrize("argv,message", [(["--page-tokens", "24"], "--page-tokens 24: kvq's paged decode reads pages"),
                                          (["--page-tokens", "8"], "--page-tokens 8: kvq's paged decode reads pages"),
                                          (["--new-tokens", "0"], "--new-tokens 0: expected >= 1")])
def test_the_command_refuses_sizes_before_loading_anything(argv, message, capsys):
    with pytest.raises(SystemExit):
        serve_paged.main(["--random", "llama3.2-1b"] + argv)
    assert message in capsys.readouterr().err
