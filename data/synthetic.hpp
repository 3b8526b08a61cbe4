// Seeded synthetic K/V/Q with the features that matter for KV quantization: a few large-magnitude
// K channels (outliers) and a per-token magnitude spread. Clearly labelled as synthetic in `source`.
// Counter-based: element i depends only on (seed, tensor, i), so the result is independent of the
// thread count.
#pragma once

#include <string>
#include <vector>

#include "data/kv_layer.hpp"

namespace kvq {

struct SyntheticSpec {
  int64_t batch = 1, q_heads = 8, kv_heads = 2, tokens = 256, head_dim = 64, q_len = 1;
  uint64_t seed = 0;
  int64_t outlier_channels = 2;  // K channels (same in every head) scaled by outlier_scale
  double outlier_scale = 8.0;
  double token_spread = 0.5;     // sigma of the log-normal per-token magnitude
};

// K, V, Q and full-length seq_lens; source "synthetic:gaussian-outliers(seed=...,...)".
KvLayer make_synthetic(const SyntheticSpec& spec);

// Standard normal values, deterministic in (seed, stream, index); used for bulk benchmark data.
void fill_normal(std::vector<float>& out, uint64_t seed, uint64_t stream);

}  // namespace kvq
