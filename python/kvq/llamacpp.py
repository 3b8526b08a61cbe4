"""llama.cpp's KV cache types (`-ctk` / `-ctv`) as today's llama.cpp runs them, in kvq's names.

Since its attention-rotation change (`src/llama-kv-cache.cpp`, `attn_rot_k` / `attn_rot_v`),
llama.cpp multiplies Q and K by an orthonormal Walsh-Hadamard matrix before K is cached, and V by one
(the attention output rotated back), when the side's cache type is quantized and head_dim % 64 == 0.
K's matrix is the largest power of two >= 64 that divides head_dim, applied to each block of that
many elements; V's is 64, so a 128-element V row is two 64-blocks. `LLAMA_ATTN_ROT_DISABLE=1`
turns both off. In kvq: `+had` rotates the whole row, `+had<N>` blocks of N elements (the same
Sylvester-ordered matrix, 1/sqrt(N) normalized), so

    >>> cache_schemes("q4_0", "q4_0", head_dim=128)
    ('q4_0+had', 'q4_0+had64')
    >>> cache_schemes("q4_0", "q4_0", head_dim=128, rotation=False)
    ('q4_0', 'q4_0')
    >>> cache_schemes("q8_0", "f16", head_dim=64)
    ('q8_0+had', 'fp16')
"""
from . import _core

# The types llama.cpp's `--cache-type-k/-v` take (common/arg.cpp), with kvq's name for each:
# the unquantized ones are kvq eval's float storages, the quantized ones kvq's block formats.
CACHE_TYPES = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "q8_0": "q8_0", "q4_0": "q4_0", "q4_1": "q4_1",
               "iq4_nl": "iq4_nl", "q5_0": "q5_0", "q5_1": "q5_1"}
UNQUANTIZED = ("f32", "f16", "bf16")


def rotation_block(side, head_dim):
    """Elements per rotation block llama.cpp uses for a quantized `side` ('k' or 'v') at head_dim,
    or 0 where it does not rotate (head_dim not a multiple of 64). The rule is the C++ one
    (quant/scheme_pairs.cpp, llamacpp_rotation_block) that kvq's default pairs follow."""
    return _core.llamacpp_rotation_block(side, head_dim)


def cache_scheme(cache_type, side, head_dim, rotation=True):
    """kvq's storage name for llama.cpp cache type `cache_type` on `side` ('k' or 'v') at head_dim,
    rotated as llama.cpp rotates it unless rotation=False (LLAMA_ATTN_ROT_DISABLE=1)."""
    if cache_type not in CACHE_TYPES:
        raise ValueError(f"cache type {cache_type!r}: llama.cpp's are {', '.join(CACHE_TYPES)}")
    if side not in ("k", "v"):
        raise ValueError(f"side {side!r}: expected 'k' or 'v'")
    if head_dim <= 0:
        raise ValueError(f"head_dim {head_dim}: expected a positive number")
    if cache_type not in UNQUANTIZED:  # llama.cpp stores whole blocks a row, as kvq's codec
        try:
            _core.parse_scheme(CACHE_TYPES[cache_type]).fits(head_dim)
        except _core.SchemeError as e:
            raise ValueError(f"-ct{side} {cache_type}: {e}") from None
    if not rotation or cache_type in UNQUANTIZED:
        return CACHE_TYPES[cache_type]
    return _core.llamacpp_cache_scheme(cache_type, side, head_dim).name  # the C++ rule kvq's default pairs follow


def cache_schemes(type_k, type_v, head_dim, rotation=True):
    """(K, V) storage names in kvq for llama.cpp's `-ctk type_k -ctv type_v` at head_dim."""
    return cache_scheme(type_k, "k", head_dim, rotation), cache_scheme(type_v, "v", head_dim, rotation)


def _fits(cache_type, head_dim):
    try:
        cache_scheme(cache_type, "k", head_dim)
        return True
    except ValueError:
        return False


def describe_pair(k_name, v_name, head_dim):
    """How a llama.cpp user gets kvq's pair (k_name, v_name) at head_dim: '-ctk X -ctv Y' (llama.cpp's
    default, rotated), 'LLAMA_ATTN_ROT_DISABLE=1 -ctk X -ctv Y' (the unrotated types), or None where
    llama.cpp runs no such cache (kvq's own schemes, or a rotation llama.cpp would not apply)."""
    fitting = [t for t in CACHE_TYPES if _fits(t, head_dim)]  # llama.cpp has no cache of the others here
    for rotation in (True, False):
        for tk in fitting:
            for tv in fitting:
                if cache_schemes(tk, tv, head_dim, rotation) == (k_name, v_name):
                    rotated = cache_schemes(tk, tv, head_dim, True) != cache_schemes(tk, tv, head_dim, False)
                    flags = f"-ctk {tk} -ctv {tv}"
                    return flags if rotation or not rotated else f"LLAMA_ATTN_ROT_DISABLE=1 {flags}"
    return None
