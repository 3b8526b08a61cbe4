// The online softmax of one step of keys, shared by the tensor-core decode kernel's main loop
// (decode_tc_kernel.cuh) and its +wW window tail (decode_tc_window_tail.cuh), so that both regions of
// a windowed decode take the same arithmetic. A step's scores are m-tiles of the QK accumulator
// layout: lane (g, c) holds keys 16 mt + g (e = 0, 1) and + 8 (e = 2, 3) of heads 2c (even e) and
// 2c + 1 (odd e), in the log2 domain.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace kvq::detail {

inline constexpr float kTcLog2e = 1.4426950408889634f;

__device__ __forceinline__ float quad_max(float x) {  // over the 8 lanes g of one c
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

__device__ __forceinline__ float pow2(int e) { return __int_as_float((127 + e) << 23); }  // e in [-126, 127]

__device__ __forceinline__ float fast_exp2(float x) {  // 2^-22 relative error, far below the fp16 rounding of P
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ALiBi's bias by distance from the sequence's last key (len - 1), and -inf for the rows of a step
// (first key t0) outside [n_lo, n): past the range's end, or below a region that starts mid-step.
template <int kMTiles, int kStepTokens>
__device__ __forceinline__ void bias_and_mask_scores(float (&sc)[kMTiles][4], const float (&slope)[2], bool alibi,
                                                     int64_t len, int64_t t0, int g, int n_lo, int n) {
  if (alibi)
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        sc[mt][e] -= slope[e % 2] * static_cast<float>(len - 1 - (t0 + 16 * mt + g + (e < 2 ? 0 : 8)));
  if (n < kStepTokens)  // the range's last step: rows past it are no keys
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (16 * mt + g + (e < 2 ? 0 : 8) >= n) sc[mt][e] = -INFINITY;
  if (n_lo > 0)
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (16 * mt + g + (e < 2 ? 0 : 8) < n_lo) sc[mt][e] = -INFINITY;
}

// The step's scores become 2^(s - m) against the running max m (per head: lanes with the same c
// hold it), the running sum l follows, and alpha is the factor on what was accumulated before (0 for
// the first keys, 1 while the max holds). Returns whether any lane's alpha differs from 1.
template <int kMTiles>
__device__ __forceinline__ bool softmax_step(float (&sc)[kMTiles][4], float (&m)[2], float (&l)[2], float (&alpha)[2]) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float mx = -INFINITY;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) mx = fmaxf(mx, fmaxf(sc[mt][hh], sc[mt][hh + 2]));
    const float m_new = fmaxf(m[hh], quad_max(mx));
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    alpha[hh] = fast_exp2(m[hh] - m_use);
    m[hh] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      sc[mt][hh] = fast_exp2(sc[mt][hh] - m_use), sc[mt][hh + 2] = fast_exp2(sc[mt][hh + 2] - m_use);
      sum += sc[mt][hh] + sc[mt][hh + 2];
    }
    l[hh] = l[hh] * alpha[hh] + sum;
  }
  return __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f);
}

}  // namespace kvq::detail
