// The split-K merge's arithmetic (DESIGN.md's merge; reference/attention.cpp merge_partials), shared by
// the merge kernel (decode_launch.cu) and the merge inside a CTA cluster (decode_tc_kernel.cuh):
//   LSE = max + log(sum_s exp(LSE_s - max)),  O = sum_s exp(LSE_s - LSE) O_s,
// the sum and the products accumulated in split order, so both paths give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "gpu/decode.hpp"
#include "quant/float_formats.hpp"

#if defined(__CUDACC__)
#include <cooperative_groups.h>
#endif

namespace kvq::detail {

inline constexpr float kLog2e = 1.4426950408889634f;
// Splits one cluster merges: the portable cluster size. (Clusters of 16, Hopper's non-portable
// largest, were slower than the merge kernel at llama8b B = 1 T = 8K on the H100: 1.04-1.13x.)
inline constexpr int kMaxClusterSplits = 8;

#if defined(__CUDACC__)
__device__ __forceinline__ float exp_natural(float x) { return exp2f(x * kLog2e); }

// The merged LSE of splits whose LSEs are `lse[0 .. splits)` and whose max is `mx`.
template <int kMax>
__device__ __forceinline__ float merged_lse(const float (&lse)[kMax], int splits, float mx) {
  if (mx == -INFINITY) return -INFINITY;
  float sum = 0.0f;
#pragma unroll
  for (int s = 0; s < kMax; ++s)
    if (s < splits) sum += exp_natural(lse[s] - mx);
  return mx + logf(sum);
}

// The splits of one (b, KV head) ran as the CTAs of one cluster (rank = split), each leaving its
// normalized O of `heads` query heads ([head][d]) at `cta_o` and their LSEs at `cta_lse` in its
// shared memory. The cluster's threads share out the (head, d) elements, read every split's values
// through distributed shared memory and write O and LSE: one launch, no partials in global memory.
// `row`: the first head's row of O (b * Hq + its head).
template <int kThreads>
__device__ void merge_cluster_splits(const DecodeParams& p, const float* cta_o, const float* cta_lse, int heads, int D,
                                     int64_t row) {
#if __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every split's O and LSE written
  const int splits = static_cast<int>(cluster.num_blocks());
  for (int idx = static_cast<int>(cluster.block_rank()) * kThreads + threadIdx.x; idx < heads * D; idx += splits * kThreads) {
    const int i = idx / D;
    float lse[kMaxClusterSplits], o_s[kMaxClusterSplits];
    float mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {  // all loads first: one round trip, not one per split
      lse[s] = s < splits ? *cluster.map_shared_rank(cta_lse + i, s) : -INFINITY;
      o_s[s] = s < splits ? *cluster.map_shared_rank(cta_o + idx, s) : 0.0f;
      mx = fmaxf(mx, lse[s]);
    }
    const float total = merged_lse(lse, splits, mx);
    float o = 0.0f;
    if (total != -INFINITY)
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s)
        if (s < splits) o = __fmaf_rn(exp_natural(lse[s] - total), o_s[s], o);
    p.out[row * D + idx] = fp32_to_bf16_bits(o);
    if (idx % D == 0) p.lse[row + i] = total;
  }
  cluster.sync();  // no CTA leaves while the others read its shared memory
#endif
}
#endif

}  // namespace kvq::detail
