// The block formats' scalar codec: llama.cpp's KV cache types (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl)
// and the FP4 microscaling formats (mxfp4, nvfp4), one block of 32 (nvfp4: 16) contiguous elements
// along D at a time, host and device. Each format follows its reference rule to the bit, roundings
// included, because "close to q4_1" is not q4_1 (docs/schemes.md has the formulas):
//   ggml: ggml/src/ggml-quants.c, quantize_row_{q8_0,q4_0,q4_1,q5_0,q5_1,mxfp4,iq4_nl}_ref and the
//         dequantize_row_* functions, as the `gguf` package's numpy port (gguf/quants.py) computes them;
//   nvfp4: NVIDIA's definition in TensorRT Model Optimizer, modelopt/torch/quantization/qtensor/
//         nvfp4_tensor.py (NVFP4QTensor.quantize / dequantize).
// fp32 IEEE arithmetic, each operation rounded on its own (the build compiles without contraction:
// -ffp-contract=off, nvcc --fmad=false; iq4_nl's sums and nvfp4's products depend on it). Every
// decode product is exact but nvfp4's, so q4_1's `q*d + m` rounds once, fused or not. Codes are
// unsigned (ggml's stored values) except q8_0's int8.
#pragma once

#include <cmath>

#include "quant/codec.hpp"

namespace kvq {

// Elements per block: kvq's scale group along D.
KVQ_HD constexpr int block_elements(CodeFormat f) { return f == CodeFormat::kNvfp4 ? 16 : 32; }

// What one block stores: `scale` is the value of the stored scale (fp16 d; mxfp4 2^(e-127); nvfp4
// the e4m3 value), `min` q4_1 / q5_1's fp16 min. The rest is what the codes are computed with, since
// ggml encodes with its fp32 values, not the stored ones: `encode_scale` is id = fl(1/d) (iq4_nl:
// fl(1/d0); 0 for a zero block), mxfp4's 2^(e-128), nvfp4's divisor fl(s_b s_t); `encode_min` the
// fp32 min. `overflow`: a stored fp16 value is not finite (device code cannot throw; hosts check it).
struct BlockParams {
  float scale = 0.0f, min = 0.0f;
  float encode_scale = 0.0f, encode_min = 0.0f;
  bool overflow = false;
};

// ---- helpers -------------------------------------------------------------------------------------
// roundf(): half away from zero (ggml's q8_0).
KVQ_HD float round_half_away(float x) {
#if defined(__CUDA_ARCH__)
  return roundf(x);
#else
  return std::round(x);
#endif
}

// C's (int) cast of a float, defined for every input as x86's cvttss2si computes it: truncation,
// and INT_MIN for NaN and values beyond int's range. ggml casts such values when 1/d overflows (a
// block whose largest |x| is below about 1e-38 times its levels: id = inf, x * id = inf or NaN);
// C leaves that undefined and CUDA's cvt saturates instead, so the codec fixes the host's answer
// (code 0 after masking) for the CPU and the GPU alike.
KVQ_HD int truncate_to_int(float x) {
  return x > -2147483904.0f && x < 2147483648.0f ? static_cast<int>(x) : -2147483647 - 1;
}

// C's (int8_t) / (uint8_t) cast of a float that ggml's rules keep within [0, 32.5] (for a finite
// id): truncation; then ggml's MIN(top, .).
KVQ_HD int truncate_at_most(float x, int top) {
  const int t = truncate_to_int(x);
  return t < top ? t : top;
}

KVQ_HD float stored_fp16(float x, bool& overflow) {
  const float r = round_to_fp16(x);
  overflow = overflow || !is_finite_float(r);
  return r;
}

// Four signed bytes in one word, the first in the low byte.
KVQ_HD constexpr uint32_t pack_bytes(int a, int b, int c, int d) {
  return static_cast<uint32_t>(a & 0xff) | static_cast<uint32_t>(b & 0xff) << 8 | static_cast<uint32_t>(c & 0xff) << 16 |
         static_cast<uint32_t>(d & 0xff) << 24;
}

// The 16 e2m1 values doubled (ggml's kvalues_mxfp4: integers, so code 8, "-0", decodes to +0).
KVQ_HD constexpr int e2m1_doubled(int code) {
  // 0, 1, 2, 3, 4, 6, 8, 12, then their negatives: packed, as iq4nl_value's table (no local array)
  constexpr uint32_t w0 = pack_bytes(0, 1, 2, 3), w1 = pack_bytes(4, 6, 8, 12);
  const uint32_t w = code & 4 ? w1 : w0;
  const int magnitude = static_cast<int>((w >> (8 * (code & 3))) & 0xff);
  return code & 8 ? -magnitude : magnitude;
}

// iq4_nl's non-linear table (ggml's kvalues_iq4nl), sorted: -127, -104, -83, -65, -49, -35, -22, -10,
// 1, 13, 25, 38, 53, 69, 89, 113. Held in four words and read by selects and a shift: a local array
// indexed by a run-time value lives in a GPU's local memory (the iq4_nl quantizer's 16-byte stack
// frame, read 8 times per element).
KVQ_HD constexpr int iq4nl_value(int index) {
  constexpr uint32_t w0 = pack_bytes(-127, -104, -83, -65), w1 = pack_bytes(-49, -35, -22, -10);
  constexpr uint32_t w2 = pack_bytes(1, 13, 25, 38), w3 = pack_bytes(53, 69, 89, 113);
  const uint32_t w = index & 8 ? (index & 4 ? w3 : w2) : (index & 4 ? w1 : w0);
  return static_cast<int8_t>(static_cast<uint8_t>(w >> (8 * (index & 3))));
}

// ggml's best_index_int8 over the iq4_nl table: x takes level i once it reaches the midpoint of
// levels i-1 and i (ties go up); x + x and the integer sums are exact, so no rounding decides it.
KVQ_HD int iq4nl_best_index(float x) {
  const float x2 = x + x;
  int index = 0;
  for (int step = 8; step > 0; step >>= 1) {
    const int j = index + step;
    index = x2 >= static_cast<float>(iq4nl_value(j - 1) + iq4nl_value(j)) ? j : index;
  }
  return index;
}

// e8m0 byte e -> 2^(e-127) (e = 0: 2^-127, an fp32 subnormal; 255, NaN in OCP MX, is never stored).
KVQ_HD float e8m0_value(int e) {
  return e == 0 ? bits_float(0x00400000u) : bits_float(static_cast<uint32_t>(e) << 23);
}

// ggml_e8m0_to_fp32_half: 2^(e-128), the scale of the doubled e2m1 values.
KVQ_HD float e8m0_half(int e) {
  return e < 2 ? bits_float(0x00200000u << e) : bits_float(static_cast<uint32_t>(e - 1) << 23);
}

// The byte of an e8m0 value (a power of two in [2^-127, 2^127]).
KVQ_HD int e8m0_byte(float value) {
  const uint32_t b = float_bits(value);
  return b == 0x00400000u ? 0 : static_cast<int>(b >> 23);
}

// ggml's mxfp4 exponent floor(log2f(amax)) - 2 + 127, for amax > 0. log2f here is the correctly
// rounded fp32 log2 (numpy's float32 log2 gives the same on every float near a power of two, where
// the rounding can lift the floor by one; tests check both): the double log2 rounded to float. ggml
// casts the result to uint8_t, undefined below 0 (amax < 2^-125); kvq clamps it to 0 there.
// A normal amax = 2^k m whose m lies 2^-12 or more below 2 has log2 = k + log2(m) at least 3.5e-4
// below k + 1, farther than the rounding can move it (half an fp32 ulp there is at most 2^-17), and
// at or above k: the floor is k, read from the bits (no double log2, ~35 fp64 instructions on a GPU).
KVQ_HD int mxfp4_exponent(float amax) {
  const uint32_t b = float_bits(amax);
  if (b >= 0x00800000u && b < 0x7f800000u && (b & 0x7fffffu) < 0x7ff800u) {
    const int e = static_cast<int>(b >> 23) - 2;  // (k + 127) - 2
    return e < 0 ? 0 : e;
  }
  const float l = static_cast<float>(log2(static_cast<double>(amax)));
  const int e = truncate_to_int(floorf(l)) - 2 + 127;  // amax = inf (a +had overflow): INT_MIN, e = 0
  return e < 0 ? 0 : e;
}

// fp32 -> e2m1 code, round to nearest even, saturating at 6 (NVIDIA's cast: the magnitude's midpoints
// 0.25 .. 5 with ties to the even code), sign bit 8 when x < 0. The magnitude is the number of
// midpoints passed, found by a three-step binary search without branches (a chain of selects diverged
// per element on the GPU). "Passed" is !(a < t): a midpoint that rounds down (to the even code below)
// is passed only above it, so its t is the next float up; NaN passes all 7.
KVQ_HD int e2m1_code(float x) {
  const float a = fabsf(x);
  constexpr float t1 = 0x1.000002p-2f, t2 = 0.75f, t3 = 0x1.400002p0f, t4 = 1.75f, t5 = 0x1.400002p1f, t6 = 3.5f,
                  t7 = 0x1.400002p2f;  // 0.25+, 0.75, 1.25+, 1.75, 2.5+, 3.5, 5+
  const bool b2 = !(a < t4);
  const bool b1 = !(a < (b2 ? t6 : t2));
  const bool b0 = !(a < (b2 ? (b1 ? t7 : t5) : (b1 ? t3 : t1)));
  const int m = (b2 ? 4 : 0) | (b1 ? 2 : 0) | (b0 ? 1 : 0);
  return m | (x < 0.0f ? 8 : 0);
}

// ---- per-format parameters ---------------------------------------------------------------------
// ggml's q4_0 / q5_0 / iq4_nl reference: the signed value with the largest magnitude (the first one).
KVQ_HD float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j)
    if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
  return max;
}

// q8_0: d = amax / 127, id = 1/d.
KVQ_HD BlockParams q8_0_params(const float* x) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(x[j]));
  BlockParams p;
  const float d = ieee_div(amax, 127.0f);
  p.encode_scale = d != 0.0f ? ieee_div(1.0f, d) : 0.0f;
  p.scale = stored_fp16(d, p.overflow);
  return p;
}

// q4_0 / q5_0: d = max / -(2^(b-1)) (max signed, so d < 0 when the largest magnitude is positive).
KVQ_HD BlockParams q_0_params(const float* x, float levels_half) {
  BlockParams p;
  const float d = ieee_div(signed_absmax(x, 32), -levels_half);
  p.encode_scale = d != 0.0f ? ieee_div(1.0f, d) : 0.0f;
  p.scale = stored_fp16(d, p.overflow);
  return p;
}

// q4_1 / q5_1: d = (max - min) / (2^b - 1) and the min, both stored as fp16; codes from the fp32 ones.
KVQ_HD BlockParams q_1_params(const float* x, float levels) {
  float min = 3.40282347e38f, max = -3.40282347e38f;
  for (int j = 0; j < 32; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  BlockParams p;
  const float d = ieee_div(max - min, levels);
  p.encode_scale = d != 0.0f ? ieee_div(1.0f, d) : 0.0f;
  p.encode_min = min;
  p.scale = stored_fp16(d, p.overflow);
  p.min = stored_fp16(min, p.overflow);
  return p;
}

// iq4_nl (quantize_row_iq4_nl_ref: no imatrix, ntry = -1, so no scale search): codes from
// d0 = max / -127, then the stored scale is the least-squares refit sum(w q x) / sum(w q^2) with
// weights w = x^2, summed in element order. A block with amax < 1e-15 stores 0.
KVQ_HD BlockParams iq4_nl_params(const float* x) {
  BlockParams p;
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(x[j]));
  if (amax < 1e-15f) return p;  // scale 0, encode_scale 0: every code 0
  const float d0 = ieee_div(signed_absmax(x, 32), -127.0f);
  p.encode_scale = ieee_div(1.0f, d0);
  float sumqx = 0.0f, sumq2 = 0.0f;
  KVQ_UNROLL
  for (int j = 0; j < 32; ++j) {
    const float q = static_cast<float>(iq4nl_value(iq4nl_best_index(p.encode_scale * x[j])));
    const float w = x[j] * x[j];
    sumqx += w * q * x[j];
    sumq2 += w * q * q;
  }
  p.scale = stored_fp16(sumq2 > 0.0f ? ieee_div(sumqx, sumq2) : 0.0f, p.overflow);
  return p;
}

// mxfp4: e = floor(log2 amax) - 2 + 127 (amax's exponent less 2, since e2m1 reaches 6 < 2^3), and the
// codes are ggml's nearest doubled value times 2^(e-128) (first of equal rounded errors).
// From the block's amax = fmaxf over |x| (NaN elements ignored), as mxfp4_params() takes it.
KVQ_HD BlockParams mxfp4_params_for_amax(float amax) {
  const int e = amax > 0.0f ? mxfp4_exponent(amax) : 0;
  BlockParams p;
  p.scale = e8m0_value(e);
  p.encode_scale = e8m0_half(e);
  return p;
}

KVQ_HD BlockParams mxfp4_params(const float* x) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(x[j]));
  return mxfp4_params_for_amax(amax);
}

// nvfp4, given the tensor scale s_t = amax_tensor / (6 * 448): s_b = e4m3(max(a / (6 s_t), 2^-9)),
// a pre-scale of 0 becoming 1 (modelopt's rule); codes e2m1(x / (s_b s_t)). s_t = 0 (an all-zero
// tensor): s_b = 1 and every code 0 (modelopt would divide 0 by 0; kvq defines it). `amax`: the
// block's fmaxf over |x| (NaN elements ignored), as nvfp4_params() takes it.
KVQ_HD BlockParams nvfp4_params_for_amax(float amax, float tensor_scale) {
  float pre = tensor_scale == 0.0f ? 1.0f : ieee_div(amax, 6.0f * tensor_scale);
  if (pre == 0.0f) pre = 1.0f;
  pre = fmaxf(pre, 0x1p-9f);  // e4m3's smallest subnormal: a tiny block keeps a nonzero scale
  BlockParams p;
  p.scale = fp8_bits_to_fp32(fp32_to_fp8_bits(pre, fp8_e4m3()), fp8_e4m3());
  p.encode_scale = p.scale * tensor_scale;  // the divisor S = s_b * s_t
  return p;
}

KVQ_HD BlockParams nvfp4_params(const float* x, float tensor_scale) {
  float amax = 0.0f;
  for (int j = 0; j < 16; ++j) amax = fmaxf(amax, fabsf(x[j]));
  return nvfp4_params_for_amax(amax, tensor_scale);
}

// nvfp4's per-tensor scale s_t = amax / (6 * 448) (modelopt's get_weights_scaling_factor_2), over
// every quantized element of one layer's K (or V): kvq's per-tensor granularity.
KVQ_HD float nvfp4_tensor_scale(float amax) { return ieee_div(amax, 2688.0f); }

// ---- dispatch ------------------------------------------------------------------------------------
// Parameters of the block x[0 .. block_elements(f)). tensor_scale: nvfp4's s_t, ignored otherwise.
KVQ_HD BlockParams block_params(CodeFormat f, const float* x, float tensor_scale) {
  switch (f) {
    case CodeFormat::kQ8_0: return q8_0_params(x);
    case CodeFormat::kQ4_0: return q_0_params(x, 8.0f);
    case CodeFormat::kQ5_0: return q_0_params(x, 16.0f);
    case CodeFormat::kQ4_1: return q_1_params(x, 15.0f);
    case CodeFormat::kQ5_1: return q_1_params(x, 31.0f);
    case CodeFormat::kIq4Nl: return iq4_nl_params(x);
    case CodeFormat::kMxfp4: return mxfp4_params(x);
    case CodeFormat::kNvfp4: return nvfp4_params(x, tensor_scale);
    default: return BlockParams{};
  }
}

// mxfp4's code: ggml's search of the 16 doubled e2m1 values v, the first of the smallest
// fl(|v id - x|), found from the magnitude's neighbours instead of 16 trials. v id is exact (or inf:
// id is a power of two), so the rounded errors of the magnitudes 0, 1, 2, 3, 4, 6, 8, 12 are unimodal
// like the exact ones, and the exact nearest magnitude (counted against the exact midpoints) has the
// smallest: from it, walk down to the first magnitude with that error. A negative x has the same
// errors (fl(|-v id - x|) = fl(|v id - |x||)) at the later, negative codes, so 0 keeps its ties.
// Below 16 id (every block's elements: id is amax's power of two over 8) with 16 id finite, both
// errors beside the nearest magnitude are exact (multiples of ulp(a) below a), so the walk has
// nothing to do and is skipped: the quantizer's codes take 7 compares each.
// A block's grid (mxfp4_grid) is computed once and its elements coded against it (mxfp4_code).
struct Mxfp4Grid {
  float id;      // the doubled values' scale 2^(e-128)
  float mid[7];  // the exact midpoints of neighbouring magnitudes, times id
  float top;     // 16 id, below which the walk has nothing to do; 0 (always walk) where 16 id overflows
};

KVQ_HD Mxfp4Grid mxfp4_grid(float id) {
  Mxfp4Grid g;
  g.id = id;
  KVQ_UNROLL
  for (int m = 0; m < 7; ++m) g.mid[m] = 0.5f * static_cast<float>(e2m1_doubled(m) + e2m1_doubled(m + 1)) * id;
  g.top = is_finite_float(16.0f * id) ? 16.0f * id : 0.0f;
  return g;
}

KVQ_HD int mxfp4_code(float x, const Mxfp4Grid& g) {
  const float a = fabsf(x);
  if (!is_finite_float(x)) return 0;  // Inf / NaN (quantizers reject them first): the search keeps code 0
  // the number of midpoints below a, by a three-step binary search (the midpoints increase)
  const bool b2 = a > g.mid[3];
  const bool b1 = a > (b2 ? g.mid[5] : g.mid[1]);
  const bool b0 = a > (b2 ? (b1 ? g.mid[6] : g.mid[4]) : (b1 ? g.mid[2] : g.mid[0]));
  int k = (b2 ? 4 : 0) | (b1 ? 2 : 0) | (b0 ? 1 : 0);
  if (!(a < g.top)) {
    const auto err = [&](int j) { return fabsf(static_cast<float>(e2m1_doubled(j)) * g.id - a); };
    while (k > 0 && err(k - 1) <= err(k)) --k;
  }
  return k > 0 && x < 0.0f ? k + 8 : k;
}

KVQ_HD int mxfp4_encode(float x, float id) { return mxfp4_code(x, mxfp4_grid(id)); }

// nvfp4's code for a divisor id != 0: block_encode's without its zero test (a quantizer tests a
// block's divisor once).
KVQ_HD int nvfp4_code(float x, float id) { return e2m1_code(ieee_div(x, id)); }

// One element's code: q8_0 the int8 value (-127..127), otherwise the unsigned value ggml stores.
KVQ_HD int block_encode(CodeFormat f, float x, const BlockParams& p) {
  const float id = p.encode_scale;
  switch (f) {
    case CodeFormat::kQ8_0: return truncate_to_int(round_half_away(x * id));
    case CodeFormat::kQ4_0: return truncate_at_most(x * id + 8.5f, 15);
    case CodeFormat::kQ5_0: return truncate_at_most(x * id + 16.5f, 31);
    case CodeFormat::kQ4_1: return truncate_at_most((x - p.encode_min) * id + 0.5f, 15);
    case CodeFormat::kQ5_1: return truncate_at_most((x - p.encode_min) * id + 0.5f, 31);  // ggml: no MIN, never > 31
    case CodeFormat::kIq4Nl: return id == 0.0f ? 0 : iq4nl_best_index(id * x);
    case CodeFormat::kMxfp4: return mxfp4_encode(x, id);
    case CodeFormat::kNvfp4: return id == 0.0f ? 0 : nvfp4_code(x, id);
    default: return 0;
  }
}

// The dequantized value (ggml's dequantize_row_*; nvfp4 e2m1 * (s_b * s_t)). `scale` and `min` are
// the stored values (BlockParams::scale / min).
KVQ_HD float block_decode(CodeFormat f, int code, float scale, float min, float tensor_scale) {
  switch (f) {
    case CodeFormat::kQ8_0: return static_cast<float>(code) * scale;
    case CodeFormat::kQ4_0: return static_cast<float>(code - 8) * scale;
    case CodeFormat::kQ5_0: return static_cast<float>(code - 16) * scale;
    case CodeFormat::kQ4_1:
    case CodeFormat::kQ5_1: return static_cast<float>(code) * scale + min;  // the product is exact
    case CodeFormat::kIq4Nl: return scale * static_cast<float>(iq4nl_value(code));
    case CodeFormat::kMxfp4: return static_cast<float>(e2m1_doubled(code)) * (scale * 0.5f);  // exact
    case CodeFormat::kNvfp4: return static_cast<float>(e2m1_doubled(code)) * 0.5f * (scale * tensor_scale);
    default: return 0.0f;
  }
}

}  // namespace kvq
