// The scalar codec of DESIGN.md: the single source of truth for every quantizer, host and device.
// fp32 IEEE arithmetic throughout; the fused operations are the asymmetric decode's fma and
// IntegerCoder's; IntegerCoder and Fp8Coder give the division's codes where they say so.
// Every other implementation (CPU tensors, GPU kernels, layout conversions) is tested against
// these functions byte for byte.
#pragma once

#include <cmath>

#include "quant/float_formats.hpp"
#include "quant/scheme.hpp"

namespace kvq {

// Stored parameters of one group. `zero` is 0 for symmetric schemes. `overflow` is set when the
// scale or zero point does not fit the scale dtype (device code cannot throw; hosts check it).
struct GroupParams {
  float scale = 0.0f;
  float zero = 0.0f;
  bool overflow = false;
  float inv_scale = INFINITY;  // fl(1 / scale): lets encode() skip most divisions; INFINITY: always divide
};

// Statistics of one group that the parameters derive from. min and max are kept as order keys:
// the float's bits mapped to a signed integer that sorts like the float, with -0 just below +0.
// Integer min/max are exact in any order and cheap on every processor, and the signed zero they
// pick (lo is -0, hi is +0 whenever both occur) does not depend on the order a reduction visits
// the elements in. Quantizers reject non-finite input before these matter.
struct GroupStats {
  int32_t lo_key = 0x7f800000;                      // key of +inf: nothing seen yet
  int32_t hi_key = static_cast<int32_t>(0x807fffffu);  // key of -inf
  float amax = 0.0f;                                // max |x|; NaN if any x is NaN

  KVQ_HD static int32_t key_of(float x) {
    const int32_t b = static_cast<int32_t>(float_bits(x));
    return b ^ ((b >> 31) & 0x7fffffff);  // negatives: flip the magnitude bits
  }
  KVQ_HD static float value_of(int32_t k) { return bits_float(static_cast<uint32_t>(k ^ ((k >> 31) & 0x7fffffff))); }
  KVQ_HD float lo() const { return value_of(lo_key); }  // min x
  KVQ_HD float hi() const { return value_of(hi_key); }  // max x
  // |x| compared as magnitude bits: the same order as the floats, and NaN sorts above +inf, so a
  // non-finite element always shows in the stats (all_finite()) without a test per element.
  KVQ_HD static float max_magnitude(float a, float b) {
    const uint32_t ma = float_bits(a) & 0x7fffffffu, mb = float_bits(b) & 0x7fffffffu;
    return bits_float(ma > mb ? ma : mb);
  }
  KVQ_HD void add(float x) {
    const int32_t k = key_of(x);
    lo_key = k < lo_key ? k : lo_key;
    hi_key = k > hi_key ? k : hi_key;
    amax = max_magnitude(amax, x);
  }
  KVQ_HD void merge(const GroupStats& o) {
    lo_key = o.lo_key < lo_key ? o.lo_key : lo_key;
    hi_key = o.hi_key > hi_key ? o.hi_key : hi_key;
    amax = max_magnitude(amax, o.amax);
  }
  // True when no element was added (a group whose tokens are all in a +wW window).
  KVQ_HD bool empty() const { return lo_key > hi_key; }
  // False when an element was inf or NaN (symmetric schemes read amax, asymmetric lo and hi).
  KVQ_HD bool all_finite(bool asymmetric) const {
    return asymmetric ? lo_key > static_cast<int32_t>(0x807fffffu) && hi_key < 0x7f800000
                      : (float_bits(amax) & 0x7fffffffu) < 0x7f800000u;
  }
};

// rd(): round to the scale dtype.
KVQ_HD float round_to_scale_dtype(float x, ScaleDtype dt) {
  return dt == ScaleDtype::kFp16 ? round_to_fp16(x) : x;
}

// minpos: smallest positive normal of the scale dtype.
KVQ_HD float min_positive_scale(ScaleDtype dt) {
  return dt == ScaleDtype::kFp16 ? kFp16MinNormal : 1.17549435e-38f;  // 2^-14 / 2^-126
}

KVQ_HD bool is_finite_float(float x) { return (float_bits(x) & 0x7f800000u) != 0x7f800000u; }

// x / y as exactly one IEEE round-to-nearest division, also under nvcc's fast options.
KVQ_HD float ieee_div(float x, float y) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(x, y);
#else
  return x / y;
#endif
}

// nearbyint(): round half to even.
KVQ_HD float round_half_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}

// nearbyint(fl(v / s)) without the division in almost every case. y = fl(v * fl(1/s)) is within
// |y| 2^-22 of fl(v / s) (three roundings of at most 2^-24 each), so when y is farther than
// |y| 2^-21 from every half-integer both round to the same integer; otherwise (ties, overflow,
// NaN: the comparison fails) the IEEE division decides. y - nearbyint(y) is exact (Sterbenz).
// round_by_reciprocal: r = nearbyint(y), and whether it is nearbyint(fl(v / s)) for sure.
KVQ_HD bool round_by_reciprocal(float v, float inv_s, float& r) {
  const float y = v * inv_s;
  r = round_half_even(y);
  return fabsf(fabsf(y - r) - 0.5f) > fabsf(y) * 0x1p-21f;
}

KVQ_HD float divide_and_round(float v, float s, float inv_s) {
  float r;
  if (round_by_reciprocal(v, inv_s, r)) return r;
  return round_half_even(ieee_div(v, s));
}

KVQ_HD float fused_multiply_add(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// fma(a, b, c) clamped to [0, 1], NaN to 0 (one FFMA.SAT on the device)
KVQ_HD float saturated_multiply_add(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __saturatef(__fmaf_rn(a, b, c));
#else
  return fminf(fmaxf(std::fma(a, b, c), 0.0f), 1.0f);
#endif
}

KVQ_HD int clamp_code(float r, int lo, int hi) {
  // r is integral (or +-inf); clamp as float, branch-free, so that huge values cannot overflow
  // the int conversion.
  return static_cast<int>(fminf(fmaxf(r, static_cast<float>(lo)), static_cast<float>(hi)));
}

// ---- symmetric -------------------------------------------------------------------------------
KVQ_HD GroupParams symmetric_params(float amax, const Scheme& s) {
  GroupParams p;
  if (amax == 0.0f) return p;
  const float rounded = round_to_scale_dtype(ieee_div(amax, static_cast<float>(s.qmax())), s.scale_dtype);
  const float minpos = min_positive_scale(s.scale_dtype);
  p.scale = rounded > minpos ? rounded : minpos;
  p.inv_scale = ieee_div(1.0f, p.scale);
  p.overflow = !is_finite_float(p.scale);
  return p;
}

// A zero scale gives code 0 (the quotient is then discarded). inv_scale = fl(1 / scale).
KVQ_HD int encode_symmetric(float x, float scale, float inv_scale, int qmax) {
  const int q = clamp_code(divide_and_round(x, scale, inv_scale), -qmax, qmax);
  return scale == 0.0f ? 0 : q;
}

// Decoding takes the code as a float (exact: |q| < 2^24) so that a kernel may convert codes its own
// fast way; the arithmetic stays here.
KVQ_HD float decode_symmetric(float q, float scale) { return q * scale; }
KVQ_HD float decode_symmetric(int q, float scale) { return decode_symmetric(static_cast<float>(q), scale); }

// ---- asymmetric ------------------------------------------------------------------------------
KVQ_HD GroupParams asymmetric_params(float lo, float hi, const Scheme& s) {
  GroupParams p;
  p.zero = round_to_scale_dtype(lo, s.scale_dtype);
  if (hi != lo) {
    const float range = ieee_div(hi - lo, static_cast<float>(s.levels()));
    const float rounded = round_to_scale_dtype(range, s.scale_dtype);
    const float minpos = min_positive_scale(s.scale_dtype);
    p.scale = rounded > minpos ? rounded : minpos;
    p.inv_scale = ieee_div(1.0f, p.scale);
  }
  p.overflow = !is_finite_float(p.scale) || !is_finite_float(p.zero);
  return p;
}

KVQ_HD int encode_asymmetric(float x, float scale, float inv_scale, float zero, int levels) {
  const int q = clamp_code(divide_and_round(x - zero, scale, inv_scale), 0, levels);
  return scale == 0.0f ? 0 : q;
}

KVQ_HD float decode_asymmetric(float q, float scale, float zero) { return fused_multiply_add(q, scale, zero); }
KVQ_HD float decode_asymmetric(int q, float scale, float zero) {
  return decode_asymmetric(static_cast<float>(q), scale, zero);
}

// ---- FP8 (symmetric; DESIGN.md) ------------------------------------------------------------------
KVQ_HD Fp8Format fp8_format(CodeFormat f) { return f == CodeFormat::kFp8E5M2 ? fp8_e5m2() : fp8_e4m3(); }

KVQ_HD GroupParams fp8_params(float amax, const Scheme& s) {
  GroupParams p;
  if (amax == 0.0f) return p;
  const float rounded = round_to_scale_dtype(ieee_div(amax, fp8_format(s.format).max_value), s.scale_dtype);
  const float minpos = min_positive_scale(s.scale_dtype);
  p.scale = rounded > minpos ? rounded : minpos;
  p.inv_scale = ieee_div(1.0f, p.scale);
  p.overflow = !is_finite_float(p.scale);
  return p;
}

// The code byte: +0 for a zero scale, else fp8(x / s) with one IEEE division (the definition;
// Fp8Coder below gets the same bytes by two multiplies wherever it says so).
KVQ_HD int encode_fp8(float x, float scale, CodeFormat f) {
  return scale == 0.0f ? 0 : fp32_to_fp8_bits(ieee_div(x, scale), fp8_format(f));
}

// The code as its byte (0..255); one fp32 multiply.
KVQ_HD float decode_fp8(int code, float scale, CodeFormat f) {
  return fp8_bits_to_fp32(static_cast<uint8_t>(code & 0xff), fp8_format(f)) * scale;
}

// The parameters of a scale-free scheme: x / 1 and c * 1 are exact, so fp8(x) and f32(c) result.
KVQ_HD GroupParams unit_params() {
  GroupParams p;
  p.scale = 1.0f;
  p.inv_scale = 1.0f;
  return p;
}

// A per-tensor scale given by the caller (a calibrated one, as engines keep for an FP8 cache that
// grows token by token): stored rounded to the scale dtype like a computed one, codes saturate.
// check_given_tensor_scale (quant/quantize.hpp) has refused a scale that cannot be stored.
KVQ_HD GroupParams given_scale_params(float scale, const Scheme& s) {
  GroupParams p;
  p.scale = round_to_scale_dtype(scale, s.scale_dtype);
  p.inv_scale = ieee_div(1.0f, p.scale);
  return p;
}

// ---- scheme-level dispatch -------------------------------------------------------------------
// Parameters as stored (e.g. read back from a scale array), ready for encode().
KVQ_HD GroupParams stored_params(float scale, float zero) {
  GroupParams p;
  p.scale = scale;
  p.zero = zero;
  p.inv_scale = ieee_div(1.0f, scale);
  return p;
}

// The integer schemes' parameters of a group that holds elements. Kernels that take only integer
// schemes call it (with s.format fixed to kInt, so encode() folds too): group_params' empty-group
// and FP8 tests inside their loops cost a quarter of their speed (37c4ce6, quantize-groupthread).
KVQ_HD GroupParams integer_group_params(const GroupStats& st, const Scheme& s) {
  return s.asymmetric ? asymmetric_params(st.lo(), st.hi(), s) : symmetric_params(st.amax, s);
}

// An empty group (all of its tokens in a +wW window) stores scale 0 and zero point 0.
KVQ_HD GroupParams group_params(const GroupStats& st, const Scheme& s) {
  if (st.empty()) return GroupParams{};
  if (s.fp8()) return fp8_params(st.amax, s);
  return integer_group_params(st, s);
}

// FP8 codes are the byte 0..255; integer codes as in the encode_* functions.
KVQ_HD int encode(float x, const GroupParams& p, const Scheme& s) {
  if (s.fp8()) return encode_fp8(x, p.scale, s.format);
  return s.asymmetric ? encode_asymmetric(x, p.scale, p.inv_scale, p.zero, s.levels())
                      : encode_symmetric(x, p.scale, p.inv_scale, s.qmax());
}

// An integer scheme's code range applied to a rounded quotient r.
KVQ_HD int clamp_integer_code(float r, const Scheme& s) {
  return s.asymmetric ? clamp_code(r, 0, s.levels()) : clamp_code(r, -s.qmax(), s.qmax());
}

// encode() of an integer scheme by the IEEE division alone, the same codes (divide_and_round gives the
// division's rounding whenever it uses the reciprocal): a quantizer's fallback for a run of elements
// that IntegerCoder was not sure of, without repeating its tests.
KVQ_HD int encode_integer_exact(float x, const GroupParams& p, const Scheme& s) {
  const int q = clamp_integer_code(round_half_even(ieee_div(s.asymmetric ? x - p.zero : x, p.scale)), s);
  return p.scale == 0.0f ? 0 : q;
}

// ---- integer codes without a division (the quantize kernels' common path) ----------------------
// m = fl(v * fl(1/s) + 1.5 * 2^23) rounds the exact product P = v * fl(1/s) half to even (the ulp is
// 1 in [2^23, 2^24)), so m's low bits hold an integer n in two's complement: no division, no
// float-to-int conversion (a quarter-rate instruction on the GPU). P is within |v/s| 2^-23 of
// fl(v / s); where |v/s| <= 256 the two round to the same integer whenever P is farther than 2^-15
// from a half-step, which d = fl(P - n) tells within 2^-25. biased_code() takes that path: an element
// with 0.5 - |d| <= 2^-13, or NaN, is "not sure".
// exact_code() decides every element (a few more instructions): P is within |v/s| 2^-24 of v / s, so
// n is v / s rounded within one step; the residual e = v - n s is exact (fma; at most 24 significant
// bits for |v/s| < 2^22, s in [2^-100, 2^100]), and past = |e| - s/2 tells exactly which side of n's
// half-step v / s lies on: beyond it, n moves one step toward v / s; on it (past = 0) the division is
// exact and rounds half to even. fl(v / s) also rounds onto a half-step t from a v / s off it by up to
// ulp(t) / 2, but only for a scale of more than 15 significant bits (else v - t s, a multiple of
// ulp(v) or of half s's lowest bit, is 0 or at least s ulp(t)): never for fp16 scales; a longer scale
// leaves |past| < s 2^-15 not sure. bf16 input puts many values exactly on half-steps (wherever s has few
// bits), so kernels code a chunk by exact_code() when biased_code() was not sure of it, and what is
// still not sure by the division (encode_integer_exact).
inline constexpr float kRoundingBias = 12582912.0f;  // 1.5 * 2^23

struct IntegerCoder {
  float scale = 0.0f;
  float inv_scale = 0.0f;       // fl(1 / scale); 0 for a zero scale, whose codes are all 0
  float half_scale = INFINITY;  // scale / 2; infinite for a zero scale (no code leaves 0)
  float near = 0.0f;            // exact_code(): |past| below it is not sure (0 for scales of <= 15 bits)
  float zero = 0.0f;            // asymmetric: x - zero first, one fp32 subtraction as in encode()
  float lo = kRoundingBias, hi = kRoundingBias;  // the code range, biased
  bool clamp = false;  // a code of the group may leave the range (see integer_coder)
  bool exact = true;   // exact_code(): the scale is 0 or in [2^-100, 2^100], where the residual is exact
  // The scale has at most 4 significant bits: bf16 values then fall on its half-steps often (on a
  // scale of k bits only where the odd multiple of it has <= 8 bits), and kernels code by exact_code.
  bool short_scale = false;

  // x's code biased by kRoundingBias (its bits' low byte or nibble is the stored code); `sure`
  // turns false unless the code is encode()'s.
  template <bool kAsym, bool kClamp>
  KVQ_HD float biased_code(float x, bool& sure) const {
    const float v = kAsym ? x - zero : x;
    float m = fused_multiply_add(v, inv_scale, kRoundingBias);
    const float d = fused_multiply_add(v, inv_scale, -(m - kRoundingBias));
    const bool apart = 0.5f - fabsf(d) > 0x1p-13f;
    if (!kClamp) {
      sure = sure && apart;
      return m;
    }
    // nearbyint(P) past the range means fl(v / s) rounds to its end or past it too (P and fl(v/s)
    // are far closer than 1 wherever |v/s| < 2^22, and beyond that both are past any code): sure
    sure = sure && (apart || m < lo || m > hi);
    return fminf(fmaxf(m, lo), hi);
  }

  // biased_code()'s code by the residual, branch-free. `closest` takes the least |past| seen: the
  // code is encode()'s when exact and !(closest < near) (sure()).
  template <bool kAsym, bool kClamp>
  KVQ_HD float exact_code(float x, float& closest) const {
    const float v = kAsym ? x - zero : x;
    const float m = fused_multiply_add(v, inv_scale, kRoundingBias);
    const float e = fused_multiply_add(-(m - kRoundingBias), scale, v);
    const float past = fabsf(e) - half_scale;  // exact where it is >= -s/4 (Sterbenz)
    closest = fminf(closest, fabsf(past));
    // The step toward v / s, h = 0 (past < 0), 1 (past > 0) or 1/2 (on the half-step): m + sign(e) h
    // then rounds, in fp32's unit steps at m, to n, to n -+ 1, or from the tie to the even of the two
    // (the bias is even), as the division's code does. Where exact, a nonzero past is a multiple of
    // at least 2^-124 (s >= 2^-100), so 2^127 past saturates; NaN gives 0. No branch: warps diverged.
    const float h = saturated_multiply_add(past, 0x1p127f, 0.5f);
    const float code = fused_multiply_add(bits_float((float_bits(e) & 0x80000000u) | 0x3f800000u), h, m);
    // beyond |v/s| = 2^22 n may be off by more than a step, but every such code is past the range
    // and clamps to its end, as the division's does
    return kClamp ? fminf(fmaxf(code, lo), hi) : code;
  }
  KVQ_HD bool sure(float closest) const { return exact && !(closest < near); }
};

// The code a biased_code() holds (|code| < 2^22).
KVQ_HD int unbiased_code(float m) {
  return static_cast<int>(float_bits(m)) - static_cast<int>(float_bits(kRoundingBias));
}

// The coder of a group with parameters p whose values lie in [lo, hi] (symmetric: [-amax, amax]
// will do). Codes are monotone in x, so when the two bounds' codes need no clamp no element's does;
// the coder then skips the clamp, and |v/s| < 256 holds for the rounding test. The bounds are coded
// by the coder itself (no division): a sure code inside the range is exact, since it implies
// |v/s| < 256; one past the range or not sure (near a tie, NaN) sets clamp, which is always safe.
KVQ_HD IntegerCoder integer_coder(const GroupParams& p, const Scheme& s, float lo, float hi) {
  IntegerCoder c;
  c.lo = kRoundingBias + (s.asymmetric ? 0.0f : static_cast<float>(-s.qmax()));
  c.hi = kRoundingBias + static_cast<float>(s.asymmetric ? s.levels() : s.qmax());
  if (p.scale == 0.0f) return c;
  c.scale = p.scale, c.inv_scale = p.inv_scale, c.half_scale = 0.5f * p.scale, c.zero = p.zero;
  c.exact = p.scale >= 0x1p-100f && p.scale <= 0x1p100f;
  c.near = (float_bits(p.scale) & 0x1ffu) == 0 ? 0.0f : p.scale * 0x1p-15f;
  c.short_scale = (float_bits(p.scale) & 0xfffffu) == 0;
  bool sure = true;
  const float a = s.asymmetric ? c.biased_code<true, false>(lo, sure) : c.biased_code<false, false>(lo, sure);
  const float b = s.asymmetric ? c.biased_code<true, false>(hi, sure) : c.biased_code<false, false>(hi, sure);
  c.clamp = !(sure && a >= c.lo && b <= c.hi);
  return c;
}

// ---- FP8 codes by two multiplies (the quantize kernels' FP8 path) -------------------------------
// encode_fp8 is fp8(fl(x / s)). With r = fl(1/s) and r_lo, r_hi = fl(r (1 -+ 2^-21)), the products
// fl(x r_lo) and fl(x r_hi) are x/s times factors within 3 * 2^-24 of 1 -+ 2^-21, and fl(x / s) is x/s
// within 2^-24, so fl(x / s) lies between the two products while r, r_lo, r_hi and the products are
// fp32 normals (a product below that is under 2^-125, where every fp8 code is a signed zero anyway).
// fp8() is monotone: where the two products have one code, fl(x / s) has it too. One conversion of
// the pair (cvt ...x2 on the GPU) and a compare replace the division; the codes differ only where x/s
// lies within about 2^-21 of a rounding boundary. A non-finite product (non-finite x, or a given
// scale's product past fp32) is not sure either; the caller then codes by encode_fp8.
struct Fp8Coder {
  float r_lo = 0.0f, r_hi = 0.0f;  // 0 for a zero scale, whose codes are all 0 (`keep` clears them)
  uint32_t keep = 0xffffffffu;
  bool usable = false;  // the bracket holds: r_lo and r_hi fp32 normals, or a zero scale

  // Eight elements' codes as two words, element 0 in the low byte of words[0]; `sure` turns false
  // unless they are encode_fp8's.
  KVQ_HD void codes8(const float (&x)[8], Fp8Format f, uint32_t (&words)[2], bool& sure) const {
    float lo[8], hi[8];
    bool finite = true;  // |x r_lo| <= |x r_hi|: the high product alone tells a non-finite one
    for (int e = 0; e < 8; ++e) {
      lo[e] = x[e] * r_lo, hi[e] = x[e] * r_hi;
      finite = finite & (fabsf(hi[e]) < INFINITY);  // `&`, not `&&`: no branches
    }
    const uint32_t lo0 = fp8_bits4(lo[0], lo[1], lo[2], lo[3], f), lo1 = fp8_bits4(lo[4], lo[5], lo[6], lo[7], f);
    const uint32_t hi0 = fp8_bits4(hi[0], hi[1], hi[2], hi[3], f), hi1 = fp8_bits4(hi[4], hi[5], hi[6], hi[7], f);
    sure = sure & usable & finite & (((lo0 ^ hi0) | (lo1 ^ hi1)) == 0);
    words[0] = lo0 & keep, words[1] = lo1 & keep;
  }

  // fp8() of four finite values, the first in the low byte: on the GPU two cvt ...x2 packed by one
  // mov (the cuda_fp8.h intrinsic returns 16 bits, which costs a mask each to widen).
  static KVQ_HD uint32_t fp8_bits4(float a, float b, float c, float d, Fp8Format f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint32_t w;
    if (f.mantissa_bits == 3)  // cvt's first source goes to the high byte
      asm("{.reg .b16 l, h;\n\tcvt.rn.satfinite.e4m3x2.f32 l, %2, %1;\n\tcvt.rn.satfinite.e4m3x2.f32 h, %4, %3;\n\t"
          "mov.b32 %0, {l, h};}"
          : "=r"(w) : "f"(a), "f"(b), "f"(c), "f"(d));
    else
      asm("{.reg .b16 l, h;\n\tcvt.rn.satfinite.e5m2x2.f32 l, %2, %1;\n\tcvt.rn.satfinite.e5m2x2.f32 h, %4, %3;\n\t"
          "mov.b32 %0, {l, h};}"
          : "=r"(w) : "f"(a), "f"(b), "f"(c), "f"(d));
    return w;
#else
    return uint32_t(fp32_to_fp8_bits(a, f)) | uint32_t(fp32_to_fp8_bits(b, f)) << 8 |
           uint32_t(fp32_to_fp8_bits(c, f)) << 16 | uint32_t(fp32_to_fp8_bits(d, f)) << 24;
#endif
  }
};

// The coder of FP8 parameters p (p.inv_scale is fl(1 / p.scale), as every GroupParams maker sets it).
// Branch-free: kernels build it once a group.
KVQ_HD Fp8Coder fp8_coder(const GroupParams& p) {
  const bool zero = p.scale == 0.0f;  // x * 0 is a signed zero (sure, then cleared) or NaN (not sure)
  const float r = zero ? 0.0f : p.inv_scale;
  Fp8Coder c;
  c.r_lo = r * (1.0f - 0x1p-21f), c.r_hi = r * (1.0f + 0x1p-21f);
  c.keep = zero ? 0u : 0xffffffffu;
  c.usable = zero || (fabsf(c.r_lo) >= 0x1p-126f && fabsf(c.r_hi) < INFINITY);  // false for NaN too
  return c;
}

KVQ_HD float decode(int q, const GroupParams& p, const Scheme& s) {
  if (s.fp8()) return decode_fp8(q, p.scale, s.format);
  return s.asymmetric ? decode_asymmetric(q, p.scale, p.zero) : decode_symmetric(q, p.scale);
}

// ---- code storage ----------------------------------------------------------------------------
// int8: one byte, two's complement (symmetric) or 0..255 (asymmetric).
// int4: element 2i in the low nibble of byte i, 2i+1 in the high nibble; symmetric codes as
// two's-complement nibbles, asymmetric as 0..15.
KVQ_HD uint8_t code_to_nibble(int q) { return static_cast<uint8_t>(q & 0xf); }

KVQ_HD int nibble_to_code(uint8_t nibble, bool asymmetric) {
  const int n = nibble & 0xf;
  return asymmetric ? n : (n ^ 8) - 8;  // sign-extend 4 bits
}

KVQ_HD uint8_t pack_nibbles(int q_even, int q_odd) {
  return static_cast<uint8_t>(code_to_nibble(q_even) | (code_to_nibble(q_odd) << 4));
}

KVQ_HD uint8_t code_to_byte(int q) { return static_cast<uint8_t>(q & 0xff); }

// The low bytes of four words, the first lowest: four int8 codes from IntegerCoder's biased bits.
KVQ_HD uint32_t pack_low_bytes(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);  // 3 PRMT
#else
  return (a & 0xffu) | (b & 0xffu) << 8 | (c & 0xffu) << 16 | (d & 0xffu) << 24;
#endif
}

// The low nibbles of eight words as int4 storage (element 2i low in byte i).
KVQ_HD uint32_t pack_low_nibbles(const uint32_t (&w)[8]) {
  const uint32_t even = pack_low_bytes(w[0], w[2], w[4], w[6]), odd = pack_low_bytes(w[1], w[3], w[5], w[7]);
  return (even & 0x0f0f0f0fu) | ((odd << 4) & 0xf0f0f0f0u);
}

// `unsigned_code`: asymmetric integer codes and FP8 bytes; else two's complement.
KVQ_HD int byte_to_code(uint8_t byte, bool unsigned_code) {
  return unsigned_code ? static_cast<int>(byte) : static_cast<int>(static_cast<int8_t>(byte));
}

}  // namespace kvq
