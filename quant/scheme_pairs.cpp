#include "quant/scheme_pairs.hpp"

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
  return pairs;
}

}  // namespace kvq
