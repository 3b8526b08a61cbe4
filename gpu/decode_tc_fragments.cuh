// Per-storage pieces of the tensor-core decode kernel: copying a step of K or V rows (and their
// scales) into shared memory, and turning stored codes into MMA fragments.
//
// Fragment mapping (m16n8k16, lane = 4g + c):
//  - QK (keys in M, heads in N, D is the reduction): a lane reads 4 consecutive elements
//    d = 16j + 4c + {0..3} of keys g and g+8 for k-slice j. D may be permuted freely as long as Q
//    follows, so the 4 elements fill k positions {2c, 2c+1, 2c+8, 2c+9} in whatever order the
//    conversion produces them (q_perm; int4 read a word for two k-slices: tc_int4_k_word).
//  - PV (D in M, keys the reduction, heads in N): m-tiles 2i and 2i+1 take d = 32i + 4g + {0..3}
//    (rows g and g+8 of each), keys 2c, 2c+1, 2c+8, 2c+9 of the 16-key k-step: a lane reads 4
//    consecutive elements of each of its 4 keys and pairs equal d across two keys (int4 read a word
//    for two m-tile pairs: tc_int4_v_word, and O's elements follow, tc_v_row_element).
// Codes become fp16 exactly: a code byte or nibble ORed into the mantissa of 1024.0 (0x6400) is
// 1024 + u, one fp16 subtraction (or fma for a nibble in bits 4..7) leaves the signed code. (A nibble
// as an fp16 subnormal, u * 2^-24 with no bias, would save that subtraction but loses up to 13 bits in
// mma.sync: experiments/results/nvidia-h200/mma-subnormal-codes/.) FP8 values are fp16 values: e5m2
// is the high byte of its fp16, e4m3 widens by one cvt per pair.
// Scales and zero points are applied around the products (decode_tc_kernel.cuh), never here.
#pragma once

#include <cuda_fp8.h>

#include "gpu/decode_tc_traits.cuh"

namespace kvq::detail {

// One of K or V for the CTA's (b, KV head): where its rows and parameters are.
struct TcSource {
  const uint8_t* rows = nullptr;  // row t at rows + t * stride_t (inline params first, then codes)
  int64_t stride_t = 0;
  bool vec16 = false;      // 16-byte copies (aligned rows without inline params)
  int copy_words = 1;      // otherwise: words per copy: 4 (16-byte chunks), 2 (8-byte), 1
  int inline_words = 0;    // FBGEMM rows: one (scale, shift) word per group before the codes
  int groups = 1;          // scale groups per row
  ParamMode mode = ParamMode::kNone;
  bool asymmetric = false;
  bool has_zero = false;  // KvOperand's; without it the codes are signed (two's complement, kLut4's table)
  ScaleDtype scale_dtype = ScaleDtype::kFp16;
  float code_offset = 0.0f;
  float scale_mult = 1.0f;  // one-byte scales (mxfp4, nvfp4): times this (the table's 1/2, nvfp4's s_t)
  uint32_t lut[4] = {0, 0, 0, 0};
  const uint8_t* scales = nullptr;  // planar parameters
  const uint8_t* zeros = nullptr;
  int64_t first_param = 0;  // element index of (t = 0, group 0)
  float tensor_scale = 1.0f, tensor_zero = 0.0f;
  const uint8_t* lane_src = nullptr;  // 16-byte copies: this lane's first chunk of row 0
  int64_t pass_bytes = 0;             // 16-byte copies: bytes between the rows of consecutive passes
  // Planar per-row parameters (token, head, gG). A step's span of them starts at the same offset
  // within a word in every step (steps start an even number of keys after the CTA's first key
  // t_origin), so a lane copies the same word of every step: scale_lane / zero_lane is that word at
  // t_origin (chan-tN: at t = 0; null without per-row params).
  const uint8_t *scale_lane = nullptr, *zero_lane = nullptr, *scale_end = nullptr, *zero_end = nullptr;
  int param_words = 0;   // words of one step's span (the zero points' follow the scales' in a stage)
  int param_offset = 0;  // the span's first element within its first word (fp16: 0 or 1)
  int param_row_bytes = 0;  // parameter bytes per key
  int channel_tokens = 0;    // kChannel: tokens per group (a step lies in one); its span is D parameters
  int channel_bytes = 0;
  int64_t t_origin = 0;
  // Every step's span of this CTA lies inside the parameter arrays: whole-word copies, no clamping
  // (only the CTAs at an array's end copy its last, possibly half, word).
  bool params_inside = false;
};

// The words of row (b, h) rows and params of `op` for this CTA; what is the same for every CTA comes
// from the host's plan (`pl`), so no thread divides.
// F: the operand's storage. What only the block formats use (a code offset: int4 / int5 storages
// outside chan-tN kernels, kMayOffset; one-byte scales and the table: kLut4) is read for those
// storages alone, so that the other kernels keep their registers.
template <int D, KvFormat F, bool kPaged, bool kMayOffset = F == KvFormat::kInt4 || F == KvFormat::kInt5>
__device__ __forceinline__ TcSource tc_source(const KvOperand& op, const TcOperandPlan& pl, const DecodeParams& p,
                                              int64_t b, int64_t h, int row_words, int64_t t_origin) {
  TcSource s;
  constexpr bool paged = kPaged;  // rows and parameters of page 0 here; copy_step adds each page's
  s.rows = op.data + (paged ? 0 : b * op.stride_b) + h * op.stride_h;
  s.stride_t = op.stride_t;
  s.mode = op.mode;
  s.asymmetric = op.asymmetric, s.scale_dtype = op.scale_dtype;
  if constexpr (kMayOffset) s.code_offset = static_cast<float>(op.code_offset);  // q4_0, q5_0
  s.has_zero = kMayOffset ? op.has_zero() : op.asymmetric;
  if constexpr (F == KvFormat::kLut4) {
    constexpr uint32_t kIq4Nl[4] = {lut_word(LutTable::kIq4Nl, 0), lut_word(LutTable::kIq4Nl, 1),
                                    lut_word(LutTable::kIq4Nl, 2), lut_word(LutTable::kIq4Nl, 3)};
    constexpr uint32_t kE2m1[4] = {lut_word(LutTable::kE2m1Doubled, 0), lut_word(LutTable::kE2m1Doubled, 1),
                                   lut_word(LutTable::kE2m1Doubled, 2), lut_word(LutTable::kE2m1Doubled, 3)};
    const bool e2m1 = op.lut == LutTable::kE2m1Doubled;
#pragma unroll
    for (int i = 0; i < 4; ++i) s.lut[i] = e2m1 ? kE2m1[i] : kIq4Nl[i];
    // one-byte scales (mxfp4, nvfp4) go with the doubled e2m1 table: their values carry its 1/2
    if (op.param_bytes() == 1) s.scale_mult = 0.5f * (op.tensor_scale ? __ldg(op.tensor_scale) : 1.0f);
  }
  s.groups = pl.groups;
  s.inline_words = pl.inline_words;
  s.vec16 = pl.vec16;
  s.copy_words = pl.copy_words;
  if (s.vec16) {
    const int chunks = row_words / 4, lane = threadIdx.x % 32;
    s.lane_src = s.rows + (lane / chunks) * op.stride_t + (lane % chunks) * 16;
    s.pass_bytes = (32 / chunks) * op.stride_t;
  }
  switch (op.mode) {
    case ParamMode::kTensor:
      s.tensor_scale = op.fp32_params() ? __ldg(static_cast<const float*>(op.scales))
                                      : __half2float(__ushort_as_half(__ldg(static_cast<const uint16_t*>(op.scales))));
      if (op.asymmetric)
        s.tensor_zero = op.fp32_params() ? __ldg(static_cast<const float*>(op.zeros))
                                       : __half2float(__ushort_as_half(__ldg(static_cast<const uint16_t*>(op.zeros))));
      break;
    case ParamMode::kToken: s.first_param = paged ? 0 : b * p.tokens; break;
    case ParamMode::kHead:
    case ParamMode::kGroup: s.first_param = paged ? h * op.param_stride_h : (b * p.kv_heads + h) * pl.params_per_head; break;
    case ParamMode::kChannel:
      s.first_param = paged ? h * op.param_stride_h : (b * p.kv_heads + h) * pl.params_per_head;
      s.channel_tokens = op.group, s.channel_bytes = D * op.param_bytes();
      break;
    default: break;
  }
  s.scales = static_cast<const uint8_t*>(op.scales), s.zeros = static_cast<const uint8_t*>(op.zeros);
  if (pl.param_bytes > 0) {
    const int pbytes = op.param_bytes();
    s.t_origin = op.mode == ParamMode::kChannel || paged ? 0 : t_origin;
    const int64_t origin = s.first_param + s.t_origin * s.groups;  // the element of (t_origin, group 0)
    const int64_t first_word = origin * pbytes / 4, lane = threadIdx.x % 32;
    s.param_offset = static_cast<int>(origin & (4 / pbytes - 1));
    s.param_words = pl.param_words;
    s.param_row_bytes = pl.param_row_bytes;
    s.scale_lane = s.scales + 4 * (first_word + lane), s.scale_end = s.scales + pl.param_bytes;
    if (op.asymmetric) s.zero_lane = s.zeros + 4 * (first_word + lane), s.zero_end = s.zeros + pl.param_bytes;
    const int64_t last_span = op.mode == ParamMode::kChannel
                                  ? (s.first_param + pl.params_per_head - D) * pbytes  // the last group's span
                                  : 4 * first_word + (p.tokens - s.t_origin) * s.param_row_bytes;
    s.params_inside = paged || last_span + 4 * s.param_words <= pl.param_bytes;  // pages hold whole spans
  }
  return s;
}

// One step's parameter span: `words` words, lane w + 32k from lane_src + 128k. The array's last
// word may hold only a half (fp16, odd total): cp.async copies what is there and zero-fills the rest
// (`inside`: the span ends before the array does, whole words). kMaxWords > 0: `words` is at most
// that (the kernels whose groups a row are known), so the copies unroll into predicated ones (a
// loop cost a step ~20 instructions a span, ncu: int4-head-asym's copies 22 % of its instructions).
template <int kMaxWords = 0>
__device__ __forceinline__ void copy_param_words(uint32_t* dst, const uint8_t* lane_src, const uint8_t* end,
                                                 const uint8_t* any_valid, int words, int lane, bool inside) {
  if (kMaxWords > 0 && inside) {
#pragma unroll
    for (int k = 0; k < (kMaxWords + 31) / 32; ++k)
      if (lane + 32 * k < words) cp_async4(smem_address(dst + lane + 32 * k), lane_src + 128 * k, true);
    return;
  }
  if (inside) {
#pragma unroll 1
    for (int w = lane; w < words; w += 32, lane_src += 128) cp_async4(smem_address(dst + w), lane_src, true);
    return;
  }
#pragma unroll 1
  for (int w = lane; w < words; w += 32, lane_src += 128) {
    const int64_t left = end - lane_src;
    const int bytes = left >= 4 ? 4 : left > 0 ? static_cast<int>(left) : 0;
    cp_async4_partial(smem_address(dst + w), bytes > 0 ? lane_src : any_valid, bytes);
  }
}

// Paged caches: where a step's rows and parameter span lie, per half of 16 keys (a step of 32 keys
// starts at a multiple of 16, so its halves may lie in two pages). Bytes from the operand's row 0
// (parameter 0) of page 0 to the half's first row (parameter) in its page: copy_step's kPaged
// kernels address rows from these alone, with no per-step 64-bit product of t.
struct PageShift {
  int64_t rows[2] = {0, 0}, params[2] = {0, 0};
};
// The half's first key is token `in_page` of page `id`. kChannel: chan-tN parameters, one unit a
// token group (the other operands' units are tokens: no shift to apply per step).
template <bool kChannel = false>
__device__ __forceinline__ void set_page_shift(PageShift& ps, int half, const TcOperandPlan& pl, int id, int in_page) {
  // both terms as 32 x 32 -> 64-bit products: two wide multiply-adds, no sign extension between them
  ps.rows[half] = static_cast<int64_t>(id) * pl.page_bytes + static_cast<int64_t>(in_page) * pl.page_row_bytes;
  const int unit = kChannel ? in_page >> pl.param_in_page_shift : in_page;
  ps.params[half] = static_cast<int64_t>(id) * pl.param_page_bytes + static_cast<int64_t>(unit) * pl.param_unit_bytes;
}

// A paged step's parameter span: each half's chunk_words words from its page (half h's word u from
// lane_src - 4 lane + 4 u + ps.params[h]). Up to 8 parameter bytes a key, a lane copies one word a half.
__device__ __forceinline__ void copy_paged_param_words(uint32_t* dst, const uint8_t* lane_src, bool two_halves,
                                                       int chunk_words, const PageShift& ps, int lane) {
  if (chunk_words <= 32) {
    if (lane < chunk_words) {
      cp_async4(smem_address(dst + lane), lane_src + ps.params[0], true);
      if (two_halves) cp_async4(smem_address(dst + chunk_words + lane), lane_src + ps.params[1], true);
    }
    return;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // unrolled: ps.params[h] stays in registers
    if (h == 1 && !two_halves) break;
#pragma unroll 1
    for (int w = lane; w < chunk_words; w += 32)
      cp_async4(smem_address(dst + h * chunk_words + w), lane_src + 4 * (w - lane) + ps.params[h], true);
  }
}

// Rows [t0, t0 + n) in copies of kUnit words: inline parameters to `params`, codes to `codes`.
template <int kUnit, int kRowWords, typename Rows, int kStepTokens, bool kPaged>
__device__ __forceinline__ void copy_rows_in_units(uint32_t* codes, uint32_t* params, const TcSource& s, int64_t t0,
                                                   int n_lo, int n, int lane, uint32_t units_magic, const PageShift& ps) {
  const int units = (s.inline_words + kRowWords) / kUnit;
  for (int i = lane; i < kStepTokens * units; i += 32) {
    const int r = static_cast<int>((static_cast<uint64_t>(i) * units_magic) >> 24);  // i / units
    const int w = (i - r * units) * kUnit;
    const bool ok = r >= n_lo && r < n;
    uint32_t* dst = w < s.inline_words ? params + r * s.inline_words + w : codes + Rows::word(r, w - s.inline_words);
    const int64_t offset = (kPaged ? (r & 15) * s.stride_t + (r < 16 ? ps.rows[0] : ps.rows[1]) : (t0 + r) * s.stride_t) + w * 4;
    const uint8_t* src = s.rows + (ok ? offset : 0);
    if constexpr (kUnit == 4) cp_async16(smem_address(dst), src, ok);
    else if constexpr (kUnit == 2) cp_async8(smem_address(dst), src, ok);
    else cp_async4(smem_address(dst), src, ok);
  }
}

// One step of rows [t0 + n_lo, t0 + n) into a stage: codes into `codes` (laid out as Rows says,
// the other rows zero-filled so that masked keys multiply finite values), parameters into `params`
// (kChannel: the step's token group of chan-tN parameters; a template argument, so that the other
// kernels carry none of its arithmetic). kParamWords > 0: a bound on s.param_words.
template <int kRowWords, typename Rows, int kStepTokens, bool kChannel = false, bool kPaged = false, int kParamWords = 0>
__device__ __forceinline__ void copy_step(uint32_t* codes, uint32_t* params, const TcSource& s, int64_t t0, int n_lo,
                                          int n, int lane, uint32_t units_magic, const PageShift& ps) {
  static_assert(kStepTokens <= 32, "PageShift holds two halves of 16 keys");
  constexpr bool kChunksTileWarp = kRowWords % 4 == 0 && 32 % (kRowWords / 4) == 0;  // 5-bit rows: 5 or 10 chunks
  if (kChunksTileWarp && s.vec16) {  // lane takes chunk lane % kChunks of rows lane / kChunks + k * kRowsPerPass
    constexpr int kChunks = kChunksTileWarp ? kRowWords / 4 : 1;
    constexpr int kRowsPerPass = 32 / kChunks;
    constexpr int kPasses = kStepTokens / kRowsPerPass;
    static_assert(kChunks <= 32 && 32 % kChunks == 0, "a row's 16-byte chunks tile a warp");
    const int row0 = lane / kChunks, ch = lane % kChunks;
    // a pass's rows lie in one half (kRowsPerPass divides 16): the second half's page from pass kHalf on
    constexpr int kHalf = 16 / kRowsPerPass;
    const uint8_t* src = s.lane_src + (kPaged ? ps.rows[0] : t0 * s.stride_t);
    const uint32_t dst = smem_address(codes);
    // pass k's rows lie k * kRowsPerPass rows further: a constant offset where that count is even
    constexpr bool kAffine = kRowsPerPass % 2 == 0;
    const uint32_t at0 = dst + 4 * Rows::word(row0, 4 * ch);
    auto at = [&](int k) {
      return kAffine ? at0 + 4 * Rows::even_rows_words(k * kRowsPerPass) : dst + 4 * Rows::word(row0 + k * kRowsPerPass, 4 * ch);
    };
    if (n_lo == 0 && n == kStepTokens) {  // a whole step: no row masks
#pragma unroll
      for (int k = 0; k < kPasses; ++k, src += s.pass_bytes) {
        if (kPaged && k == kHalf) src = s.lane_src + ps.rows[1];
        cp_async16(at(k), src, true);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kPasses; ++k, src += s.pass_bytes) {
        if (kPaged && k == kHalf) src = s.lane_src + ps.rows[1];
        const int row = row0 + k * kRowsPerPass;
        const bool ok = row >= n_lo && row < n;  // masked rows copy nothing from a valid address
        cp_async16(at(k), ok ? src : s.rows, ok);
      }
    }
  } else if (s.copy_words == 4) {  // FBGEMM rows whose params and codes tile 16-byte chunks
    copy_rows_in_units<4, kRowWords, Rows, kStepTokens, kPaged>(codes, params, s, t0, n_lo, n, lane, units_magic, ps);
  } else if (kRowWords % 4 == 2 && s.copy_words == 2) {  // 5-bit rows at D = 64 (40 bytes): 8-byte copies
    copy_rows_in_units<2, kRowWords, Rows, kStepTokens, kPaged>(codes, params, s, t0, n_lo, n, lane, units_magic, ps);
  } else {  // other FBGEMM rows, unaligned rows
    copy_rows_in_units<1, kRowWords, Rows, kStepTokens, kPaged>(codes, params, s, t0, n_lo, n, lane, units_magic, ps);
  }
  if (kPaged && !kChannel && s.scale_lane) {  // a paged step: each half from its page
    // (a half without keys copies nothing: its table entry may name no page)
    const int chunk_words = 4 * s.param_row_bytes;  // 16 keys' parameter words
    const bool two_halves = kStepTokens > 16 && n > 16;
    copy_paged_param_words(params, s.scale_lane, two_halves, chunk_words, ps, lane);
    if (s.asymmetric) copy_paged_param_words(params + s.param_words, s.zero_lane, two_halves, chunk_words, ps, lane);
  } else if (s.scale_lane) {  // whole spans: rows past n copy their neighbours' parameters, never used
    // (paged chan-tN: the step's token group in the step's page, whose groups are whole: N divides P)
    const int64_t advance = kPaged     ? ps.params[0]
                            : kChannel ? t0 / s.channel_tokens * s.channel_bytes
                                       : (t0 - s.t_origin) * s.param_row_bytes;
    copy_param_words<kParamWords>(params, s.scale_lane + advance, s.scale_end, s.scales, s.param_words, lane,
                                  s.params_inside);
    if (s.asymmetric)
      copy_param_words<kParamWords>(params + s.param_words, s.zero_lane + advance, s.zero_end, s.zeros, s.param_words,
                                    lane, s.params_inside);
  }
}

// Scale and zero point of group `grp` of the lane's rows 16 mt + g (h = 0) and + 8 (h = 1) of every
// m-tile of a stage (0 for rows past the step, whose stage words are stale). One set of branches on
// the (warp-uniform) parameter mode per call, not per row. kGroups > 0: groups per row known at
// compile time, planar parameters fp16 (the specialised kernels; tc_group_shape).
struct RowParams {
  float scale, zero;
};
__device__ __forceinline__ float fp16_param_at(const uint32_t* words, int index) {
  return __half2float(__ushort_as_half(reinterpret_cast<const uint16_t*>(words)[index]));
}
// The value of a stored scale byte: mxfp4's e8m0 2^(e-127), nvfp4's e4m3; times `mult`.
__device__ __forceinline__ float byte_scale(uint32_t byte, ScaleDtype dt, float mult) {
  if (dt == ScaleDtype::kE8M0) return e8m0_value(static_cast<int>(byte)) * mult;
  return __half2float(__ushort_as_half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte), __NV_E4M3).x)) * mult;
}
// kByteScales: the operand may hold one-byte scales (kLut4 storages only: mxfp4, nvfp4); other
// kernels carry none of their branches (registers: the D = 256 kernels sit at the 255 limit).
template <bool kByteScales>
__device__ __forceinline__ float param_at(const uint32_t* words, int index, ScaleDtype dt, float mult) {
  if (dt == ScaleDtype::kFp32) return __uint_as_float(words[index]);
  if (!kByteScales || dt == ScaleDtype::kFp16) return fp16_param_at(words, index);
  return byte_scale(reinterpret_cast<const uint8_t*>(words)[index], dt, mult);
}
// The same from global memory (the split's first V scale).
template <bool kByteScales>
__device__ __forceinline__ float param_in_memory(const uint8_t* params, int64_t index, ScaleDtype dt, float mult) {
  if (dt == ScaleDtype::kFp32) return __ldg(reinterpret_cast<const float*>(params) + index);
  if (!kByteScales || dt == ScaleDtype::kFp16)
    return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const uint16_t*>(params) + index)));
  return byte_scale(__ldg(params + index), dt, mult);
}
template <int kMTiles, int kStepTokens, int kGroups = 0, bool kByteScales = false>
__device__ __forceinline__ void tile_params(const TcSource& s, const uint32_t* params, int g, int grp, int n,
                                            RowParams (&out)[kMTiles][2]) {
  if (s.mode == ParamMode::kTensor || s.mode == ParamMode::kNone) {  // kNone: scale-free FP8 (1, 0)
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) out[mt][0] = out[mt][1] = {s.tensor_scale, s.tensor_zero};
    return;
  }
  if (s.mode == ParamMode::kInlineRow) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t w = params[(16 * mt + g + 8 * h) * s.inline_words + grp];
        out[mt][h] = {__half2float(__ushort_as_half(static_cast<uint16_t>(w & 0xffffu))),
                      __half2float(__ushort_as_half(static_cast<uint16_t>(w >> 16)))};
      }
  } else {
    // kGroups > 0: fp16 parameters (tc_group_shape). Without stored zero points the zero is the
    // code offset times the scale (q4_0, q5_0; 0 otherwise).
    const int groups = kGroups > 0 ? kGroups : s.groups;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int index = s.param_offset + (16 * mt + g + 8 * h) * groups + grp;
        const float scale = kGroups > 0 ? fp16_param_at(params, index) : param_at<kByteScales>(params, index, s.scale_dtype, s.scale_mult);
        const float zero = !s.asymmetric ? s.code_offset * scale
                           : kGroups > 0 ? fp16_param_at(params + s.param_words, index)
                                         : param_at<false>(params + s.param_words, index, s.scale_dtype, 1.0f);
        out[mt][h] = {scale, zero};
      }
  }
  if (n < kStepTokens)  // the last step of a range: rows past it hold stale words
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool live = 16 * mt + g + 8 * h < n;
        out[mt][h] = {live ? out[mt][h].scale : 0.0f, live ? out[mt][h].zero : 0.0f};
      }
}

// Which of the lane's 4 consecutive elements d + kQPerm[k] sits at k position {2c, 2c+1, 2c+8, 2c+9}[k]
// of a QK k-slice (the order the int4 conversion produces nibbles in).
template <KvFormat F>
__device__ __forceinline__ int q_perm(int k) {
  if constexpr (F == KvFormat::kInt4 || F == KvFormat::kInt4Fbgemm || F == KvFormat::kInt5) return k == 1 ? 2 : k == 2 ? 1 : k;
  return k;
}
// Q's element d in the prologue's array: the lane's 4 operands of a k-slice in one 8-byte word, in
// the order k_fragment<F, .., kWords> produces K's elements.
template <KvFormat F, bool kWords>
__device__ __forceinline__ int q_slot(int d) {
  if constexpr (kWords) return tc_int4_k_q_slot(d);
  return (d & ~3) | q_perm<F>(d & 3);
}

inline constexpr uint32_t kFp16Magic = 0x64006400u;  // 1024.0 in both halves

// FP8 codes in bytes 0, 1 (`high`: 2, 3) of x -> their values as an fp16 pair, byte 0 (2) low.
template <KvFormat F>
__device__ __forceinline__ uint32_t fp8_pair(uint32_t x, bool high) {
  if constexpr (F == KvFormat::kFp8E5m2) {
    return __byte_perm(x, 0u, high ? 0x3424 : 0x1404);  // [0, b, 0, b'] -- e5m2 is fp16's top byte
  } else {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(high ? x >> 16 : x & 0xffffu),
                                                     __NV_E4M3);
    return static_cast<uint32_t>(h.x) | static_cast<uint32_t>(h.y) << 16;
  }
}

// Code pairs (1024 + u) -> signed codes: int8 sym codes were biased by 128 (xor), int4 sym by 8.
// kBiased: the pairs as inserted (1024 + u; a nibble in bits 4..7: 1024 + 16 u), one instruction a
// pair less; the kernel takes the bias out after the products (kTcBiasedCodes).
template <bool kBiased = false>
__device__ __forceinline__ uint32_t int8_pair(uint32_t biased, bool sym) {
  return kBiased ? biased : hsub2(biased, sym ? 0x64806480u : kFp16Magic);  // 1152 or 1024
}
// Symmetric int4 codes are two's-complement nibbles: flipping their top bit (x ^ 8 = x + 8) makes
// them unsigned; the flip rides in the LOP3 that inserts the nibbles into 1024.0 (select_xor).
template <bool kBiased = false>
__device__ __forceinline__ uint32_t nibble_pair_low(uint32_t x, bool sym) {  // nibbles in bits 0..3
  const uint32_t inserted = select_xor(x, 0x000f000fu, kFp16Magic | (sym ? 0x00080008u : 0u));
  return kBiased ? inserted : hsub2(inserted, sym ? 0x64086408u : kFp16Magic);  // 1032 or 1024
}
template <bool kBiased = false>
__device__ __forceinline__ uint32_t nibble_pair_high(uint32_t x, bool sym) {  // nibbles in bits 4..7: 1024 + 16u
  const uint32_t inserted = select_xor(x, 0x00f000f0u, kFp16Magic | (sym ? 0x00800080u : 0u));
  return kBiased ? inserted : hfma2(inserted, 0x2c002c00u, sym ? 0xd480d480u : 0xd400d400u);  // /16 - 72 or - 64
}

// V's codes a kernel may multiply biased: each O row then carries, beyond its codes' value, a
// constant of the storage times sum(P'), which the kernel subtracts at the end; int4's rows of
// nibbles in bits 4..7 also come 16 times larger. (K's codes stay exact: a biased K product, ~128
// times int4's own terms, failed the gate's LSE bound by up to 45x after fp32 accumulation:
// experiments/results/nvidia-h200/decode-biased-v-codes/.)
template <KvFormat F>
inline constexpr bool kTcBiasedCodes = F == KvFormat::kInt8 || F == KvFormat::kInt4;
// What a biased code pair carries per unit of P' in an O row (`high`: int4's nibbles in bits 4..7,
// before their 16th).
template <KvFormat F>
__device__ constexpr float tc_code_bias(bool sym, bool high) {
  if constexpr (F == KvFormat::kInt8) return sym ? 1152.0f : 1024.0f;
  const float offset = sym ? 8.0f : 0.0f;
  return high ? 1024.0f + 16.0f * offset : 1024.0f + offset;
}

// 5-bit codes: a nibble pair as nibble_pair_low / _high reads it (unsigned), each code's fifth bit
// at bit 0 (low element) and bit 16 (high element) of `fifth`.
__device__ __forceinline__ uint32_t int5_pair_low(uint32_t x, uint32_t fifth) {  // nibbles in bits 0..3
  return hsub2((x & 0x000f000fu) | (fifth & 0x00010001u) << 4 | kFp16Magic, kFp16Magic);
}
__device__ __forceinline__ uint32_t int5_pair_high(uint32_t x, uint32_t fifth) {  // nibbles in bits 4..7
  return hfma2((x & 0x00f000f0u) | (fifth & 0x00010001u) << 8 | kFp16Magic, 0x2c002c00u, 0xd400d400u);
}
// The 4 fifth bits of elements d .. d+3 (d a multiple of 4) of a 5-bit row: its words from D/8 on.
// Word loads: the k-slices j and j + 1 of a K row read the same word, which the compiler loads once.
template <typename Rows>
__device__ __forceinline__ uint32_t fifth_bits(const uint32_t* codes, int row, int d) {
  constexpr int kNibbleWords = Rows::kWords * 4 / 5;  // D/8
  return (codes[Rows::word(row, kNibbleWords + d / 32)] >> (d % 32)) & 0xfu;
}

// 4 nibbles (element order, low first) -> the 4 int8 entries of a 16-entry table they index, in one
// word: two byte permutes pick from entries 0..7 and 8..15, a third takes each byte from one of them.
__device__ __forceinline__ uint32_t lut4_lookup(uint32_t nibbles, const uint32_t (&lut)[4]) {
  const uint32_t index = nibbles & 0x7777u;
  const uint32_t lo = __byte_perm(lut[0], lut[1], index), hi = __byte_perm(lut[2], lut[3], index);
  return __byte_perm(lo, hi, 0x3210u | (nibbles & 0x8888u) >> 1);
}

// A fragment of k-slice j for keys `row` and row + 8 of a stage's K codes. kWords (int4): the
// element order of tc_int4_k_word (k-slices j and j + 1 read the same word, which the compiler loads once).
template <KvFormat F, typename Rows, bool kWords = false>
__device__ __forceinline__ void k_fragment(const uint32_t* kc, int row, int j, int c, const TcSource& s, uint32_t (&a)[4]) {
  static_assert(!kWords || F == KvFormat::kInt4, "word reads: int4 K");
  constexpr int kStride = Rows::kStride;
  const bool sym = !s.has_zero;
  if constexpr (F == KvFormat::kBf16 || F == KvFormat::kFp16) {
    const uint2 r0 = *reinterpret_cast<const uint2*>(kc + row * kStride + 8 * j + 2 * c);
    const uint2 r1 = *reinterpret_cast<const uint2*>(kc + (row + 8) * kStride + 8 * j + 2 * c);
    a[0] = r0.x, a[1] = r1.x, a[2] = r0.y, a[3] = r1.y;
  } else if constexpr (TcOperand<F>::kFp8) {
    const uint32_t w0 = kc[Rows::word(row, 4 * j + c)], w1 = kc[Rows::word(row + 8, 4 * j + c)];
    a[0] = fp8_pair<F>(w0, false), a[1] = fp8_pair<F>(w1, false);
    a[2] = fp8_pair<F>(w0, true), a[3] = fp8_pair<F>(w1, true);
  } else if constexpr (F == KvFormat::kInt8 || F == KvFormat::kLut4) {  // kLut4: the table's int8 values
    const uint32_t flip = sym ? 0x80808080u : 0u;
    uint32_t w0, w1;
    if constexpr (F == KvFormat::kLut4) {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(kc);
      w0 = lut4_lookup(h[(row * kStride + 2 * j) * 2 + c], s.lut) ^ flip;
      w1 = lut4_lookup(h[((row + 8) * kStride + 2 * j) * 2 + c], s.lut) ^ flip;
    } else {
      w0 = kc[Rows::word(row, 4 * j + c)] ^ flip, w1 = kc[Rows::word(row + 8, 4 * j + c)] ^ flip;
    }
    a[0] = int8_pair(__byte_perm(w0, 0x64646464u, 0x4140), sym);
    a[1] = int8_pair(__byte_perm(w1, 0x64646464u, 0x4140), sym);
    a[2] = int8_pair(__byte_perm(w0, 0x64646464u, 0x4342), sym);
    a[3] = int8_pair(__byte_perm(w1, 0x64646464u, 0x4342), sym);
  } else if constexpr (F == KvFormat::kInt5) {  // the nibbles as int4, each code's fifth bit beside
    const uint16_t* h = reinterpret_cast<const uint16_t*>(kc);
    const uint32_t x0 = __byte_perm(h[(row * kStride + 2 * j) * 2 + c], 0u, 0x4140);
    const uint32_t x1 = __byte_perm(h[((row + 8) * kStride + 2 * j) * 2 + c], 0u, 0x4140);
    const uint32_t f0 = fifth_bits<Rows>(kc, row, 16 * j + 4 * c), f1 = fifth_bits<Rows>(kc, row + 8, 16 * j + 4 * c);
    const uint32_t s0 = f0 | f0 << 14, s1 = f1 | f1 << 14;  // elements d, d+2 at bits 0, 16; >> 1: d+1, d+3
    a[0] = int5_pair_low(x0, s0), a[1] = int5_pair_low(x1, s1);
    a[2] = int5_pair_high(x0, s0 >> 1), a[3] = int5_pair_high(x1, s1 >> 1);
  } else if constexpr (kWords) {  // nibbles 0, 4 | 1, 5 of the word, or (a byte on) 2, 6 | 3, 7
    const int shift = 8 * (j & 1);
    const uint32_t x0 = kc[Rows::word(row, tc_int4_k_word(j, c))] >> shift;
    const uint32_t x1 = kc[Rows::word(row + 8, tc_int4_k_word(j, c))] >> shift;
    a[0] = nibble_pair_low(x0, sym), a[1] = nibble_pair_low(x1, sym);
    a[2] = nibble_pair_high(x0, sym), a[3] = nibble_pair_high(x1, sym);
  } else {  // int4: 4 nibbles (2 bytes) per key; [b0, 0, b1, 0] puts nibbles 0,2 low and 1,3 high
    const uint16_t* h = reinterpret_cast<const uint16_t*>(kc);
    const uint32_t x0 = __byte_perm(h[(row * kStride + 2 * j) * 2 + c], 0u, 0x4140);
    const uint32_t x1 = __byte_perm(h[((row + 8) * kStride + 2 * j) * 2 + c], 0u, 0x4140);
    a[0] = nibble_pair_low(x0, sym), a[1] = nibble_pair_low(x1, sym);
    a[2] = nibble_pair_high(x0, sym), a[3] = nibble_pair_high(x1, sym);
  }
}

// chan-tN K: the k-slice j fragment `a` of a key (codes as exact fp16) becomes c * s + z, rounded
// once (fma) to fp16, with the scale and zero point of each element's channel in the step's token
// group: D fp16 scales at `params`, the zero points `zero_words` words after (asymmetric only).
// The pairs follow the fragment's element order (q_perm).
template <KvFormat F>
__device__ __forceinline__ void channel_dequant(uint32_t (&a)[4], const uint32_t* params, int zero_words, int j, int c,
                                                bool asymmetric) {
  auto pairs = [](uint2 w, uint32_t& first, uint32_t& second) {  // halves d .. d+3 -> (a[0], a[2]) order
    if constexpr (F == KvFormat::kInt4 || F == KvFormat::kInt4Fbgemm)
      first = __byte_perm(w.x, w.y, 0x5410), second = __byte_perm(w.x, w.y, 0x7632);  // (d, d+2), (d+1, d+3)
    else
      first = w.x, second = w.y;
  };
  uint32_t s0, s1, z0 = 0, z1 = 0;
  pairs(*reinterpret_cast<const uint2*>(params + 8 * j + 2 * c), s0, s1);
  if (asymmetric) pairs(*reinterpret_cast<const uint2*>(params + zero_words + 8 * j + 2 * c), z0, z1);
  a[0] = hfma2(a[0], s0, z0), a[1] = hfma2(a[1], s0, z0);
  a[2] = hfma2(a[2], s1, z1), a[3] = hfma2(a[3], s1, z1);
}

// A fragments of PV m-tiles 2i (`lo`) and 2i + 1 (`hi`) for the k-step whose lane keys are
// key0 = 16 mt + 2c, key0 + 1, key0 + 8, key0 + 9. kWords (int4): the elements of tc_int4_v_word
// (pairs i and i + 1 read the same words, which the compiler loads once); 16-bit V: the same elements.
template <KvFormat F, typename Rows, bool kWords = false, bool kBiased = false>
__device__ __forceinline__ void v_fragments(const uint32_t* vc, int key0, int i, int g, const TcSource& s,
                                            uint32_t (&lo)[4], uint32_t (&hi)[4]) {
  constexpr bool k16Bit = F == KvFormat::kBf16 || F == KvFormat::kFp16;
  static_assert(!kWords || F == KvFormat::kInt4 || k16Bit, "word reads: int4 V (16-bit V: their element order)");
  static_assert(!kBiased || kTcBiasedCodes<F>, "biased codes: int8 and int4");
  const bool sym = !s.has_zero;
  const int rows[4] = {key0, key0 + 1, key0 + 8, key0 + 9};
  if constexpr (k16Bit) {  // kWords: O's elements in int4 V's order (a window's tail, decode_tc_window_tail.cuh)
    const int word = kWords ? tc_v_row_element(2 * i, g, true) / 2 : 16 * i + 2 * g;
    uint2 w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = *reinterpret_cast<const uint2*>(vc + Rows::word(rows[k], word));
    // element e of keys (A, B): (A.e, B.e) -- low halves for even e, high halves for odd e
    lo[0] = __byte_perm(w[0].x, w[1].x, 0x5410), lo[1] = __byte_perm(w[0].x, w[1].x, 0x7632);
    lo[2] = __byte_perm(w[2].x, w[3].x, 0x5410), lo[3] = __byte_perm(w[2].x, w[3].x, 0x7632);
    hi[0] = __byte_perm(w[0].y, w[1].y, 0x5410), hi[1] = __byte_perm(w[0].y, w[1].y, 0x7632);
    hi[2] = __byte_perm(w[2].y, w[3].y, 0x5410), hi[3] = __byte_perm(w[2].y, w[3].y, 0x7632);
  } else if constexpr (TcOperand<F>::kFp8) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = vc[Rows::word(rows[k], 8 * i + g)];
    const uint32_t ab01 = __byte_perm(w[0], w[1], 0x5140), ab23 = __byte_perm(w[0], w[1], 0x7362);
    const uint32_t cd01 = __byte_perm(w[2], w[3], 0x5140), cd23 = __byte_perm(w[2], w[3], 0x7362);
    lo[0] = fp8_pair<F>(ab01, false), lo[1] = fp8_pair<F>(ab01, true);
    lo[2] = fp8_pair<F>(cd01, false), lo[3] = fp8_pair<F>(cd01, true);
    hi[0] = fp8_pair<F>(ab23, false), hi[1] = fp8_pair<F>(ab23, true);
    hi[2] = fp8_pair<F>(cd23, false), hi[3] = fp8_pair<F>(cd23, true);
  } else if constexpr (F == KvFormat::kInt8 || F == KvFormat::kLut4) {  // kLut4: the table's int8 values
    const uint32_t flip = sym ? 0x80808080u : 0u;
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (F == KvFormat::kLut4)
        w[k] = lut4_lookup(reinterpret_cast<const uint16_t*>(vc)[Rows::word(rows[k], 4 * i) * 2 + g], s.lut) ^ flip;
      else
        w[k] = vc[Rows::word(rows[k], 8 * i + g)] ^ flip;
    }
    // Interleave two keys' bytes, [a.e, b.e, a.e+1, b.e+1], then each pair into 1024.0's mantissas.
    const uint32_t ab01 = __byte_perm(w[0], w[1], 0x5140), ab23 = __byte_perm(w[0], w[1], 0x7362);
    const uint32_t cd01 = __byte_perm(w[2], w[3], 0x5140), cd23 = __byte_perm(w[2], w[3], 0x7362);
    auto low = [&](uint32_t t) { return int8_pair<kBiased>(__byte_perm(t, 0x64646464u, 0x4140), sym); };
    auto high = [&](uint32_t t) { return int8_pair<kBiased>(__byte_perm(t, 0x64646464u, 0x4342), sym); };
    lo[0] = low(ab01), lo[1] = high(ab01), lo[2] = low(cd01), lo[3] = high(cd01);
    hi[0] = low(ab23), hi[1] = high(ab23), hi[2] = low(cd23), hi[3] = high(cd23);
  } else if constexpr (F == KvFormat::kInt5) {  // as int4 below, with each code's fifth bit
    const uint16_t* h = reinterpret_cast<const uint16_t*>(vc);
    uint32_t x[4], f[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = h[Rows::word(rows[k], 4 * i) * 2 + g], f[k] = fifth_bits<Rows>(vc, rows[k], 32 * i + 4 * g);
    const uint32_t a01 = __byte_perm(x[0], x[1], 0x0400), a23 = __byte_perm(x[0], x[1], 0x0501);
    const uint32_t b01 = __byte_perm(x[2], x[3], 0x0400), b23 = __byte_perm(x[2], x[3], 0x0501);
    const uint32_t fa = f[0] | f[1] << 16, fb = f[2] | f[3] << 16;  // element e of keys A, B: bits e, 16 + e
    lo[0] = int5_pair_low(a01, fa), lo[1] = int5_pair_high(a01, fa >> 1);
    lo[2] = int5_pair_low(b01, fb), lo[3] = int5_pair_high(b01, fb >> 1);
    hi[0] = int5_pair_low(a23, fa >> 2), hi[1] = int5_pair_high(a23, fa >> 3);
    hi[2] = int5_pair_low(b23, fb >> 2), hi[3] = int5_pair_high(b23, fb >> 3);
  } else {
    uint32_t x[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      x[k] = kWords ? vc[Rows::word(rows[k], tc_int4_v_word(i, g))]
                    : reinterpret_cast<const uint16_t*>(vc)[Rows::word(rows[k], 4 * i) * 2 + g];
    // [A.b0, ., B.b0, .]: nibbles 0 (low) and 1 (high) of keys A, B; [A.b1, ., B.b1, .]: nibbles 2, 3
    // (kWords, odd i: bytes 2 and 3)
    const uint32_t sel01 = kWords && (i & 1) ? 0x0602 : 0x0400, sel23 = kWords && (i & 1) ? 0x0703 : 0x0501;
    const uint32_t a01 = __byte_perm(x[0], x[1], sel01), a23 = __byte_perm(x[0], x[1], sel23);
    const uint32_t b01 = __byte_perm(x[2], x[3], sel01), b23 = __byte_perm(x[2], x[3], sel23);
    // (kBiased: O's rows g hold low nibbles, rows g + 8 the high ones, 16 times larger)
    lo[0] = nibble_pair_low<kBiased>(a01, sym), lo[1] = nibble_pair_high<kBiased>(a01, sym);
    lo[2] = nibble_pair_low<kBiased>(b01, sym), lo[3] = nibble_pair_high<kBiased>(b01, sym);
    hi[0] = nibble_pair_low<kBiased>(a23, sym), hi[1] = nibble_pair_high<kBiased>(a23, sym);
    hi[2] = nibble_pair_low<kBiased>(b23, sym), hi[3] = nibble_pair_high<kBiased>(b23, sym);
  }
}

// nvfp4 V (blocks of 16 along D): lane g's elements (dims 32i + 4g .. + 3) lie in block 2i + g / 4.
// Each of its 4 keys' e4m3 block scale multiplies that key's fp16 values in lo / hi: an e2m1 value
// (doubled: an integer <= 12) times an e4m3 scale is exact in fp16, so V's rounding stays P''s.
// Keys outside [n_lo, n) take 0: their codes are zero-filled but their stale scale bytes may be NaN.
__device__ __forceinline__ void scale_v_blocks16(uint32_t (&lo)[4], uint32_t (&hi)[4], const uint32_t* params,
                                                 const TcSource& s, int key0, int i, int g, int n_lo, int n) {
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(params) + s.param_offset + 2 * i + (g >> 2);
  const int rows[4] = {key0, key0 + 1, key0 + 8, key0 + 9};
  uint32_t b[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) b[k] = rows[k] >= n_lo && rows[k] < n ? bytes[rows[k] * s.groups] : 0u;
  // keys (key0, key0 + 1) and (+ 8, + 9): two e4m3 bytes each to their fp16 pair, as FP8 codes convert
  const uint32_t ab = fp8_pair<KvFormat::kFp8E4m3>(b[0] | b[1] << 8, false);
  const uint32_t cd = fp8_pair<KvFormat::kFp8E4m3>(b[2] | b[3] << 8, false);
  lo[0] = hmul2(lo[0], ab), lo[1] = hmul2(lo[1], ab), lo[2] = hmul2(lo[2], cd), lo[3] = hmul2(lo[3], cd);
  hi[0] = hmul2(hi[0], ab), hi[1] = hmul2(hi[1], ab), hi[2] = hmul2(hi[2], cd), hi[3] = hmul2(hi[3], cd);
}

}  // namespace kvq::detail
