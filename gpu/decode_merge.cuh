// The split-K merge's arithmetic (DESIGN.md's merge; reference/attention.cpp merge_partials), shared by
// the merge kernel (decode_launch.cu) and the merge inside a CTA cluster (decode_tc_kernel.cuh):
//   LSE = max + log(sum_s exp(LSE_s - max)),  O = sum_s exp(LSE_s - LSE) O_s,
// the sum and the products accumulated in split order, so both paths give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "gpu/decode.hpp"
#include "gpu/decode_tc_traits.cuh"
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

// The merged LSE of the `splits` LSEs in `lse` (a register array, its loop unrolled kUnroll times, or
// shared memory with kUnroll = 0) whose max is `mx`: the sum in split order.
template <int kUnroll, class Lse>
__device__ __forceinline__ float merged_lse(const Lse& lse, int splits, float mx) {
  if (mx == -INFINITY) return -INFINITY;
  float sum = 0.0f;
#pragma unroll
  for (int s = 0; s < (kUnroll > 0 ? kUnroll : splits); ++s)
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
    const float total = merged_lse<kMaxClusterSplits>(lse, splits, mx);
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

// What the last split's merge reads and writes (DecodeParams' fields, by value: a call's arguments).
struct LastSplitMerge {
  const float* partial_o;
  const float* partial_lse;
  uint16_t* out;
  float* lse;
  int64_t stride;  // B * Hq: one split's partial rows
  int splits;
};

// The splits of one (b, KV head, head block) ran as separate CTAs, each leaving its O and LSE in the
// partial slots. The last to finish (`counter` counts them: zero before the launch, zero again after)
// merges them with the merge kernel's arithmetic in its order (the same bits, whichever CTA is last):
// one launch instead of two. The splits' O rows come into shared memory by cp.async, as many splits
// at once as `smem` (`smem_floats`, 16-byte aligned, no longer read by the caller) holds: one memory
// round trip for a small grid's merge, where loads in registers would take one per few splits.
// Not inlined: in the kernel's body it cost the main loop registers (ptxas: 127 -> 145 in a paged kernel).
template <int kThreads>
__device__ __noinline__ void merge_as_last_split(LastSplitMerge m, unsigned* counter, int64_t row, int heads, int D,
                                                 float* smem, int smem_floats) {
  const int splits = m.splits, row_floats = heads * D;
  unsigned* flag = reinterpret_cast<unsigned*>(smem);
  float* row_lse = smem + 4;                                 // [heads] (at most 8: 12 floats with the flag keep 16 B)
  float* w = smem + 16;                                      // [head][split]: LSE_s, then exp(LSE_s - LSE)
  float* o_acc = w + (heads * splits + 3) / 4 * 4;           // [heads * D]: O over the splits so far
  float* chunk = o_acc + row_floats;                         // [splits of the chunk][heads * D]
  const int per_chunk = static_cast<int>((smem + smem_floats - chunk) / row_floats);
  __threadfence();  // this CTA's partials visible to every SM before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    const bool last = atomicAdd(counter, 1u) == static_cast<unsigned>(splits - 1);
    if (last) *counter = 0;  // every split has counted: the next launch (stream order) finds it zero
    *flag = last;
  }
  __syncthreads();
  if (!*flag) return;
  __threadfence();
  // The other CTAs' partials through L2 (cp.async.cg, __ldcg): this SM's L1 is not coherent with their writes.
  const int64_t stride = m.stride;
  auto copy_chunk = [&](int s0, int n) {
    const int pieces = row_floats / 4;  // 16-byte pieces of one split's rows (D * 4 bytes: whole pieces)
    for (int k = threadIdx.x; k < n * pieces; k += kThreads) {
      const int s = s0 + k / pieces, piece = k % pieces;
      cp_async16(smem_address(chunk + 4 * k), m.partial_o + (s * stride + row) * D + 4 * piece, true);
    }
    cp_async_commit();
  };
  copy_chunk(0, min(splits, per_chunk));
  for (int k = threadIdx.x; k < heads * splits; k += kThreads) w[k] = __ldcg(m.partial_lse + (k % splits) * stride + row + k / splits);
  __syncthreads();
  if (threadIdx.x < heads) {  // one thread a head: the merge kernel's max, sum in split order and weights
    float* ws = w + threadIdx.x * splits;
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, ws[s]);
    const float lse = merged_lse<0>(ws, splits, mx);
    for (int s = 0; s < splits; ++s) ws[s] = exp_natural(ws[s] - lse);
    row_lse[threadIdx.x] = lse;
    m.lse[row + threadIdx.x] = lse;
  }
  for (int s0 = 0; s0 < splits; s0 += per_chunk) {
    const int n = min(splits - s0, per_chunk);
    cp_async_wait<0>();
    __syncthreads();
    for (int idx = threadIdx.x; idx < row_floats; idx += kThreads) {  // O accumulated in split order, as the merge kernel
      const int i = idx / D;
      float o = s0 == 0 ? 0.0f : o_acc[idx];
      if (row_lse[i] != -INFINITY)
        for (int s = 0; s < n; ++s) o = __fmaf_rn(w[i * splits + s0 + s], chunk[s * row_floats + idx], o);
      if (s0 + n == splits) m.out[row * D + idx] = fp32_to_bf16_bits(o);
      else o_acc[idx] = o;
    }
    if (s0 + n < splits) {
      __syncthreads();  // the chunk is read before the next one overwrites it
      copy_chunk(s0 + n, min(splits - s0 - n, per_chunk));
    }
  }
}
#endif

}  // namespace kvq::detail
