#include "quant/scheme_pairs.hpp"

#include <fmt/format.h>

#include <string>

#include "quant/hadamard.hpp"

namespace kvq {

std::vector<SchemePair> cross_pairs(const std::vector<Scheme>& k, const std::vector<Scheme>& v) {
  std::vector<SchemePair> pairs;
  for (const Scheme& ks : k)
    for (const Scheme& vs : v) pairs.push_back({ks, vs});
  return pairs;
}

std::vector<SchemePair> default_pairs(int64_t head_dim) {
  std::vector<SchemePair> pairs;
  for (int bits : {8, 4}) {
    std::vector<std::string> grans = {"tensor", "token", "head"};
    for (int g : {64, 32, 16, 8})
      if (g < head_dim && head_dim % g == 0) grans.push_back("g" + std::to_string(g));
    for (const std::string& gran : grans)
      for (const char* sym : {"", "-asym"}) {
        const Scheme s = parse_scheme("int" + std::to_string(bits) + "-" + gran + sym);
        pairs.push_back({s, s});
      }
    pairs.push_back({parse_scheme("int" + std::to_string(bits) + "-chan-t32-asym"),
                     parse_scheme("int" + std::to_string(bits) + "-token-asym")});
  }
  // FP8 as serving stacks ship it (e4m3; e5m2 per head for comparison), the same on K and V.
  for (const char* name : {"fp8-e4m3-tensor", "fp8-e4m3-token", "fp8-e4m3-head", "fp8-e4m3", "fp8-e5m2-head"})
    pairs.push_back({parse_scheme(name), parse_scheme(name)});
  // Rotated INT4 K (QuaRot-style); V stays plain: rotating V as well measured no gain (README).
  const bool g32 = 32 < head_dim && head_dim % 32 == 0;
  if (is_power_of_two(head_dim)) {
    if (g32) pairs.push_back({parse_scheme("int4-g32-asym+had"), parse_scheme("int4-g32-asym")});
    pairs.push_back({parse_scheme("int4-head-asym+had"), parse_scheme("int4-head-asym")});
  }
  // KIVI-4: K per channel over 32-token groups, V per token in groups of 32 channels (per head where
  // 32 does not fit D), the last 128 tokens of both in full precision; and the same window with
  // per-token K, to separate what the window and the per-channel grouping each bring.
  const Scheme kivi_v = parse_scheme(g32 ? "int4-g32-asym+w128" : "int4-head-asym+w128");
  pairs.push_back({parse_scheme("int4-chan-t32-asym+w128"), kivi_v});
  pairs.push_back({parse_scheme("int4-token-asym+w128"), kivi_v});
  // llama.cpp's cache types (-ctk = -ctv) and the FP4 microscaling formats, where their block divides
  // D; and the mixes of q8_0 and q4_0 (K is the more sensitive one: -ctk q8_0 -ctv q4_0 is the usual
  // advice; its mirror shows how much).
  for (const char* name : {"q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl", "mxfp4", "nvfp4"}) {
    const Scheme s = parse_scheme(name);
    if (head_dim % s.group == 0) pairs.push_back({s, s});
  }
  if (head_dim % 32 == 0) {
    pairs.push_back({parse_scheme("q8_0"), parse_scheme("q4_0")});
    pairs.push_back({parse_scheme("q4_0"), parse_scheme("q8_0")});
  }
  // The same types as today's llama.cpp runs them, where it rotates a quantized cache; the plain
  // ones above are what LLAMA_ATTN_ROT_DISABLE=1 runs.
  if (llamacpp_rotation_block(true, head_dim) > 0) {
    auto rotated = [&](const char* k, const char* v) {
      pairs.push_back({llamacpp_cache_scheme(k, true, head_dim), llamacpp_cache_scheme(v, false, head_dim)});
    };
    for (const char* name : {"q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl"}) rotated(name, name);
    rotated("q8_0", "q4_0");
    rotated("q4_0", "q8_0");
  }
  return pairs;
}

int64_t llamacpp_rotation_block(bool k_side, int64_t head_dim) {
  constexpr int64_t kGrain = 64;
  if (head_dim <= 0 || head_dim % kGrain != 0) return 0;
  if (!k_side) return kGrain;
  int64_t block = kGrain;
  while (head_dim % (2 * block) == 0) block *= 2;
  return block;
}

Scheme llamacpp_cache_scheme(const std::string& type, bool k_side, int64_t head_dim) {
  Scheme s = parse_scheme(type);
  const bool fp4 = s.format == CodeFormat::kMxfp4 || s.format == CodeFormat::kNvfp4;  // no llama.cpp cache type
  if (!s.block_format() || fp4 || s.hadamard || s.has_window())
    throw SchemeError(fmt::format("'{}': expected one of llama.cpp's quantized cache types (q8_0, q4_0, q4_1, q5_0, "
                                  "q5_1, iq4_nl)", type));
  const int64_t block = llamacpp_rotation_block(k_side, head_dim);
  if (block > 0) s.hadamard = true, s.hadamard_block = block == head_dim ? 0 : static_cast<int>(block);
  return s;
}

}  // namespace kvq
