// K and V scheme pairs: the sweep's default set and crossed lists. Shared by the sweep, the gate
// and the Python module (kvq.default_pairs), so that every tool means the same by "the default set".
#pragma once

#include <string>
#include <vector>

#include "quant/scheme.hpp"

namespace kvq {

struct SchemePair {
  Scheme k, v;
};

// Every K scheme with every V scheme.
std::vector<SchemePair> cross_pairs(const std::vector<Scheme>& k, const std::vector<Scheme>& v);

// The default set, for a head_dim: int8 and int4 x {tensor, token, head, g64, g32, g16, g8 (where
// G < D divides D)} x {sym, asym}, the same scheme on K and V; plus per-channel K (chan-t32,
// asymmetric) with per-token V; FP8 e4m3 {tensor, token, head, scale-free} and e5m2 head; rotated
// INT4 K (int4-g32-asym+had, int4-head-asym+had; D a power of two) with the plain V scheme; KIVI-4
// (int4-chan-t32-asym+w128 K, int4-g32-asym+w128 V) and its per-token-K ablation; llama.cpp's
// cache types and mxfp4 / nvfp4, the same on K and V (where their block divides D), and the q8_0 /
// q4_0 mixes both ways; where llama.cpp rotates (head_dim % 64 == 0), its six types and the two
// mixes again as it runs them (llamacpp_cache_scheme).
std::vector<SchemePair> default_pairs(int64_t head_dim);

// llama.cpp's rotation of a quantized cache (src/llama-kv-cache.cpp, attn_rot_k / attn_rot_v):
// elements per rotation block on K (the largest power of two >= 64 that divides head_dim) or V
// (64), 0 where head_dim % 64 != 0 (llama.cpp does not rotate; LLAMA_ATTN_ROT_DISABLE=1 neither).
int64_t llamacpp_rotation_block(bool k_side, int64_t head_dim);
// A llama.cpp block type (q8_0, q4_0, ...) as today's llama.cpp keeps it on that side: +had (the
// whole row) or +had<N> where it rotates, the plain type where it does not.
Scheme llamacpp_cache_scheme(const std::string& type, bool k_side, int64_t head_dim);

}  // namespace kvq
