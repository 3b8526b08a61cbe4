"""kvq.llamacpp: llama.cpp's cache types in kvq's names, rotated as today's llama.cpp rotates them
(K in the largest power-of-two block >= 64 dividing head_dim, V in blocks of 64, only quantized types
and only where head_dim % 64 == 0), and back from kvq's names to llama.cpp's flags."""
import numpy as np
import pytest

import kvq
from kvq import llamacpp


@pytest.mark.parametrize("head_dim, k, v", [(64, "q4_0+had", "q4_0+had"), (128, "q4_0+had", "q4_0+had64"),
                                            (256, "q4_0+had", "q4_0+had64"), (192, "q4_0+had64", "q4_0+had64"),
                                            (96, "q4_0", "q4_0"), (160, "q4_0", "q4_0")])
def test_rotation_blocks_follow_head_dim(head_dim, k, v):
    assert llamacpp.cache_schemes("q4_0", "q4_0", head_dim) == (k, v)
    assert llamacpp.cache_schemes("q4_0", "q4_0", head_dim, rotation=False) == ("q4_0", "q4_0")
    for name in (k, v):  # every name kvq can parse and fit
        kvq.parse_scheme(name).fits(head_dim)


def test_unquantized_types_are_never_rotated():
    assert llamacpp.cache_schemes("q8_0", "f16", 128) == ("q8_0+had", "fp16")
    assert llamacpp.cache_schemes("bf16", "f32", 128) == ("bf16", "fp32")
    assert llamacpp.rotation_block("k", 128) == 128 and llamacpp.rotation_block("v", 128) == 64
    assert llamacpp.rotation_block("k", 96) == 0


def test_describe_pair_round_trips_every_type_pair():
    for head_dim in (64, 128, 96):
        for tk in llamacpp.CACHE_TYPES:
            for tv in llamacpp.CACHE_TYPES:
                rotated = llamacpp.cache_schemes(tk, tv, head_dim)
                assert llamacpp.describe_pair(*rotated, head_dim) == f"-ctk {tk} -ctv {tv}"
                plain = llamacpp.cache_schemes(tk, tv, head_dim, rotation=False)
                expected = f"-ctk {tk} -ctv {tv}" if plain == rotated else f"LLAMA_ATTN_ROT_DISABLE=1 -ctk {tk} -ctv {tv}"
                assert llamacpp.describe_pair(*plain, head_dim) == expected
    assert llamacpp.describe_pair("int4-g32-asym", "int4-g32-asym", 128) is None  # kvq's own scheme
    assert llamacpp.describe_pair("q4_0+had64", "q4_0+had64", 128) is None  # K: llama.cpp rotates all 128


def test_bad_names_are_errors():
    with pytest.raises(ValueError, match="llama.cpp's are f32, f16"):
        llamacpp.cache_scheme("q4_k", "k", 128)
    with pytest.raises(kvq.InputError, match="expected 'k' or 'v'"):
        llamacpp.rotation_block("q", 128)


def test_head_dims_llama_cpp_cannot_cache_are_refused():
    # a block of 32 must divide each row (llama.cpp stores whole blocks, as kvq's codec does)
    with pytest.raises(ValueError, match="-ctv q8_0: q8_0: block size 32 does not divide head_dim 40"):
        llamacpp.cache_schemes("f16", "q8_0", 40)
    for bad in (0, -64):
        with pytest.raises(ValueError, match=f"head_dim {bad}: expected a positive number"):
            llamacpp.cache_scheme("q4_0", "k", bad)
    assert llamacpp.cache_schemes("f16", "bf16", 40) == ("fp16", "bf16")
    assert llamacpp.describe_pair("fp16", "bf16", 40) == "-ctk f16 -ctv bf16"
    assert llamacpp.describe_pair("q4_0", "q8_0", 40) is None  # no such cache at head_dim 40


def test_block_rotation_back_and_the_append_cache_agree_with_the_codec():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2, 40, 128)).astype(np.float32)
    r = kvq.quantize(x, "q4_0+had64")
    assert r.scheme.hadamard_block == 64 and r.scheme.rotation_block(128) == 64
    assert kvq.parse_scheme("q4_0+had").hadamard_block is None
    back = kvq.hadamard_rotate_back(r.dequantized, 64)
    # rotating back the block-rotated input (codes kept exact by a full window) returns the input
    kept = kvq.quantize(x, "q4_0+had64+w40")
    assert np.allclose(kvq.hadamard_rotate_back(kept.dequantized, 64), x, atol=1e-5)
    assert not np.allclose(kvq.hadamard_rotate_back(kept.dequantized), x, atol=1e-2)  # the whole-row inverse is not it
    # the append cache stores the same codes and returns them rotated back
    cache = kvq.AppendQuantizer("q4_0+had64")
    (s1, v1), (s2, v2) = cache.append(x[:, :, :17]), cache.append(x[:, :, 17:])
    assert (s1, s2) == (0, 17)
    assert np.array_equal(np.concatenate([v1, v2], axis=2), back.astype(np.float32))
    with pytest.raises(kvq.InputError, match="multiple of the block 64"):
        kvq.hadamard_rotate_back(np.zeros((2, 96)), 64)


def ggml_gen_hadamard(n):
    """llama.cpp's rotation matrix (src/llama-kv-cache.cpp ggml_gen_hadamard), its recursion written out."""
    data = np.zeros((n, n), np.float32)
    data[0, 0] = np.float32(1.0 / float(np.sqrt(np.float32(n))))
    s = 1
    while s < n:
        block = data[:s, :s].copy()
        data[s:2 * s, :s], data[:s, s:2 * s], data[s:2 * s, s:2 * s] = block, block, -block
        s *= 2
    return data


@pytest.mark.parametrize("n", [64, 128, 256])
def test_llama_cpp_rotation_matrix_is_kvq_rotation(n):
    # kvq's rotation of each unit vector is a column of its matrix: the same entries, bit for bit
    kvq_matrix = kvq.hadamard_rotate_back(np.eye(n), 0).astype(np.float32)
    np.testing.assert_array_equal(kvq_matrix, ggml_gen_hadamard(n))
    # and the codec's fp32 rotation (as quantize applies it) maps e_j to that column
    x = np.zeros((1, 1, n, n), np.float32)
    x[0, 0] = np.eye(n, dtype=np.float32) * 64
    r = kvq.quantize(x, "int8-head+had")
    np.testing.assert_allclose(r.dequantized[0, 0] / 64, ggml_gen_hadamard(n), rtol=0, atol=1.0 / 127)
