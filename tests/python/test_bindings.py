"""The kvq Python module against the kvq command line: byte-for-byte equal codes, scales, zero points
and dequantized values for every scheme on random and special values, the same reference attention
and metrics, and kvq's errors as Python exceptions with kvq's own messages. ctest puts build/python
on PYTHONPATH and names the binary in KVQ_BIN."""
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

import kvq

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUNDLED = os.path.join(ROOT, "data", "dumps", "stories260k.h5")
sys.path.insert(0, os.path.join(ROOT, "data"))
import kvq_dump  # noqa: E402

# Every granularity (chan-t3 and chan-t16 leave a partial token group at T = 37) x symmetry x scale dtype.
SCHEMES = [f"int{bits}-{gran}{sym}{dtype}" for bits in (8, 4) for gran in ("tensor", "token", "head", "g4", "g8",
                                                                            "chan-t3", "chan-t16")
           for sym in ("", "-asym") for dtype in ("", "-fp32")]
SCHEMES += ["fp8-e4m3-tensor", "fp8-e4m3-token", "fp8-e4m3-head", "fp8-e5m2-g8-fp32", "fp8-e4m3-g4-fp32",
            "fp8-e5m2-head", "fp8-e4m3", "fp8-e5m2", "int4-g8-asym+had", "fp8-e4m3-head+had"]


def kvq_cli(*args):
    binary = os.environ.get("KVQ_BIN", os.path.join(ROOT, "build", "experiments", "kvq"))
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True)


def special_values(seed, shape=(2, 3, 37, 16)):
    """Random rows of very different magnitudes, plus rows of exact ties, zeros of both signs,
    constants, fp16's largest value, subnormal and tiny values."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-6, 4, shape[:3] + (1,)))).astype(np.float32)
    x[0, 0, 0] = [63.5, 0.25, 0.75, -1.25, 2.25, -0.25, 3.75, 1.75] * 2  # int8 scale 0.5: x / s = n + 1/2
    x[0, 0, 1] = 0.0
    x[0, 0, 2] = np.where(np.arange(16) % 2, -0.0, 0.0)
    x[0, 1, 3] = -3.0  # a constant row round-trips exactly
    x[0, 1, 4, :8] = 65504.0
    x[0, 1, 4, 8:] = -65504.0
    x[1, 2, 5] = np.float32(1e-40) * np.arange(1, 17)  # fp32 subnormals
    x[1, 2, 6] = 2.0 ** -24 * np.arange(-8, 8)  # fp16 subnormal steps
    x[1, 0, 7:9] = 1e-30
    return x


def quantize_with_cli(tmp_path, x, k_scheme, v_scheme, dtype="float32"):
    dump, out = tmp_path / f"in-{dtype}.h5", tmp_path / "q.h5"
    if not dump.exists():
        kvq_dump.write_dump(dump, [{"k": x, "v": x[:, ::-1].copy()}], source="test", created_by="test", rope="none",
                            dtype=dtype)
    r = kvq_cli("quantize", dump, "--k", k_scheme, "--v", v_scheme, "--out", out)
    assert r.returncode == 0, r.stderr
    return h5py.File(out)


def assert_same_as_file(result, group):
    codes = group["codes"][...]
    assert result.codes.dtype == codes.dtype and result.codes.tobytes() == codes.tobytes()
    if "scales" in group:
        assert result.scales.dtype == group["scales"].dtype and result.scales.tobytes() == group["scales"][...].tobytes()
    else:  # scale-free FP8
        assert result.scheme.scale_free and result.scales.size == 0
    if "zero_points" in group:
        assert result.zero_points.tobytes() == group["zero_points"][...].tobytes()
    else:
        assert result.zero_points is None
    assert result.dequantized.tobytes() == group["dequantized"][...].tobytes()
    assert kvq.sqnr_db(group["dequantized"][...], group["dequantized"][...]) == np.inf


@pytest.mark.parametrize("k_scheme,v_scheme", list(zip(SCHEMES[0::2], SCHEMES[1::2])))
def test_every_scheme_byte_for_byte_equal_to_kvq_quantize(tmp_path, k_scheme, v_scheme):
    x = special_values(seed=len(k_scheme))
    with quantize_with_cli(tmp_path, x, k_scheme, v_scheme) as f:
        k = kvq.quantize(x, k_scheme)
        assert_same_as_file(k, f["layers/0/k"])
        assert k.shape == x.shape and k.scheme == kvq.parse_scheme(k_scheme)
        if not k.scheme.hadamard:  # +had: the file's SQNR is against the rotated input
            assert kvq.sqnr_db(x, k.dequantized) == f["layers/0/k"].attrs["sqnr_db"]
        v = kvq.quantize(x[:, ::-1], v_scheme)  # a negative-stride view, read in place
        assert_same_as_file(v, f["layers/0/v"])
        # the stored arrays decode to the same values again
        g = f["layers/0/k"]
        scales = g["scales"][...] if "scales" in g else np.zeros(0, np.float16)
        again = kvq.QuantizeResult(g["codes"][...], scales, g["zero_points"][...] if "zero_points" in g else None,
                                   scheme=k_scheme)
        assert kvq.dequantize(again).tobytes() == g["dequantized"][...].tobytes()


@pytest.mark.parametrize("scheme", ["int8-head-asym", "int4-g8", "int4-chan-t16-asym-fp32"])
def test_float16_input_and_other_layouts(tmp_path, scheme):
    x16 = special_values(seed=7).clip(-60000, 60000).astype(np.float16)
    with quantize_with_cli(tmp_path, x16, scheme, scheme, dtype="float16") as f:
        assert_same_as_file(kvq.quantize(x16, scheme), f["layers/0/k"])
    x = special_values(seed=8)
    want = kvq.quantize(x, scheme)
    bsnh = np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    assert kvq.quantize(bsnh, scheme, layout="bsnh").codes.tobytes() == want.codes.tobytes()
    assert kvq.quantize(x.astype(np.float64), scheme).codes.tobytes() == want.codes.tobytes()  # exact in fp32
    rounded = kvq.quantize(x.astype(np.float64) * (1 + 2.0 ** -30), scheme)  # float64 rounds to float32 first
    assert rounded.codes.tobytes() == kvq.quantize((x.astype(np.float64) * (1 + 2.0 ** -30)).astype(np.float32),
                                                   scheme).codes.tobytes()


def test_results_are_read_only_views():
    r = kvq.quantize(special_values(seed=1), "int8-g4")
    assert not r.codes.flags.writeable and not r.dequantized.flags.writeable
    assert r.scales.shape == tuple(kvq.scale_shape("int8-g4", r.shape))


@pytest.mark.parametrize("extra", [[], ["--alibi", "--scale", "0.3"]])
def test_attention_equals_kvq_reference(tmp_path, extra):
    out = tmp_path / "ref.h5"
    r = kvq_cli("reference", BUNDLED, "--out", out, "--layers", "2", *extra)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f, h5py.File(BUNDLED) as src:
        q, k, v = (src[f"layers/2/{n}"][...] for n in ("q", "k", "v"))
        o, lse = kvq.attention(q, k, v, softmax_scale=0.3 if extra else 0.0, alibi=bool(extra))
        np.testing.assert_array_equal(o, f["layers/2/o"][...])
        np.testing.assert_array_equal(lse, f["layers/2/lse"][...])


def test_attention_varlen_gqa_against_numpy():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 6, 3, 10)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, 9, 10)).astype(np.float32) for _ in range(2))
    k[1, :, 5:] = np.nan  # padding beyond seq_lens never counts
    o, lse, p = kvq.attention(q, k, v, seq_lens=np.array([9, 5]), probabilities=True)
    for b, n in ((0, 9), (1, 5)):
        for h in range(6):
            kk, vv = k[b, h // 3, :n].astype(np.float64), v[b, h // 3, :n].astype(np.float64)
            for i in range(3):
                s = kk[:n - 3 + i + 1] @ q[b, h, i] / np.sqrt(10)
                w = np.exp(s - s.max())
                np.testing.assert_allclose(o[b, h, i], (w / w.sum()) @ vv[:n - 3 + i + 1], rtol=1e-12, atol=1e-14)
                np.testing.assert_allclose(p[b, h, i, :n - 3 + i + 1], w / w.sum(), rtol=1e-12)
                assert lse[b, h, i] == pytest.approx(s.max() + np.log(w.sum()), rel=1e-13)


def test_metrics_reproduce_the_committed_sweep():
    """The bundled sweep's row for layer 0, int8-head / int8-head, recomputed from Python."""
    import pandas as pd
    rows = pd.read_csv(os.path.join(ROOT, "experiments", "results", "stories260k", "sweep.csv"))
    row = rows[(rows.layer == 0) & (rows.k_scheme == "int8-head") & (rows.v_scheme == "int8-head")].iloc[0]
    with h5py.File(BUNDLED) as f:
        q, k, v = (f[f"layers/0/{n}"][...] for n in ("q", "k", "v"))
    kq, vq = kvq.quantize(k, "int8-head"), kvq.quantize(v, "int8-head")
    o_ref, _, p_ref = kvq.attention(q, k, v, probabilities=True)
    o, _, p = kvq.attention(q, kq.dequantized, vq.dequantized, probabilities=True)
    e, pe = kvq.output_error(o, o_ref), kvq.probability_error(p, p_ref, k=8)
    assert e.rel_l2_mean == pytest.approx(row.out_rel_l2_mean, rel=1e-8)
    assert e.rel_l2_max == pytest.approx(row.out_rel_l2_max, rel=1e-8)
    assert pe.kl_mean == pytest.approx(row.attn_kl_mean, rel=1e-8)
    assert pe.topk_overlap_mean == pytest.approx(row.attn_topk_overlap_mean, rel=1e-8)
    assert kvq.sqnr_db(k, kq.dequantized) == pytest.approx(row.k_sqnr_db, rel=1e-8)
    assert kvq.bytes_per_token_per_head("int8-head", k.shape) == row.k_bytes_per_token_head
    assert len(kvq.head_errors(o, o_ref)) == q.shape[0] * q.shape[1]


def cli_error(*args):
    r = kvq_cli(*args)
    assert r.returncode == 3, r.stderr
    prefix = "kvq: error: "
    assert r.stderr.startswith(prefix)
    return r.stderr[len(prefix):].strip()


def test_errors_carry_kvq_messages(tmp_path):
    with pytest.raises(kvq.SchemeError) as e:
        kvq.parse_scheme("int9-head")
    assert str(e.value) == cli_error("quantize", BUNDLED, "--k", "int9-head", "--v", "int8-head", "--out", tmp_path / "x.h5")
    with pytest.raises(kvq.SchemeError, match="^int4-g3: group size 3 does not divide head_dim 8$"):
        kvq.quantize(np.zeros((1, 1, 1, 8), np.float32), "int4-g3")
    assert isinstance(e.value, kvq.InputError) and isinstance(e.value, ValueError) and isinstance(e.value, kvq.Error)

    x = special_values(seed=2)
    x[1, 2, 5, 3] = np.nan
    dump = tmp_path / "nan.h5"
    kvq_dump.write_dump(dump, [{"k": x, "v": np.zeros_like(x)}], source="t", created_by="t", rope="none")
    with pytest.raises(kvq.InputError) as e:
        kvq.quantize(x, "int8-head", name=f"{dump} layer 0 K")
    assert str(e.value) == cli_error("quantize", dump, "--k", "int8-head", "--v", "int8-head", "--out", tmp_path / "q.h5")
    assert "[1, 2, 5, 3]" in str(e.value)

    big = np.full((1, 1, 2, 8), 1e7, np.float32)  # 1e7 / 127 overflows an fp16 scale
    kvq_dump.write_dump(tmp_path / "big.h5", [{"k": big, "v": big}], source="t", created_by="t", rope="none")
    with pytest.raises(kvq.InputError, match="use -fp32 scales") as e:
        kvq.quantize(big, "int8-head", name=f"{tmp_path / 'big.h5'} layer 0 K")
    assert str(e.value) == cli_error("quantize", tmp_path / "big.h5", "--k", "int8-head", "--v", "int8-head-fp32",
                                     "--out", tmp_path / "b.h5")
    assert kvq.quantize(big, "int8-head-fp32").dequantized.max() == pytest.approx(1e7, rel=1e-2)


@pytest.mark.parametrize("call,message", [
    (lambda: kvq.quantize(np.zeros((2, 8), np.float32), "int8-head"), r"x: expected 4 axes \[B, H, T, D\], got \[2, 8\]"),
    (lambda: kvq.quantize(np.zeros((1, 1, 1, 8), np.int32), "int8-head"), "dtype int32 is not a float type"),
    (lambda: kvq.quantize(np.zeros((1, 1, 1, 8), np.float32), "int8-head", layout="nhsd"), "layout 'nhsd'"),
    (lambda: kvq.quantize(np.zeros((1, 1, 1, 7), np.float32), "int4-head"), "needs an even head_dim, got 7"),
    (lambda: kvq.attention(np.zeros((1, 3, 1, 8), np.float32), *[np.zeros((1, 2, 4, 8), np.float32)] * 2),
     "^attention: num_q_heads 3 is not a multiple of num_kv_heads 2$"),
    (lambda: kvq.attention(*[np.zeros((1, 2, 4, 8), np.float32)] * 3, seq_lens=np.array([5])),
     r"seq_lens\[0\] = 5 is outside \[0, T=4\]"),
    # a negative int32 is read as itself (it read as 2^32 - 1: "value 4294967295 does not fit int32")
    (lambda: kvq.attention(*[np.zeros((1, 2, 4, 8), np.float32)] * 3, seq_lens=np.array([-1], np.int32)),
     r"seq_lens\[0\] = -1 is outside \[0, T=4\]"),
    (lambda: kvq.attention(*[np.zeros((1, 2, 4, 8), np.float32)] * 3, softmax_scale=float("nan")),
     r"softmax_scale nan must be finite and > 0"),
    (lambda: kvq.attention(*[np.zeros((1, 2, 4, 8), np.float32)] * 3, softmax_scale=-0.5),
     r"softmax_scale -0.5 must be finite and > 0"),
    (lambda: kvq.QuantizeResult(np.zeros((1, 1, 2, 8), np.uint8), np.ones(3, np.float16), scheme="int8-tensor"),
     r"scales: expected shape \[1\], got \[3\]"),
    (lambda: kvq.QuantizeResult(np.zeros((1, 1, 2, 8), np.uint8), np.ones(1, np.float16), scheme="int8-tensor-asym"),
     "zero_points must be given for asymmetric schemes only"),
    (lambda: kvq.QuantizeResult(np.zeros((1, 1, 2, 8), np.uint8), np.full(1, 0.1), scheme="int8-tensor"),
     r"scales\[0\] = 0.1 is not a finite float16 value"),
    (lambda: kvq.output_error(np.zeros((2, 3)), np.zeros((3, 2))), "expected equal shapes"),
])
def test_bad_input_raises_input_error(call, message):
    with pytest.raises(kvq.InputError, match=message):
        call()


def test_fp8_codes_windows_and_the_streaming_cache():
    x = np.array([[[[7.0, -3.5, 1.0, 0.1, -0.03125, 0.0, 2.0 ** -10, 5.3]]]], np.float32)
    r = kvq.quantize(x, "fp8-e4m3-head")  # the hand-computed group of tests/test_fp8.cpp
    assert r.codes.dtype == np.uint8 and r.codes.tobytes() == bytes([0x7e, 0xf6, 0x68, 0x4d, 0xc0, 0x00, 0x18, 0x7b])
    assert r.scales.tolist() == [[[2.0 ** -6]]]
    x = np.full((1, 1, 4, 8), 0.3, np.float32)
    w = kvq.quantize(x, "int8-head+w2")  # tokens 2 and 3 kept: code 0, exact value
    assert (w.codes[0, 0, 2:] == 0).all() and (w.dequantized[0, 0, 2:] == x[0, 0, 2:]).all()
    assert (w.codes[0, 0, :2] == 127).all() and (w.dequantized[0, 0, :2] != x[0, 0, :2]).all()
    with pytest.raises(kvq.InputError, match=r"int8-head\+w2: a \+w<W> result cannot be rebuilt"):
        kvq.QuantizeResult(w.codes, w.scales, scheme="int8-head+w2")
    # seq_lens place each sequence's window at its own end: sequence 1 is 3 tokens long, so only its token 0
    # is quantized; chan-t2 rounds the quantized prefix down to whole groups
    x2 = np.full((2, 1, 4, 8), 0.3, np.float32)
    w = kvq.quantize(x2, "int8-head+w2", seq_lens=np.array([4, 3]))
    assert (w.codes[0, 0, :2] == 127).all() and (w.codes[0, 0, 2:] == 0).all()
    assert (w.codes[1, 0, :1] == 127).all() and (w.codes[1, 0, 1:] == 0).all()
    c = kvq.quantize(x2, "int8-chan-t2+w1", seq_lens=np.array([4, 3]))
    assert (c.codes[0, 0, :2] == 127).all() and (c.codes[0, 0, 2:] == 0).all()  # len 4: 3 -> 2 tokens quantized
    assert (c.codes[1, 0, :2] == 127).all() and (c.codes[1, 0, 2:] == 0).all()  # len 3: 2 tokens quantized
    # the rule both follow, as kvq.quantized_length gives it (kvq.gate places its windows by it)
    assert [kvq.quantized_length("int8-chan-t2+w1", n) for n in (4, 3, 1, 0)] == [2, 2, 0, 0]
    assert kvq.quantized_length("int8-head+w2", 3) == 1 and kvq.quantized_length("int8-head", 7) == 7
    with pytest.raises(kvq.InputError, match="length -1 is negative"):
        kvq.quantized_length("int8-head+w2", -1)
    with pytest.raises(kvq.InputError, match=r"seq_lens\[1\] = 5: expected 0 .. T = 4"):
        kvq.quantize(x2, "int8-head+w2", seq_lens=np.array([4, 5]))


def test_hadamard_rotate_back_is_the_normalized_sylvester_matrix():
    sylvester = np.array([[1.0]])
    for _ in range(4):
        sylvester = np.block([[sylvester, sylvester], [sylvester, -sylvester]])
    h = sylvester / 4.0  # D = 16: 1/sqrt(16)
    x = np.random.default_rng(3).standard_normal((2, 3, 16)).astype(np.float32)
    back = kvq.hadamard_rotate_back(x)
    assert back.dtype == np.float64 and back.shape == x.shape
    np.testing.assert_allclose(back, x.astype(np.float64) @ h.T, rtol=0, atol=1e-14)
    np.testing.assert_allclose(kvq.hadamard_rotate_back(back), x, rtol=0, atol=1e-12)  # its own inverse
    with pytest.raises(kvq.InputError, match=r"last axis of x \[2, 12\] must be a power of two"):
        kvq.hadamard_rotate_back(np.zeros((2, 12)))


def test_scheme_objects_and_default_pairs():
    s = kvq.parse_scheme("int4-chan-t32-asym-fp32")
    assert (s.bits, s.granularity, s.group, s.asymmetric, s.scale_dtype) == (4, "channel", 32, True, "float32")
    assert str(s) == s.name == "int4-chan-t32-asym-fp32" and repr(s) == "Scheme('int4-chan-t32-asym-fp32')"
    assert len({kvq.parse_scheme("int8-head"), kvq.parse_scheme("int8-head-sym-fp16")}) == 1
    pairs = kvq.default_pairs(128)
    assert (kvq.parse_scheme("int4-chan-t32-asym"), kvq.parse_scheme("int4-token-asym")) in pairs
    # tensor, token, head, g64, g32, g16, g8; sym and asym; + per-channel K; FP8; rotated INT4; KIVI;
    # llama.cpp's types, mxfp4 and nvfp4; q8_0 / q4_0 both ways
    # and llama.cpp's six types and two mixes as today's llama.cpp rotates them (K whole, V in 64-blocks)
    assert len(pairs) == 2 * (7 * 2 + 1) + 5 + 2 + 2 + 8 + 2 + 8
    assert (kvq.parse_scheme("q8_0+had"), kvq.parse_scheme("q4_0+had64")) in pairs
    assert (kvq.parse_scheme("q8_0"), kvq.parse_scheme("q4_0")) in pairs
    assert (kvq.parse_scheme("int4-chan-t32-asym+w128"), kvq.parse_scheme("int4-g32-asym+w128")) in pairs
    had = kvq.parse_scheme("int4-g32-asym+had")
    assert had.hadamard and had.window is None and had.format == "int"
    windowed = kvq.parse_scheme("int4-chan-t32-asym+had+w128")
    assert windowed.window == 128 and windowed.without_window == kvq.parse_scheme("int4-chan-t32-asym+had")
    assert windowed.without_window.window is None and had.without_window == had
    assert kvq.parse_scheme("fp8-e4m3").scale_free and kvq.parse_scheme("fp8-e5m2-head").format == "fp8-e5m2"
    assert kvq.bits_per_element("int4-g32-asym", (1, 8, 100, 128)) == 4 + 2 * 16 / 32


@pytest.mark.parametrize("scheme,groups", [("int4-head-asym", 1), ("int4-g32-asym", 4), ("int4-g16-asym", 8)])
def test_fbgemm_rows_follow_the_design_layout(scheme, groups):
    """kvq.fbgemm_rows: rows [B, T, H] of n x (fp16 scale, fp16 shift) little-endian, then the planar codes."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((2, 3, 37, 128)) * np.exp(rng.uniform(-6, 4, (2, 3, 37, 1)))).astype(np.float32)
    r = kvq.quantize(x, scheme)
    rows = kvq.fbgemm_rows(r)
    assert rows.dtype == np.uint8 and rows.shape == (2, 37, 3, 64 + 4 * groups)  # D=128: 68 B row-wise, 80 B with 4
    params = np.stack([r.scales.reshape(2, 3, 37, groups), r.zero_points.reshape(2, 3, 37, groups)], axis=-1)
    want = np.concatenate([params.astype("<f2").view(np.uint8).reshape(2, 3, 37, 4 * groups), r.codes], axis=-1)
    assert rows.tobytes() == np.ascontiguousarray(want.transpose(0, 2, 1, 3)).tobytes()
    with pytest.raises(kvq.SchemeError, match="int8-head: the FBGEMM inline-row layout holds int4 asymmetric"):
        kvq.fbgemm_rows(kvq.quantize(x, "int8-head"))
