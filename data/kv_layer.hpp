// One layer of captured (or generated) K/V, with optional decode queries: what the experiments
// consume, whatever the source.
#pragma once

#include <string>
#include <vector>

#include "quant/groups.hpp"

namespace kvq {

struct KvLayer {
  std::string source;  // model name, or "synthetic:<generator>(<parameters>)"
  int layer = 0;
  KvShape kv_shape;              // [B, Hkv, T, D]
  std::vector<float> k, v;       // BNSH, exact copies of the stored fp16 / bf16 / fp32 values
  KvShape q_shape;               // [B, Hq, Tq, D]; q empty when the source has no queries
  std::vector<float> q;
  std::vector<int32_t> seq_lens;  // [B]
  double softmax_scale = 0.0;     // 0: 1 / sqrt(D)
  bool alibi = false;

  bool has_queries() const { return !q.empty(); }
};

}  // namespace kvq
