// The tensor-core decode kernel, instantiated per (K, V) storage pair (K and V are read each in its
// own format) through decode_tc_launch.cuh, one generated translation unit a pair.
//
// CTA = (b, KV head, key split, block of 8 query heads): the heads are the N = 8 of every MMA and
// share each K/V byte. Each of the 4 warps takes every 4th step of kStepTokens keys, streams its
// steps through its own shared-memory ring (cp.async) and keeps its own online softmax; the warps
// merge once at the end (as split-K does across CTAs).
//   QK:  S^T[16 keys x 8 heads] += K[16 x 16 d] Q^T, K codes converted exactly to fp16 (bf16
//        storage: bf16 values), Q as fp16 scaled by 2^e per head (or bf16) held in registers.
//        Scales come after the product: S = s_row * acc + z_row * sum(q) per scale group.
//   PV:  O^T[16 d x 8 heads] += V^T[16 d x 16 keys] P'^T with P' = p * s_row * 2^Ev rounded to
//        fp16 (the row's V scale folded into the probability, 2^Ev keeping it near 1); the
//        asymmetric zero point adds sum(p * z) per head. The QK result becomes the PV operand by
//        an in-register transpose (movmatrix), never through shared memory. int8 / int4 V codes
//        with one scale group a row enter the MMA as 1024 + u, unsubtracted; c * sum(P') leaves
//        each O row after the loop (kVBiased).
// Precision: fp32 logits, softmax and accumulation; Q and P' rounded to the MMA type. The gate's
// mimic profile (decode_precision_profile) models exactly these roundings. Fixed order
// everywhere: reruns are bitwise identical.
#pragma once

#include <cmath>

#include "gpu/cuda_check.hpp"
#include "gpu/decode_merge.cuh"
#include "gpu/decode_tc_fragments.cuh"
#include "gpu/decode_tc_softmax.cuh"
#include "gpu/decode_tc_window_tail.cuh"
#include "quant/float_formats.hpp"
#include "quant/hadamard.hpp"

namespace kvq::detail {

__host__ __device__ constexpr int ilog2(int x) { return x > 1 ? 1 + ilog2(x / 2) : 0; }

// The codec's normalized Walsh-Hadamard transform (quant/hadamard.hpp) of a row of D elements held
// E consecutive per lane, in blocks of `block` elements (+had<N>; D: the whole row): the same fp32
// butterflies in the same order, partners in other lanes (stride h >= E) exchanged by shuffles, so
// the result equals the host's bit for bit.
template <int E, int D>
__device__ __forceinline__ void hadamard_across_lanes(float (&x)[E], int lane, int block) {
#pragma unroll
  for (int h = 1; h < D; h *= 2) {
    if (h >= block) break;  // block-diagonal: strides within a block only
    if (h < E) {
#pragma unroll
      for (int j = 0; j < E; ++j)
        if ((j & h) == 0) {
          const float a = x[j], b = x[j + h];
          x[j] = a + b, x[j + h] = a - b;
        }
    } else {
      const int m = h / E;  // the partner lane of every element
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float other = __shfl_xor_sync(0xffffffffu, x[e], m);
        x[e] = lane & m ? other - x[e] : x[e] + other;
      }
    }
  }
  const float norm = hadamard_norm(block);
#pragma unroll
  for (int e = 0; e < E; ++e) x[e] *= norm;
}

// Q of the CTA's heads as MMA operands, per-head logit factors and sum(q) per K scale group. A warp
// per head, each lane E = D/32 consecutive elements: one load, shuffles for the max and the sums.
template <typename Tr, int D, bool kKWords>
__device__ void tc_prologue(TcPrologue<D>& pro, const DecodeParams& p, const TcPlan& plan, int64_t b, int64_t hk,
                            int64_t hb) {
  const int64_t group_size = plan.group_size;
  constexpr bool kBf16Q = Tr::K::kBf16Mma;
  constexpr int E = D / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int lanes_per_group = plan.q_lanes_per_group;  // groups hold whole lanes (G >= 16 >= E)
  for (int i = warp; i < Tr::kHeads; i += Tr::kWarps) {
    const int64_t in_group = hb * Tr::kHeads + i;
    const bool ok = in_group < group_size;
    if (!ok) {  // a padding head (GQA < 8): the values zeros would give, without loads or conversions
#pragma unroll
      for (int e = 0; e < E; ++e) pro.q[i][E * lane + e] = 0;
      if (lane % lanes_per_group == 0) pro.q_sum[lane / lanes_per_group][i] = 0.0f;
      if (lane == 0) pro.factor[i] = p.softmax_scale * kTcLog2e, pro.slope[i] = 0.0f;
      continue;
    }
    const uint16_t* q = p.q + (b * p.q_heads + hk * group_size + in_group) * D + E * lane;
    uint16_t bits[E];
    float x[E], amax = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) bits[e] = q[e], x[e] = bf16_bits_to_fp32(bits[e]);
    if constexpr (!kBf16Q)
      if (p.k.hadamard)  // K stored rotated (+had, +had<N>): Q alike
        hadamard_across_lanes<E, D>(x, lane, p.k.hadamard_block > 0 ? p.k.hadamard_block : D);
#pragma unroll
    for (int e = 0; e < E; ++e) amax = fmaxf(amax, fabsf(x[e]));
#pragma unroll
    for (int o = 16; o >= 1; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const int exponent = kBf16Q ? 0 : fp16_operand_exponent(amax);
    float sum = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      // cvt.rn straight (the codec's fp32_to_fp16_bits for every non-NaN value; a NaN Q gives NaN either way)
      const uint16_t op = kBf16Q ? bits[e] : __half_as_ushort(__float2half_rn(x[e] * pow2(exponent)));
      pro.q[i][q_slot<Tr::K::kFormat, kKWords>(E * lane + e)] = op;  // in k_fragment's order
      sum += kBf16Q ? bf16_bits_to_fp32(op) : __half2float(__ushort_as_half(op));
    }
    for (int o = 1; o < lanes_per_group; o *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane % lanes_per_group == 0) pro.q_sum[lane / lanes_per_group][i] = sum;
    if (lane == 0) {
      pro.factor[i] = p.softmax_scale * kTcLog2e * pow2(-exponent);
      pro.slope[i] = p.alibi_slopes ? p.alibi_slopes[hk * group_size + in_group] * kTcLog2e : 0.0f;
    }
  }
}

// The sums of p z (one per head of the lane's pair) of O row element j's V scale group, which the
// main loop keeps at the group's first m-tile pair (2^v_shift pairs a group).
template <int kPairs>
__device__ __forceinline__ void group_zero_sums(const float (&z_acc)[kPairs][2], int j, int v_shift, float (&z)[2]) {
  const int first = (j / 2) & ~((1 << v_shift) - 1);
  z[0] = z[1] = 0.0f;
#pragma unroll
  for (int f = 0; f < kPairs; ++f)  // a select, not a run-time register index
    if (f == first) z[0] = z_acc[f][0], z[1] = z_acc[f][1];
}

// kKSlicesPerGroup / kVPairsPerGroup: K k-slices per K scale group and V m-tile pairs per V scale
// group when known at compile time (0: read from p). The common shapes -- one group per row, and
// groups of 32 -- get their own kernels: the group boundaries in the unrolled loops are then
// constants and the loops straight-line code. kKSlicesPerGroup = -1: chan-tN K, dequantized to fp16
// in the fragments (a step lies in one token group), then multiplied as raw fp16 K. kVPairsPerGroup =
// -1: nvfp4 V, whose blocks of 16 split an m-tile pair: their e4m3 scales multiply the V fragments
// (exact in fp16) and P' carries the uniform s_t / 2, built once per step.
// kPaged: K and V in pages (DecodeParams::block_table), a kernel of its own so that the contiguous
// kernels carry none of the page arithmetic (at B = 1 every instruction of a CTA is on the latency chain).
// A raw operand beside a quantized one (a +wW window's region) may lie in pages of a table of its own
// (DecodeParams::v_block_table); only those mixed pairs carry the second table's ids.
// C: the configuration (TcTraits; DecodeParams::tc_config).
// kTail: the last split reads the +wW windows' raw keys after its own (DecodeParams::window_tail;
// decode_tc_window_tail.cuh), a kernel of its own so that the others carry none of it (registers).
template <KvFormat FK, KvFormat FV, int D, int kKSlicesPerGroup, int kVPairsPerGroup, bool kPaged = false,
          TcConfig C = TcConfig::kStandard, bool kTail = false>
__global__ void __launch_bounds__(TcTraits<FK, FV, D, C>::kThreads, TcTraits<FK, FV, D, C>::kMinCtas)
    decode_tc_kernel(const DecodeParams p, const TcPlan plan) {
  using Tr = TcTraits<FK, FV, D, C>;
  constexpr bool kChanK = kKSlicesPerGroup < 0;
  constexpr bool kKQuant = Tr::K::kQuantized && !kChanK, kVQuant = Tr::V::kQuantized;  // kKQuant: scales after QK
  constexpr bool kVBlocks16 = kVPairsPerGroup < 0;
  static_assert(!kTail || (!kPaged && kKQuant && kVQuant), "window tails: contiguous K and V, both quantized");
  // int4 K a word a lane for two k-slices where no scale group ends between them (tc_int4_k_word)
  constexpr bool kKWords = FK == KvFormat::kInt4 && kKSlicesPerGroup >= 2;
  constexpr bool kVWords = FV == KvFormat::kInt4 && kVPairsPerGroup >= 2;  // tc_int4_v_word
  // int8 / int4 V codes multiplied biased, one instruction a code pair less (kTcBiasedCodes): the bias
  // leaves O's rows at the end (v_bias_sum: sum(P') by an MMA of its own, which one P' a step -- one
  // V scale group a row -- allows). Not in the window-tail kernels: their registers spilled more.
  constexpr bool kVBiased = kVQuant && kTcBiasedCodes<FV> && kVPairsPerGroup == Tr::kSlices / 2 && !kTail;
  constexpr int kST = Tr::kStepTokens, kS = Tr::kStages;
  // Scale groups per row when the shape fixes them (0: read from p)
  constexpr int kKGroups = kKSlicesPerGroup > 0 ? Tr::kSlices / kKSlicesPerGroup : 0;
  constexpr int kVGroups = kVPairsPerGroup > 0 ? Tr::kSlices / 2 / kVPairsPerGroup : 0;
  // A step's parameter words when the groups are known (fp16 planar parameters), else 0
  constexpr int kKParamWords = kKGroups > 0 ? tc_span_words(kST, kKGroups, 2) : 0;
  constexpr int kVParamWords = kVGroups > 0 ? tc_span_words(kST, kVGroups, 2) : 0;
  extern __shared__ uint4 tc_smem[];
  TcPrologue<D>& pro = *reinterpret_cast<TcPrologue<D>*>(tc_smem);
  uint32_t* stages = reinterpret_cast<uint32_t*>(tc_smem) + sizeof(TcPrologue<D>) / 4;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  // blockIdx.x = ((b * Hkv + hk) * splits + split) * head_blocks + hb, taken apart without dividing
  const TcCta cta = tc_cta(p, plan);
  const int64_t b = cta.b, hk = cta.hk, hb = cta.hb;
  const int split = cta.split;
  const int64_t len = p.seq_lens ? p.seq_lens[b] : p.tokens;
  // The region's keys [lo, hi). Steps start at lo, except where a step must lie in one token group
  // (chan-tN K, N a multiple of 32) or in whole 16-key halves of a page (paged kernels with a raw
  // operand, whose +wW regions start mid-page): there at the multiple of the step below lo, the keys
  // below lo masked (in the split's first step only, which keeps at least one key: a step wholly
  // masked would make the softmax's running max -inf, and NaN). Whole rounds of steps per split, so
  // every warp of a CTA gets the same number of steps.
  int64_t lo = 0, hi = len;
  key_region_bounds(p.region, p.k_window, p.v_window, len, lo, hi);
  constexpr bool kAlignedSteps = kChanK || (kPaged && !Tr::kQuantized);  // paged both-quantized regions start at 0
  const int64_t base = kAlignedSteps ? lo / kST * kST : lo, span = hi > base ? hi - base : 0;
  constexpr int kRound = Tr::kSplitRound;
  // span < 2^31 (plan_decode checks T): the split's keys by the plan's divider
  const int64_t per_split =
      (static_cast<int64_t>(plan.by_splits.div(static_cast<uint32_t>(span + p.splits - 1))) + kRound - 1) / kRound * kRound;
  const int64_t t_begin = base + split * per_split;
  const int64_t t_end = t_begin + per_split < hi ? t_begin + per_split : hi;
  const int first_masked = kAlignedSteps && split == 0 ? static_cast<int>(lo - base) : 0;  // constant 0 unless aligned

  const TcStageLayout lay{plan.k_params, plan.v_params, plan.stage_words};
  const TcSource ks = tc_source<D, FK, kPaged, !kChanK && (FK == KvFormat::kInt4 || FK == KvFormat::kInt5)>(p.k, plan.k, p, b, hk,
                                                                                                   Tr::kKRowWords, t_begin);
  const TcSource vs = tc_source<D, FV, kPaged>(p.v, plan.v, p, b, hk, Tr::kVRowWords, t_begin);
  // Groups are powers of two (they divide D and hold whole k-slices): shifts, not divisions, in the loops.
  const int k_shift = kKSlicesPerGroup > 0 ? ilog2(kKSlicesPerGroup) : plan.k.group_shift;
  const int v_shift = kVPairsPerGroup > 0 ? ilog2(kVPairsPerGroup) : kVBlocks16 ? ilog2(Tr::kSlices / 2) : plan.v.group_shift;
  // Paged caches: the pages of a step's halves. Their ids are read from the block table one step
  // before the step is issued (a dependent load in front of the copies would stall the warp).
  constexpr bool paged = kPaged;
  // Entries are indexed in 32 bits (tables of fewer than 2^31 entries: paged_unsupported_reason), so
  // a step's table address is one 32-bit add from the row's first entry, not a 64-bit product of b.
  const int row0 = static_cast<int>(b) * static_cast<int>(p.table_stride);
  constexpr bool kTwoTables = paged && (Tr::K::kQuantized != Tr::V::kQuantized);
  const bool two_tables = kTwoTables && p.v_block_table != nullptr;
  const int32_t* v_table = two_tables ? p.v_block_table : p.block_table;
  struct PageIds {
    int first = 0, second = 0, v_first = 0, v_second = 0;  // v_*: V's pages (kTwoTables kernels only)
  };
  struct StepPages {
    PageShift k, v;
  };
  // The ids of the pages of keys [t0, t0 + n). The second half's entry is chosen by its index, never by
  // a value chosen from the first load: such a select waits for that load where it is issued, a full
  // memory latency in every step (ncu's top stall of the paged step). Where both halves lie in one page
  // (or the second has no keys) the second load reads the first's entry again, from L1.
  auto page_ids = [&](int t0, int n) {
    PageIds r;
    if constexpr (paged) {
      const int i0 = t0 >> plan.page_shift, i1 = kST > 16 && n > 16 ? (t0 + 16) >> plan.page_shift : i0;
      r.first = __ldg(p.block_table + (row0 + i0));
      if constexpr (kST > 16) r.second = __ldg(p.block_table + (row0 + i1));
      if constexpr (kTwoTables) {
        r.v_first = __ldg(v_table + (row0 + i0));
        if constexpr (kST > 16) r.v_second = __ldg(v_table + (row0 + i1));
      }
    }
    return r;
  };
  // ids.second is ids.first where both halves lie in one page (t < 2^31: 32-bit in-page arithmetic)
  auto page_shifts = [&](int64_t t0, PageIds ids) {
    StepPages r;
    if constexpr (paged) {
      const int mask = (1 << plan.page_shift) - 1, in0 = static_cast<int>(t0) & mask;
      const int v_first = kTwoTables ? ids.v_first : ids.first, v_second = kTwoTables ? ids.v_second : ids.second;
      set_page_shift<kChanK>(r.k, 0, plan.k, ids.first, in0), set_page_shift(r.v, 0, plan.v, v_first, in0);
      if constexpr (kST > 16) {
        const int in1 = (static_cast<int>(t0) + 16) & mask;
        set_page_shift<kChanK>(r.k, 1, plan.k, ids.second, in1), set_page_shift(r.v, 1, plan.v, v_second, in1);
      }
    }
    return r;
  };
  // Steps of this warp: w, w + 4, ... of the split's keys.
  const int64_t keys = t_end > t_begin ? t_end - t_begin : 0;
  const int64_t all_steps = (keys + kST - 1) / kST;
  const int my_steps = static_cast<int>(all_steps > warp ? (all_steps - warp + Tr::kWarps - 1) / Tr::kWarps : 0);
  uint32_t* ring = stages + warp * kS * lay.stage_words;
  const uint32_t k_magic = plan.k.units_magic, v_magic = plan.v.units_magic;
  // Step s of this warp starts at t_first + s kWarps kST. A split's keys number below 2^31 (plan_decode
  // checks T), so a step's keys are counted in 32 bits from the warp's first key, which the loop keeps
  // (from the warp index it would re-read the thread index each step: ncu, a stall on S2R).
  const int64_t t_first = t_begin + static_cast<int64_t>(warp) * kST;
  const int keys_from_first = my_steps > 0 ? static_cast<int>(t_end - t_first) : 0;
  auto step_start = [&](int s) { return t_first + static_cast<int64_t>(s) * (Tr::kWarps * kST); };
  // n_lo > 0 only for step 0 (kAlignedSteps), issued before the loop: the loop's copies carry no lower mask.
  auto step_keys = [&](int s) { return min(keys_from_first - s * (Tr::kWarps * kST), kST); };
  auto issue = [&](int s, int n_lo, PageIds ids) {
    if (s < my_steps) {
      uint32_t* st = ring + (s % kS) * lay.stage_words;
      const int64_t t0 = step_start(s);
      const int n = step_keys(s);
      const StepPages pages = page_shifts(t0, ids);  // contiguous: no page arithmetic (copy_step<.., false>)
      copy_step<Tr::kKRowWords, typename Tr::KRows, kST, kChanK, kPaged, kKParamWords>(st, st + lay.k_params, ks, t0,
                                                                                       n_lo, n, lane, k_magic, pages.k);
      copy_step<Tr::kVRowWords, typename Tr::VRows, kST, false, kPaged, kVParamWords>(
          st + kST * Tr::kKStride, st + lay.v_params, vs, t0, n_lo, n, lane, v_magic, pages.v);
    }
    cp_async_commit();  // empty groups keep the count uniform
  };
  auto step_page_ids = [&](int s) {
    if (s >= my_steps) return PageIds{};
    return page_ids(static_cast<int>(step_start(s)), step_keys(s));  // paged: keys below 2^31 (decode_launch.cu)
  };
  // The first stages' copies (and the pages they read) are issued before the prologue, whose Q loads
  // and conversions then overlap them: the stages lie past the prologue's shared memory.
  PageIds next_ids{};
#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if constexpr (paged) next_ids = step_page_ids(s);
    issue(s, s == 0 && warp == 0 ? first_masked : 0, next_ids);
  }
  if constexpr (paged) next_ids = step_page_ids(kS - 1);
  if constexpr (kTail)
    if (split == p.splits - 1) prefetch_window_rows<2 * D>(p, b, hk, len);
  // The split's first V scale (2^Ev below) loaded before the prologue: its latency overlaps Q's.
  float first_v_scale = 0.0f;
  if (kVQuant && t_begin < t_end) {
    first_v_scale = vs.tensor_scale;
    // t_begin's row and parameter index (paged: in t_begin's page)
    const uint8_t* row = vs.rows + t_begin * vs.stride_t;
    int64_t param_index = vs.first_param + t_begin * vs.groups;
    if constexpr (paged) {
      const int64_t id = __ldg(v_table + (row0 + (static_cast<int>(t_begin) >> plan.page_shift))), in_page = t_begin & ((1 << plan.page_shift) - 1);
      row = vs.rows + id * plan.v.page_bytes + in_page * vs.stride_t;
      param_index = vs.first_param + id * p.v.param_stride_page + in_page * vs.groups;
    }
    if (vs.mode == ParamMode::kInlineRow)
      first_v_scale = __half2float(__ushort_as_half(__ldg(reinterpret_cast<const uint16_t*>(row))));
    else if (kVBlocks16)
      first_v_scale = vs.scale_mult;
    else if (vs.mode != ParamMode::kTensor && vs.mode != ParamMode::kNone)
      first_v_scale = param_in_memory<FV == KvFormat::kLut4>(vs.scales, param_index, vs.scale_dtype, vs.scale_mult);
    // mxfp4's zero block stores e = 0 (2^-127): folding by it would lift the next blocks' P' past fp16
    if (FV == KvFormat::kLut4 && vs.scale_dtype == ScaleDtype::kE8M0 && first_v_scale < 0x1p-120f) first_v_scale = 0.0f;
  }
  tc_prologue<Tr, D, kKWords>(pro, p, plan, b, hk, hb);
  __syncthreads();

  // This lane's Q operands (head g) of k-slice j. Kept in registers by the one-group-per-row kernels;
  // the others, short of registers (their scale groups), read them from shared memory each step.
  constexpr bool kQInRegisters = kKSlicesPerGroup == Tr::kSlices;
  auto q_operands = [&](int j) { return *reinterpret_cast<const uint2*>(pro.q[g] + 16 * j + 4 * c); };
  uint2 qf[Tr::kSlices];
  if constexpr (kQInRegisters)
#pragma unroll
    for (int j = 0; j < Tr::kSlices; ++j) qf[j] = q_operands(j);
  const float factor[2] = {pro.factor[2 * c], pro.factor[2 * c + 1]};
  const float slope[2] = {pro.slope[2 * c], pro.slope[2 * c + 1]};

  // 2^Ev: the V scale of the split's first key brings P' = p * s * 2^Ev near 1.
  float v_fold = first_v_scale > 0.0f ? pow2(fp16_operand_exponent(first_v_scale) - 14) : 1.0f;  // 2^-floor(log2 s)

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float v_bias_sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // kVBiased: sum(P') of heads 2c, 2c + 1 (elements 0, 1)
  float o[Tr::kSlices][4];
  float z_acc[Tr::kSlices / 2][2];
#pragma unroll
  for (int j = 0; j < Tr::kSlices; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
#pragma unroll
  for (int i = 0; i < Tr::kSlices / 2; ++i) z_acc[i][0] = z_acc[i][1] = 0.0f;


  for (int s = 0; s < my_steps; ++s) {
    cp_async_wait<kS - 2>();
    __syncwarp();
    issue(s + kS - 1, 0, next_ids);  // into the stage consumed at step s - 1
    if constexpr (paged) next_ids = step_page_ids(s + kS);
    const uint32_t* st = ring + (s % kS) * lay.stage_words;
    const uint32_t* kc = st;
    const uint32_t* vc = st + kST * Tr::kKStride;
    const int64_t t0 = step_start(s);
    const int n = step_keys(s);
    // Rows [n_lo, n) are keys; n_lo > 0 only in the first step of a region that starts mid-group
    // or mid-page (kAlignedSteps), masked under a branch of its own.
    const int n_lo = s == 0 && warp == 0 ? first_masked : 0;

    // ---- QK: scores of keys (16 mt + g, + 8) x heads (2c, 2c + 1), log2 domain. The m-tiles and
    // two accumulators per m-tile (even / odd k-slices) are independent MMA chains.
    // Groups of at most 2 k-slices take one chain per m-tile: registers, not latency, limit them; so
    // does the general kernel at D = 256, which sits at the 255-register limit (with a second chain
    // it spilled, and that build read a corrupted parameter address on the H100: 222aedf's gate).
    constexpr int kChains = kKSlicesPerGroup == 1 || kKSlicesPerGroup == 2 || (kKSlicesPerGroup == 0 && D >= 256) ? 1 : 2;
    float acc[Tr::kMTiles][kChains][4], total[Tr::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Tr::kMTiles; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        total[mt][e] = 0.0f;
#pragma unroll
        for (int k = 0; k < kChains; ++k) acc[mt][k][e] = 0.0f;
      }
#pragma unroll
    for (int j = 0; j < Tr::kSlices; ++j) {
#pragma unroll
      for (int mt = 0; mt < Tr::kMTiles; ++mt) {
        uint32_t a[4];
        k_fragment<FK, typename Tr::KRows, kKWords>(kc, 16 * mt + g, j, c, ks, a);
        if constexpr (kChanK) channel_dequant<FK>(a, st + lay.k_params, ks.param_words, j, c, ks.asymmetric);
        const uint2 qj = kQInRegisters ? qf[j] : q_operands(j);
        mma_16816<Tr::K::kBf16Mma>(acc[mt][j % kChains], a, qj.x, qj.y);
      }
      if constexpr (kKQuant) {
        if (((j + 1) & ((1 << k_shift) - 1)) == 0) {  // the group's product is complete: scale it
          const int grp = j >> k_shift;
          const float qs0 = ks.has_zero ? pro.q_sum[grp][2 * c] : 0.0f;
          const float qs1 = ks.has_zero ? pro.q_sum[grp][2 * c + 1] : 0.0f;
          RowParams kp[Tr::kMTiles][2];
          tile_params<Tr::kMTiles, kST, kKGroups, FK == KvFormat::kLut4>(ks, st + lay.k_params, g, grp, n, kp);
#pragma unroll
          for (int mt = 0; mt < Tr::kMTiles; ++mt) {
            const RowParams p0 = kp[mt][0], p1 = kp[mt][1];
            float* t = total[mt];
            float a[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) a[e] = kChains == 1 ? acc[mt][0][e] : acc[mt][0][e] + acc[mt][kChains - 1][e];
            t[0] = __fmaf_rn(a[0], p0.scale, __fmaf_rn(p0.zero, qs0, t[0]));
            t[1] = __fmaf_rn(a[1], p0.scale, __fmaf_rn(p0.zero, qs1, t[1]));
            t[2] = __fmaf_rn(a[2], p1.scale, __fmaf_rn(p1.zero, qs0, t[2]));
            t[3] = __fmaf_rn(a[3], p1.scale, __fmaf_rn(p1.zero, qs1, t[3]));
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
              for (int k = 0; k < kChains; ++k) acc[mt][k][e] = 0.0f;
          }
        }
      }
    }
    float sc[Tr::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Tr::kMTiles; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float raw = kChains == 1 ? acc[mt][0][e] : acc[mt][0][e] + acc[mt][kChains - 1][e];  // raw K: the chains' sum
        sc[mt][e] = (kKQuant ? total[mt][e] : raw) * factor[e % 2];
      }
    bias_and_mask_scores<Tr::kMTiles, kST>(sc, slope, p.alibi_slopes != nullptr, len, t0, g, n_lo, n);

    // ---- online softmax over the step
    float alpha[2];
    if (softmax_step(sc, m, l, alpha)) {
#pragma unroll
      for (int j = 0; j < Tr::kSlices; ++j) o[j][0] *= alpha[0], o[j][1] *= alpha[1], o[j][2] *= alpha[0], o[j][3] *= alpha[1];
#pragma unroll
      for (int i = 0; i < Tr::kSlices / 2; ++i) z_acc[i][0] *= alpha[0], z_acc[i][1] *= alpha[1];
      if constexpr (kVBiased) v_bias_sum[0] *= alpha[0], v_bias_sum[1] *= alpha[1];
    }

    // ---- PV: m-tile pairs i of D, each over the step's m-tiles (16-key k-steps) in order. P'
    // (the PV operand) is rebuilt at each V scale group's first pair.
    uint32_t pb[Tr::kMTiles][2];
#pragma unroll
    for (int i = 0; i < Tr::kSlices / 2; ++i) {
      if constexpr (kVQuant) {
        if ((i & ((1 << v_shift) - 1)) == 0) {
          const int grp = i >> v_shift;
          RowParams vp[Tr::kMTiles][2];
          if constexpr (kVBlocks16) {  // one factor for every key; rows past the range's end none
#pragma unroll
            for (int mt = 0; mt < Tr::kMTiles; ++mt)
#pragma unroll
              for (int h = 0; h < 2; ++h) vp[mt][h] = {16 * mt + g + 8 * h < n ? vs.scale_mult : 0.0f, 0.0f};
          } else {
            tile_params<Tr::kMTiles, kST, kVGroups, FV == KvFormat::kLut4>(vs, st + lay.v_params, g, grp, n, vp);
          }
          if (n_lo > 0)  // keys below the region: their (stale) V parameters must not reach P'
#pragma unroll
            for (int mt = 0; mt < Tr::kMTiles; ++mt)
#pragma unroll
              for (int h = 0; h < 2; ++h)
                if (16 * mt + g + 8 * h < n_lo) vp[mt][h] = {0.0f, 0.0f};
#pragma unroll
          for (int mt = 0; mt < Tr::kMTiles; ++mt) {
            const float f0 = vp[mt][0].scale * v_fold, f1 = vp[mt][1].scale * v_fold;
            pb[mt][0] = transpose_8x8(pack_rounded<false>(sc[mt][0] * f0, sc[mt][1] * f0));
            pb[mt][1] = transpose_8x8(pack_rounded<false>(sc[mt][2] * f1, sc[mt][3] * f1));
            if (vs.has_zero) {  // sum(p z) per V group, kept at its first pair
              const float z0 = vp[mt][0].zero, z1 = vp[mt][1].zero;
              z_acc[i][0] = __fmaf_rn(sc[mt][0], z0, __fmaf_rn(sc[mt][2], z1, z_acc[i][0]));
              z_acc[i][1] = __fmaf_rn(sc[mt][1], z0, __fmaf_rn(sc[mt][3], z1, z_acc[i][1]));
            }
          }
        }
      } else if (i == 0) {
#pragma unroll
        for (int mt = 0; mt < Tr::kMTiles; ++mt) {
          pb[mt][0] = transpose_8x8(pack_rounded<Tr::V::kBf16Mma>(sc[mt][0], sc[mt][1]));
          pb[mt][1] = transpose_8x8(pack_rounded<Tr::V::kBf16Mma>(sc[mt][2], sc[mt][3]));
        }
      }
#pragma unroll
      for (int mt = 0; mt < Tr::kMTiles; ++mt) {
        uint32_t lo[4], hi[4];
        v_fragments<FV, typename Tr::VRows, kVWords, kVBiased>(vc, 16 * mt + 2 * c, i, g, vs, lo, hi);
        if constexpr (kVBlocks16) scale_v_blocks16(lo, hi, st + lay.v_params, vs, 16 * mt + 2 * c, i, g, n_lo, n);
        mma_16816<Tr::V::kBf16Mma>(o[2 * i], lo, pb[mt][0], pb[mt][1]);
        mma_16816<Tr::V::kBf16Mma>(o[2 * i + 1], hi, pb[mt][0], pb[mt][1]);
      }
    }
    if constexpr (kVBiased) {  // sum(P') as the tensor cores add it: a row of ones times P'
      constexpr uint32_t kOnes = 0x3c003c00u;
      const uint32_t ones[4] = {kOnes, kOnes, kOnes, kOnes};
#pragma unroll
      for (int mt = 0; mt < Tr::kMTiles; ++mt) mma_16816<false>(v_bias_sum, ones, pb[mt][0], pb[mt][1]);
    }
  }
  cp_async_wait<0>();
  if constexpr (kVBiased) {  // O rows g hold the codes' values plus the bias; int4's rows g + 8, 16 times theirs
    const bool sym = !vs.has_zero;
#pragma unroll
    for (int j = 0; j < Tr::kSlices; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool high = FV == KvFormat::kInt4 && e >= 2;
        const float unbiased = __fmaf_rn(-tc_code_bias<FV>(sym, high), v_bias_sum[e % 2], o[j][e]);
        o[j][e] = high ? unbiased * 0.0625f : unbiased;
      }
  }
  if constexpr (kTail)
    if (split == p.splits - 1) {  // the window's raw keys continue the last split
      // O out of V's folded domain (the window's raw V has no scales), as the merge below takes it:
      // o / 2^Ev plus its group's sum(p z) over the warp's keys; the merge then finds a fold of 1 and
      // no sums left.
#pragma unroll
      for (int i = 0; i < Tr::kSlices / 2; ++i) z_acc[i][0] = quad_sum(z_acc[i][0]), z_acc[i][1] = quad_sum(z_acc[i][1]);
#pragma unroll
      for (int j = 0; j < Tr::kSlices; ++j) {
        float z[2];
        group_zero_sums(z_acc, j, v_shift, z);
#pragma unroll
        for (int e = 0; e < 4; ++e) o[j][e] = __fmaf_rn(o[j][e], 1.0f / v_fold, z[e % 2]);
      }
#pragma unroll
      for (int i = 0; i < Tr::kSlices / 2; ++i) z_acc[i][0] = z_acc[i][1] = 0.0f;
      v_fold = 1.0f;
      tc_window_tail<D, kVWords, kS, Tr::kCodeWords>(p, plan, stages, pro.slope, m, l, o);
      cp_async_wait<0>();
    }
  __syncthreads();  // the rings become the merge area
  static_assert(Tr::kWarps * Tr::kStages * Tr::kCodeWords >= (Tr::kWarps + 1) * Tr::kHeads * D + 3 * Tr::kWarps * Tr::kHeads + Tr::kHeads,
                "the warps' merge (and a cluster's split O) fits in the stages");

  // ---- merge the warps: unnormalized O, max and sum per head through shared memory
  float* w_o = reinterpret_cast<float*>(stages);  // [warp][head][D], each row swizzled (tc_w_o_slot)
  float* w_m = w_o + Tr::kWarps * Tr::kHeads * D;  // [warp][head]
  float* w_l = w_m + Tr::kWarps * Tr::kHeads;
  const float inv_fold = 1.0f / v_fold;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    l[hh] = quad_sum(l[hh]);
#pragma unroll
    for (int i = 0; i < Tr::kSlices / 2; ++i) z_acc[i][hh] = quad_sum(z_acc[i][hh]);
  }
#pragma unroll
  for (int j = 0; j < Tr::kSlices; ++j) {
    const int d0 = tc_v_row_element(j, g, kVWords);  // rows g -> d0, g + 8 -> d0 + 1
    float z[2];
    group_zero_sums(z_acc, j, v_shift, z);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int hh = e % 2, d = d0 + e / 2;
      const float value = kVQuant ? __fmaf_rn(o[j][e], inv_fold, z[hh]) : o[j][e];
      w_o[(warp * Tr::kHeads + 2 * c + hh) * D + tc_w_o_slot(2 * c + hh, d)] = value;
    }
  }
  if (g == 0) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) w_m[warp * Tr::kHeads + 2 * c + hh] = m[hh], w_l[warp * Tr::kHeads + 2 * c + hh] = l[hh];
  }
  __syncthreads();

  // Per head once: the weight of each warp's partial (2^(m_w - max) / sum) and the LSE.
  float* w_weight = w_l + Tr::kWarps * Tr::kHeads;  // [head][warp]
  float* head_lse = w_weight + Tr::kWarps * Tr::kHeads;
  if (threadIdx.x < Tr::kHeads) {
    const int i = threadIdx.x;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) mx = fmaxf(mx, w_m[w * Tr::kHeads + i]);
    float f[Tr::kWarps], den = 0.0f;
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) {
      const float wm = w_m[w * Tr::kHeads + i];
      f[w] = mx == -INFINITY || wm == -INFINITY ? 0.0f : exp2f(wm - mx);
      den = __fmaf_rn(f[w], w_l[w * Tr::kHeads + i], den);
    }
    const float inv = mx == -INFINITY ? 0.0f : 1.0f / den;
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) w_weight[i * Tr::kWarps + w] = f[w] * inv;
    head_lse[i] = mx == -INFINITY ? -INFINITY : (mx + log2f(den)) / kTcLog2e;
  }
  __syncthreads();

  // The CTA's heads are consecutive rows of O (or of a partial slot): element idx of the block is
  // row base + idx, so the loop carries no per-element index arithmetic.
  const int64_t first_head = hb * Tr::kHeads;
  const int heads = static_cast<int>(plan.group_size - first_head < Tr::kHeads ? plan.group_size - first_head : Tr::kHeads);
  const int64_t row = b * p.q_heads + hk * plan.group_size + first_head;  // (b, first head)
  const bool direct = p.splits == 1 && p.region_count == 1;
  const int64_t slot_row = (static_cast<int64_t>(p.split_base + split) * p.batch) * p.q_heads + row;
  float* cluster_o = head_lse + Tr::kHeads;  // [head][D]: this split's O, read by the cluster's merge
  auto store = [&](int idx, float out) {
    if (p.cluster_merge) cluster_o[idx] = out;
    else if (direct) p.out[row * D + idx] = fp32_to_bf16_bits(out);
    else p.partial_o[slot_row * D + idx] = out;
  };
  auto merged = [&](int idx) {  // the warps' partials of element idx, weighted
    const int i = idx / D, d = idx % D;
    float out = 0.0f;
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) out = __fmaf_rn(w_weight[i * Tr::kWarps + w], w_o[(w * Tr::kHeads + i) * D + tc_w_o_slot(i, d)], out);
    return out;
  };
  if (!p.v.hadamard) {
    for (int idx = threadIdx.x; idx < heads * D; idx += Tr::kThreads) store(idx, merged(idx));
  } else {  // O is in V's rotated basis: each split's O rotated back (H is its own inverse) before the merge
    for (int idx = threadIdx.x; idx < heads * D; idx += Tr::kThreads) cluster_o[idx] = merged(idx);
    __syncthreads();
    constexpr int E = D / 32;
    const int lane = threadIdx.x % 32;
    for (int i = threadIdx.x / 32; i < heads; i += Tr::kWarps) {
      float x[E];
#pragma unroll
      for (int e = 0; e < E; ++e) x[e] = cluster_o[i * D + E * lane + e];
      hadamard_across_lanes<E, D>(x, lane, p.v.hadamard_block > 0 ? p.v.hadamard_block : D);
      __syncwarp();  // the row's reads are done before the cluster's copy is overwritten in place
#pragma unroll
      for (int e = 0; e < E; ++e) store(i * D + E * lane + e, x[e]);
    }
  }
  if (p.cluster_merge) return merge_cluster_splits<Tr::kThreads>(p, cluster_o, head_lse, heads, D, row);
  if (threadIdx.x < heads) (direct ? p.lse[row + threadIdx.x] : p.partial_lse[slot_row + threadIdx.x]) = head_lse[threadIdx.x];
  // The stages (the warps' partials, stored above) hold the last split's merge: its LSEs, its O so far
  // and at least one split's O rows.
  constexpr int kStageFloats = Tr::kWarps * Tr::kStages * Tr::kCodeWords;
  static_assert(kStageFloats >= 16 + Tr::kHeads * kMaxSplits + 2 * Tr::kHeads * D, "the last split's merge fits in the stages");
  if (p.split_counters) {  // (b, KV head, head block) of blockIdx.x taken apart again: nothing held through the loop
    const uint32_t cta_again = blockIdx.x, by_blocks = plan.by_head_blocks.div(cta_again);
    const uint32_t group = plan.by_splits.div(by_blocks), block = cta_again - by_blocks * static_cast<uint32_t>(plan.head_blocks);
    const LastSplitMerge m{p.partial_o, p.partial_lse, p.out, p.lse, p.batch * p.q_heads, p.splits};
    merge_as_last_split<Tr::kThreads>(m, p.split_counters + group * static_cast<uint32_t>(plan.head_blocks) + block, row,
                                      heads, D, reinterpret_cast<float*>(stages), kStageFloats);
  }
}

}  // namespace kvq::detail
