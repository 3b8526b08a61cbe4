// The decode shapes of DESIGN.md, shared by the CPU benchmark (kvq bench-cpu), the GPU benchmark
// (kvq bench), the sweep's latency columns and the decode gate's cases.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvq {

struct DecodeShape {
  const char* group = "";  // seed000, seed002, llama8b, smollm2 ("" for ad-hoc shapes); a literal, never owned
  int64_t batch = 0, q_heads = 0, kv_heads = 0, tokens = 0, head_dim = 0;
  std::string label() const;  // "seed000/B32/T8192"
};

// seed000 T=8192 Hq=8 Hkv=1 D=128 B in {32..512}; seed002 B=1 T=1024 Hq=32 Hkv=8; Llama-3-8B-like
// Hq=32 Hkv=8 D=128, B in {1, 8, 64} x T in {1K, 8K, 32K} without B=64 T=32K (34 GB of fp32 K/V);
// SmolLM2-135M (the main job's real model) Hq=9 Hkv=3 D=64, B in {1, 8, 64} x T in {1K, 8K}.
std::vector<DecodeShape> design_decode_shapes();
// Those whose label matches `regex` (std::regex_search); InputError naming `option` when the regex is
// not one or matches no shape.
std::vector<DecodeShape> design_decode_shapes(const std::string& regex, const std::string& option);

}  // namespace kvq
