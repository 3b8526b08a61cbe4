// A +wW window read at the end of the quantized region's last split (DecodeParams::window_tail):
// the window's raw keys continue the split's online softmax in the same launch, so a windowed decode
// is one launch that merges as its plain scheme does. As two launches (the window a region of its
// own), the window's launch chain and the merge kernel after the join cost ~3.5 + 4.7 us beside the
// plain scheme's 12.2 (H200, llama8b B = 1 T = 1K, decode-window-launches/small-batch-breakdown/).
//
// bf16 windows (the gate's; fp16 ones run a launch per region). The arithmetic is the window region's
// kernel's (TcTraits<kBf16, kBf16, D>): 16-key steps, Q's bf16 bits, P rounded to bf16, fp32
// accumulation. Each warp takes every 4th step, through one or two stages of its ring (the main
// loop's shared memory, spent by then), and reads Q from global memory (the prologue's holds it in
// K's type and order).
#pragma once

#include "gpu/decode_tc_fragments.cuh"
#include "gpu/decode_tc_softmax.cuh"

namespace kvq::detail {

// The window's keys for the CTA's split to read (L2 prefetches, issued with the split's first copies:
// its tail then waits on L2, not DRAM). kRowBytes: one raw row.
template <int kRowBytes>
__device__ __forceinline__ void prefetch_window_rows(const DecodeParams& p, int64_t b, int64_t hk, int64_t len) {
  int64_t lo = 0, hi = 0;
  key_region_bounds(KeyRegion::kBothRaw, p.k_window, p.v_window, len, lo, hi);
  constexpr int kLines = (kRowBytes + 127) / 128;
  const int64_t rows = hi > lo ? hi - lo : 0;
  for (int64_t i = threadIdx.x; i < 2 * rows * kLines; i += blockDim.x) {
    const KvOperand& op = i < rows * kLines ? p.k_window.raw : p.v_window.raw;
    const int64_t r = (i < rows * kLines ? i : i - rows * kLines) / kLines, line = i % kLines;
    const uint8_t* at = op.data + b * op.stride_b + hk * op.stride_h + (lo + r) * op.stride_t + 128 * line;
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(at));
  }
}

// Runs this warp's steps of the window's keys into its running max m, sum l and O accumulators o
// (unscaled: the caller has taken them out of V's folded domain). What the tail needs besides is
// recomputed here, not held through the main loop (registers). kVWords: o holds the elements of
// tc_v_row_element's int4 word order. The warps' rings of kMainStages stages (at least kMainCodeWords
// words each) lie at `stages`; head_slopes: the prologue's ALiBi slopes.
template <int D, bool kVWords, int kMainStages, int kMainCodeWords>
__device__ __forceinline__ void tc_window_tail(const DecodeParams& p, const TcPlan& plan, uint32_t* stages,
                                               const float* head_slopes, float (&m)[2], float (&l)[2],
                                               float (&o)[D / 16][4]) {
  constexpr KvFormat FW = KvFormat::kBf16;
  using Tw = TcTraits<FW, FW, D>;
  constexpr int kST = Tw::kStepTokens, kSlices = Tw::kSlices;
  static_assert(kST == 16 && Tw::kMTiles == 1, "the tail's steps are one m-tile");
  static_assert(kMainStages * kMainCodeWords >= Tw::kCodeWords, "a raw step fits in a warp's ring");
  constexpr int kStages = tc_window_tail_stages<D>(kMainStages * kMainCodeWords);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const TcCta cta = tc_cta(p, plan);
  const int64_t b = cta.b, hk = cta.hk, hb = cta.hb;
  const int64_t len = p.seq_lens ? p.seq_lens[b] : p.tokens;
  uint32_t* ring = stages + warp * kMainStages * plan.stage_words;
  const float slope[2] = {head_slopes[2 * c], head_slopes[2 * c + 1]};
  int64_t lo = 0, hi = 0;
  key_region_bounds(KeyRegion::kBothRaw, p.k_window, p.v_window, len, lo, hi);
  const int keys = hi > lo ? static_cast<int>(hi - lo) : 0;  // W keys at most (< 2^31)
  const int all_steps = (keys + kST - 1) / kST;
  const int my_steps = all_steps > warp ? (all_steps - warp + Tw::kWarps - 1) / Tw::kWarps : 0;
  if (my_steps == 0) return;
  const TcSource ks = tc_source<D, FW, false>(p.k_window.raw, plan.k_tail, p, b, hk, Tw::kKRowWords, lo);
  const TcSource vs = tc_source<D, FW, false>(p.v_window.raw, plan.v_tail, p, b, hk, Tw::kVRowWords, lo);
  const int64_t t_first = lo + static_cast<int64_t>(warp) * kST;
  auto step_keys = [&](int s) { return min(keys - (warp + s * Tw::kWarps) * kST, kST); };
  auto issue = [&](int s) {
    if (s < my_steps) {
      uint32_t* st = ring + (s % kStages) * Tw::kCodeWords;
      const int64_t t0 = t_first + static_cast<int64_t>(s) * (Tw::kWarps * kST);
      copy_step<Tw::kKRowWords, typename Tw::KRows, kST>(st, st, ks, t0, 0, step_keys(s), lane, plan.k_tail.units_magic,
                                                         PageShift{});
      copy_step<Tw::kVRowWords, typename Tw::VRows, kST>(st + kST * Tw::kKStride, st, vs, t0, 0, step_keys(s), lane,
                                                         plan.v_tail.units_magic, PageShift{});
    }
    cp_async_commit();
  };
  __syncwarp();  // the main loop's reads of the ring are done
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);

  // Q of head g (a padding head: zeros) as B operands of k-slice j: elements 16 j + 4 c + {0..3}, in
  // k_fragment's order for bf16 K.
  const int64_t in_group = hb * Tw::kHeads + g;
  const bool real = in_group < plan.group_size;
  const uint16_t* q = p.q + ((b * p.q_heads + hk * plan.group_size + (real ? in_group : 0)) * D + 4 * c);
  uint2 qt[kSlices];
#pragma unroll
  for (int j = 0; j < kSlices; ++j) {
    uint32_t h[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = real ? __ldg(q + 16 * j + k) : 0u;
    qt[j] = make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
  }
  const float factor = p.softmax_scale * kTcLog2e;

  for (int s = 0; s < my_steps; ++s) {
    __syncwarp();  // step s - 1's reads are done before its stage is refilled
    issue(s + kStages - 1);
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const uint32_t* kc = ring + (s % kStages) * Tw::kCodeWords;
    const uint32_t* vc = kc + kST * Tw::kKStride;
    const int64_t t0 = t_first + static_cast<int64_t>(s) * (Tw::kWarps * kST);
    float acc[2][4] = {};  // even / odd k-slices: two MMA chains
#pragma unroll
    for (int j = 0; j < kSlices; ++j) {
      uint32_t a[4];
      k_fragment<FW, typename Tw::KRows>(kc, g, j, c, ks, a);
      mma_16816<true>(acc[j % 2], a, qt[j].x, qt[j].y);
    }
    float sc[1][4];
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[0][e] = (acc[0][e] + acc[1][e]) * factor;
    bias_and_mask_scores<1, kST>(sc, slope, p.alibi_slopes != nullptr, len, t0, g, 0, step_keys(s));
    float alpha[2];
    if (softmax_step(sc, m, l, alpha))
#pragma unroll
      for (int j = 0; j < kSlices; ++j) o[j][0] *= alpha[0], o[j][1] *= alpha[1], o[j][2] *= alpha[0], o[j][3] *= alpha[1];
    const uint32_t p0 = transpose_8x8(pack_rounded<true>(sc[0][0], sc[0][1]));
    const uint32_t p1 = transpose_8x8(pack_rounded<true>(sc[0][2], sc[0][3]));
#pragma unroll
    for (int i = 0; i < kSlices / 2; ++i) {
      uint32_t vlo[4], vhi[4];
      v_fragments<FW, typename Tw::VRows, kVWords>(vc, 2 * c, i, g, vs, vlo, vhi);
      mma_16816<true>(o[2 * i], vlo, p0, p1);
      mma_16816<true>(o[2 * i + 1], vhi, p0, p1);
    }
  }
}

}  // namespace kvq::detail
