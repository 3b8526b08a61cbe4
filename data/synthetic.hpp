// Seeded LLM-shaped synthetic K/V/Q, clearly labelled as synthetic in `source`. It has the
// features that decide how K/V quantize: RoPE-rotated K, a few large-magnitude K channels with a
// consistent sign (the outliers that favour per-channel K), a log-normal per-token magnitude, and
// attention-sink tokens that queries attend to strongly. Counter-based random numbers: element i
// depends only on (seed, stream, i), so results do not depend on the thread count.
#pragma once

#include <string>
#include <vector>

#include "data/kv_layer.hpp"

namespace kvq {

struct SyntheticSpec {
  int64_t batch = 1, q_heads = 8, kv_heads = 2, tokens = 256, head_dim = 128, q_len = 1;
  uint64_t seed = 0;
  int64_t outlier_channels = 4;  // K channels (the same in every head) with a large mean
  double outlier_scale = 8.0;    // their mean and spread, in units of a normal channel's spread
  double token_spread = 0.5;     // sigma of the log-normal per-token magnitude
  int64_t sink_tokens = 1;       // the first tokens are attention sinks
  double sink_scale = 2.0;       // sink key norm, in units of sqrt(D)
  double query_bias = 0.3;       // queries' shared component along the sink direction
  double rope_theta = 10000.0;
};

// One layer: K, V [B, Hkv, T, D], decode queries Q [B, Hq, Tq, D] at the last Tq positions,
// seq_lens all T; source "synthetic:llm-shaped(seed=..,B=..,...)" with every parameter.
KvLayer make_synthetic(const SyntheticSpec& spec);

// "synthetic:llm-shaped(seed=..,B=..,...)": the generator and every parameter.
std::string synthetic_source(const SyntheticSpec& spec);

// Standard normal values, deterministic in (seed, stream, index); used for bulk benchmark data.
void fill_normal(std::vector<float>& out, uint64_t seed, uint64_t stream);

// Rotates interleaved pairs (x[2i], x[2i+1]) by pos * theta^(-2i/D), in place (llama2.c / Meta
// Llama convention).
void apply_rope(float* x, int64_t head_dim, int64_t pos, double theta);

}  // namespace kvq
