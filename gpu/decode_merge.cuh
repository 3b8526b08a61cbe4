// The split-K merge (DESIGN.md; reference/attention.cpp merge_partials) as device functions: the
// merge kernel of decode_launch.cu and the tensor-core kernel's last CTA per (b, KV head, head
// block) compute it with the same arithmetic, in split order.
#pragma once

#include <cuda_runtime.h>

#include "gpu/decode.hpp"

namespace kvq::detail {

__device__ __forceinline__ float merge_exp(float x) { return exp2f(x * 1.4426950408889634f); }

// The LSE over the splits of row bh = b * Hq + h (-inf when no split saw a key) and the max it
// was computed around. Partials are read through L2 (other CTAs wrote them in this launch).
struct SplitLse {
  float max, lse;
};
__device__ __forceinline__ SplitLse merge_split_lse(const DecodeParams& p, int64_t bh) {
  const int64_t stride = p.batch * p.q_heads;
  float mx = -INFINITY;
  for (int s = 0; s < p.splits; ++s) mx = fmaxf(mx, __ldcg(p.partial_lse + s * stride + bh));
  float lse = -INFINITY, sum = 0.0f;
  if (mx != -INFINITY) {
    for (int s = 0; s < p.splits; ++s) sum += merge_exp(__ldcg(p.partial_lse + s * stride + bh) - mx);
    lse = mx + logf(sum);
  }
  return {mx, lse};
}

// O[bh, d] = sum_s exp(LSE_s - LSE) O_s[bh, d].
__device__ __forceinline__ float merge_split_value(const DecodeParams& p, int64_t bh, int d, SplitLse l) {
  const int64_t stride = p.batch * p.q_heads;
  float o = 0.0f;
  if (l.max != -INFINITY)
    for (int s = 0; s < p.splits; ++s) {
      const float w = merge_exp(__ldcg(p.partial_lse + s * stride + bh) - l.lse);
      o = __fmaf_rn(w, __ldcg(p.partial_o + (s * stride + bh) * p.head_dim + d), o);
    }
  return o;
}

}  // namespace kvq::detail
