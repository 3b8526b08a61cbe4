// The split-K merge (DESIGN.md; reference/attention.cpp merge_partials) of one query row from its
// partial slots, shared by the merge kernel and decode-tc's last CTA (which merges in place of the
// second kernel when DecodeParams::split_counters is set): both give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "gpu/decode.hpp"

namespace kvq::detail {

__device__ __forceinline__ float exp_natural(float x) { return exp2f(x * 1.4426950408889634f); }  // e^x

// Partials are read through L2 (ld.global.cg): the merging CTA reads slots other CTAs wrote.
// LSE of row bh = b * Hq + h over `splits` slots (-inf when no slot saw keys).
__device__ __forceinline__ float merged_lse(const DecodeParams& p, int64_t bh, int splits) {
  const int64_t stride = p.batch * p.q_heads;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, __ldcg(p.partial_lse + s * stride + bh));
  if (mx == -INFINITY) return -INFINITY;
  float sum = 0.0f;
  for (int s = 0; s < splits; ++s) sum += exp_natural(__ldcg(p.partial_lse + s * stride + bh) - mx);
  return mx + logf(sum);
}

// Element d of row bh's output, in split order.
__device__ __forceinline__ float merged_o(const DecodeParams& p, int64_t bh, int splits, float lse, int d) {
  if (lse == -INFINITY) return 0.0f;
  const int64_t stride = p.batch * p.q_heads;
  float o = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float w = exp_natural(__ldcg(p.partial_lse + s * stride + bh) - lse);
    o = __fmaf_rn(w, __ldcg(p.partial_o + (s * stride + bh) * p.head_dim + d), o);
  }
  return o;
}

}  // namespace kvq::detail
