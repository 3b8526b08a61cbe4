"""kvq eval --runtime llama.cpp (experiments/eval/llamacpp_runtime.py): each weight product's input
rounded as llama.cpp's CPU backend rounds it, checked against ggml's reference quantizers written out
here element by element, and the runtime end to end on test_gguf_llama's tiny GGUF Llama."""
import json
import os
import sys

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [HERE, os.path.join(ROOT, "data"), os.path.join(ROOT, "experiments", "eval")]
import gguf_llama  # noqa: E402
import kvq_eval  # noqa: E402
import llama_forward  # noqa: E402
import llamacpp_runtime as rt  # noqa: E402
import test_gguf_llama as tiny_gguf  # noqa: E402

TEXT = " ".join(["hello world dog cat 20"] * 12)


def fp16(x):
    return np.float32(np.float16(x))


def ggml_q8_0_ref(row):
    """ggml-quants.c quantize_row_q8_0_ref then dequantize_row_q8_0, one block of 32 at a time."""
    out = []
    for block in np.asarray(row, np.float32).reshape(-1, 32):
        d = np.float32(np.abs(block).max()) / np.float32(127)
        inv = np.float32(1) / d if d else np.float32(0)
        codes = [int(np.copysign(np.floor(abs(v * inv) + 0.5), v * inv)) for v in block]  # roundf
        out += [np.float32(c) * fp16(d) for c in codes]
    return np.array(out, np.float32)


def ggml_q8_k_ref(row):
    """quantize_row_q8_K_ref then dequantize_row_q8_K, one block of 256 at a time."""
    out = []
    for block in np.asarray(row, np.float32).reshape(-1, 256):
        amax, peak = np.float32(0), np.float32(0)
        for v in block:
            if abs(v) > amax:
                amax, peak = abs(v), v
        if not amax:
            out += [np.float32(0)] * 256
            continue
        iscale = np.float32(-127) / peak
        codes = [min(127, int(np.rint(iscale * v))) for v in block]
        d = np.float32(1) / iscale
        out += [np.float32(c) * d for c in codes]
    return np.array(out, np.float32)


def test_q8_inputs_are_ggml_reference_quantizers():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 512)) * np.array([[0.01], [1.0], [300.0]])).astype(np.float32)
    x[1, 32:64] = 0.0  # an all-zero block
    x[2, :256] = np.round(x[2, :256])  # integers: ties under the q8_K scale
    x[2, 7] = -1000.0  # the block's peak negative: q8_K's scale changes sign
    for fmt in ("q8_0", "q8_1"):
        got = rt.convert(x, fmt)
        assert got.shape == x.shape and got.dtype == np.float32
        np.testing.assert_array_equal(got, np.stack([ggml_q8_0_ref(r) for r in x]))
    np.testing.assert_array_equal(rt.convert(x, "q8_K"), np.stack([ggml_q8_k_ref(r) for r in x]))
    np.testing.assert_array_equal(rt.convert(x, "fp16"), x.astype(np.float16).astype(np.float32))
    assert rt.convert(x, None) is x
    assert not np.array_equal(rt.convert(x, "q8_0"), x)


def test_inputs_that_do_not_fill_a_block_are_refused():
    with pytest.raises(ValueError, match="a q8_K input of 288 elements: not a multiple of its 256-element block"):
        rt.convert(np.ones((2, 288), np.float32), "q8_K")
    with pytest.raises(ValueError, match="a q8_0 input of 40 elements"):
        rt.convert(np.ones((2, 40), np.float32), "q8_0")


def test_vec_dot_types_follow_ggml_cpu():
    assert rt.VEC_DOT_INPUT["Q4_1"] == rt.VEC_DOT_INPUT["Q5_1"] == "q8_1"
    assert all(rt.VEC_DOT_INPUT[t] == "q8_0" for t in ("Q4_0", "Q5_0", "Q8_0", "IQ4_NL", "MXFP4"))
    assert all(rt.VEC_DOT_INPUT[t] == "q8_K" for t in ("Q2_K", "Q4_K", "Q6_K", "IQ4_XS"))
    assert (rt.VEC_DOT_INPUT["F32"], rt.VEC_DOT_INPUT["F16"], rt.VEC_DOT_INPUT["BF16"]) == (None, "fp16", "bf16")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "text.txt").write_text(TEXT)
    path = tiny_gguf.write_gguf(folder / "tiny.gguf", tiny_gguf.hf_weights(3))
    return path, folder / "text.txt", gguf_llama.GgufLlama(str(path), cache_dir=folder / "cache")


def test_every_product_takes_its_weight_types_input(tiny, monkeypatch):
    _, _, m = tiny
    inputs = rt.MatmulInputs(m)
    assert inputs.describe() == {"q8_1": 7 * tiny_gguf.LAYERS, "q8_0": 1}  # Q4_1 layers, the tied Q8_0 classifier
    seen = []

    def recording(x, attr, layer):
        seen.append((attr, layer))
        return inputs(x, attr, layer)

    tokens = list(range(2, 12))
    plain = llama_forward.forward_sequence(m, tokens, record=False)[0]
    same = llama_forward.forward_sequence(m, tokens, record=False, convert_input=lambda x, a, l: x)[0]
    rounded = llama_forward.forward_sequence(m, tokens, record=False, convert_input=recording)[0]
    np.testing.assert_array_equal(plain, same)
    assert not np.array_equal(plain, rounded) and np.allclose(plain, rounded, atol=0.5)
    products = ["wq", "wk", "wv", "wo", "w1", "w3", "w2"]
    assert seen == [(a, i) for i in range(tiny_gguf.LAYERS) for a in products] + [("wcls", None)]

    types = {k: (list(v) if isinstance(v, list) else v) for k, v in m.weight_types().items()}
    types["w2"][1] = "Q9_9"
    monkeypatch.setattr(m, "weight_types", lambda: types)
    with pytest.raises(ValueError, match="layer 1 w2 is stored as Q9_9, a type --runtime llama.cpp does not know"):
        rt.MatmulInputs(m)


def run_eval(tiny, out, *args):
    path, text, _ = tiny
    return kvq_eval.main(["--model", str(path), "--text", str(text), "--max-tokens", "40", "--out", str(out),
                          "--no-plot", "--engine", "cpu", *args])


def test_eval_under_llama_cpp_runtime_measures_against_the_f16_cache(tiny, tmp_path):
    import csv
    assert run_eval(tiny, tmp_path / "rt", "--runtime", "llama.cpp", "--k", "none,fp16,int8-head",
                    "--v", "fp16") == 0
    rows = {(r["k_scheme"], r["v_scheme"]): r for r in csv.DictReader(open(tmp_path / "rt" / "eval.csv"))}
    assert float(rows[("fp16", "fp16")]["kld_mean"]) == 0.0  # the reference itself
    assert float(rows[("none", "fp16")]["kld_mean"]) > 0  # an f32 K cache is a change under this runtime too
    meta = json.load(open(tmp_path / "rt" / "eval.json"))[0]
    assert meta["runtime"] == "llama.cpp" and meta["reference_cache"] == "fp16/fp16"
    # the exact runtime of the same pair differs: the products' 8-bit inputs are part of the number
    assert run_eval(tiny, tmp_path / "exact", "--k", "int8-head", "--v", "fp16") == 0
    exact = next(csv.DictReader(open(tmp_path / "exact" / "eval.csv")))
    assert json.load(open(tmp_path / "exact" / "eval.json"))[0]["runtime"] == "exact"
    assert float(exact["kld_mean"]) != float(rows[("int8-head", "fp16")]["kld_mean"])


@pytest.mark.parametrize("extra, why", [(["--precision", "float64"], "GGUF models on the CPU path in float32"),
                                        (["--engine", "gpu"], "GGUF models on the CPU path")])
def test_llama_cpp_runtime_refusals(tiny, tmp_path, capsys, extra, why):
    path, text, _ = tiny
    args = ["--model", str(path), "--text", str(text), "--max-tokens", "20", "--out", str(tmp_path), "--no-plot",
            "--runtime", "llama.cpp", "--k", "fp16", "--v", "fp16", *extra]
    assert kvq_eval.main(args) == 2
    assert f"--runtime llama.cpp: {why}" in capsys.readouterr().err


def test_llama_cpp_runtime_refuses_a_llama2c_model(tmp_path, capsys):
    assert kvq_eval.main(["--model", "stories260k", "--max-tokens", "20", "--out", str(tmp_path), "--no-plot",
                          "--runtime", "llama.cpp", "--k", "fp16", "--v", "fp16"]) == 2
    assert "--runtime llama.cpp: GGUF models" in capsys.readouterr().err
