// fp16 and bf16 conversions, round-to-nearest-even. The integer implementations (*_soft) are the
// definition; on the GPU the fp16 conversions use the hardware instruction for every non-NaN input,
// which `kvq validate` proves bit-identical to the definition over all 2^32 fp32 and 2^16 fp16
// patterns (NaNs keep the integer path so that their bits match too).
#pragma once

#include "quant/host_device.hpp"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace kvq {

inline constexpr float kFp16Max = 65504.0f;
inline constexpr float kFp16MinNormal = 6.103515625e-05f;  // 2^-14

KVQ_HD uint16_t fp32_to_fp16_bits_soft(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN stays NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 ties up to inf
  if (ax < 0x38800000u) {  // below 2^-14: fp16 subnormal m * 2^-24, or zero
    if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 (a tie) rounds to 0
    const uint32_t shift = 126u - (ax >> 23);                      // 14..24
    const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    uint32_t m = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (m & 1u))) ++m;  // may carry into the smallest normal
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t h = (ax - 0x38000000u) >> 13;  // rebias exponent 127 -> 15, drop 13 mantissa bits
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may bump the exponent: correct
  return static_cast<uint16_t>(sign | h);
}

KVQ_HD float fp16_bits_to_fp32_soft(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    const float mag = static_cast<float>(m) * 5.9604644775390625e-08f;  // m * 2^-24, exact
    return bits_float(float_bits(mag) | sign);
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

KVQ_HD uint16_t fp32_to_fp16_bits(float f) {
#if defined(__CUDA_ARCH__)
  if ((float_bits(f) & 0x7fffffffu) <= 0x7f800000u) return __half_as_ushort(__float2half_rn(f));
#endif
  return fp32_to_fp16_bits_soft(f);
}

KVQ_HD float fp16_bits_to_fp32(uint16_t h) {
#if defined(__CUDA_ARCH__)
  if ((h & 0x7fffu) <= 0x7c00u) return __half2float(__ushort_as_half(h));
#endif
  return fp16_bits_to_fp32_soft(h);
}

// An fp16 value in two bytes, little-endian, as the GPU, FBGEMM's rows and ggml's blocks keep it.
KVQ_HD void store_fp16_le(uint8_t* dst, float value) {
  const uint16_t bits = fp32_to_fp16_bits(value);
  dst[0] = static_cast<uint8_t>(bits & 0xff);
  dst[1] = static_cast<uint8_t>(bits >> 8);
}
KVQ_HD float load_fp16_le(const uint8_t* src) { return fp16_bits_to_fp32(static_cast<uint16_t>(src[0] | (src[1] << 8))); }

KVQ_HD uint16_t fp32_to_bf16_bits(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

KVQ_HD float bf16_bits_to_fp32(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

KVQ_HD float round_to_fp16(float x) { return fp16_bits_to_fp32(fp32_to_fp16_bits(x)); }

// The power of two e that tensor-core kernels scale a query head by before rounding it to fp16:
// max|q| * 2^e lands in [2^14, 2^15), far from fp16 overflow and from its subnormals. `amax` is
// finite and >= 0; e is clamped to [-100, 100] so 2^e and 2^-e stay normal fp32 numbers.
KVQ_HD int fp16_operand_exponent(float amax) {
  if (!(amax > 0.0f)) return 0;
  const int biased = static_cast<int>((float_bits(amax) >> 23) & 0xffu);
  const int e = 14 - (biased == 0 ? -127 : biased - 127);
  return e < -100 ? -100 : e > 100 ? 100 : e;
}
KVQ_HD float round_to_bf16(float x) { return bf16_bits_to_fp32(fp32_to_bf16_bits(x)); }

// ---- FP8 (OCP 8-bit floating point) -----------------------------------------------------------
// e4m3fn: 4 exponent bits, bias 7, 3 mantissa bits, no infinities, S.1111.111 is NaN, max 448.
// e5m2:   5 exponent bits, bias 15, 2 mantissa bits, IEEE-like (inf and NaN), max 57344.
// fp32_to_fp8_bits_soft() is the codec's fp8(): round to nearest even onto the grid (subnormals
// included), then saturate to +-FMAX ("satfinite": also +-inf -> +-FMAX); NaN -> 0x7f | sign.
// fp32_to_fp8_bits() is it on the host; on the GPU (sm_89 and later) finite inputs take the hardware
// conversion (cvt.rn.satfinite), which `kvq validate` and tests/gpu/test_gpu_fp8.cpp prove identical
// to the definition over every finite fp32 pattern; inf and NaN keep the integer path.
struct Fp8Format {
  int mantissa_bits;   // 3 / 2
  int bias;            // 7 / 15
  uint32_t max_bits;   // magnitude bits of FMAX: 0x7e / 0x7b
  float max_value;     // 448 / 57344
};
// Functions rather than constants: device code may use them without a device copy of a global.
KVQ_HD constexpr Fp8Format fp8_e4m3() { return {3, 7, 0x7eu, 448.0f}; }
KVQ_HD constexpr Fp8Format fp8_e5m2() { return {2, 15, 0x7bu, 57344.0f}; }

KVQ_HD uint8_t fp32_to_fp8_bits_soft(float f, Fp8Format format) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN
  const int m_bits = format.mantissa_bits;
  const int emin = 1 - format.bias;                     // exponent of the smallest normal
  const int e = static_cast<int>(ax >> 23) - 127;    // fp32 exponent (fp32 subnormals: -127, all round to 0)
  const int emax = static_cast<int>(format.max_bits >> m_bits) - format.bias;  // exponent of FMAX
  if (e > emax) return static_cast<uint8_t>(sign | format.max_bits);        // beyond the grid (and inf): saturate
  uint32_t h;
  if (e >= emin) {  // normal: rebias the exponent, keep m_bits mantissa bits, round half to even
    const uint32_t shift = static_cast<uint32_t>(23 - m_bits);
    h = (ax - (static_cast<uint32_t>(127 - format.bias) << 23)) >> shift;
    const uint32_t rem = ax & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) ++h;  // a carry bumps the exponent: still correct
  } else {  // subnormal m * 2^(emin - m_bits), m = 0 .. 2^m_bits (2^m_bits: the smallest normal)
    if (e < emin - m_bits - 1) return static_cast<uint8_t>(sign);  // below half the smallest subnormal
    const uint32_t shift = static_cast<uint32_t>(23 + emin - m_bits - e);  // 24 - m_bits .. 24
    const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) ++h;
  }
  return static_cast<uint8_t>(sign | (h > format.max_bits ? format.max_bits : h));
}

KVQ_HD uint8_t fp32_to_fp8_bits(float f, Fp8Format format) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if ((float_bits(f) & 0x7fffffffu) < 0x7f800000u)
    return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, format.mantissa_bits == 3 ? __NV_E4M3 : __NV_E5M2);
#endif
  return fp32_to_fp8_bits_soft(f, format);
}

// Exact: every fp8 value is an fp32 value. e5m2's inf and both formats' NaN codes decode as such.
KVQ_HD float fp8_bits_to_fp32(uint8_t c, Fp8Format format) {
  const int m_bits = format.mantissa_bits;
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t mag = c & 0x7fu;
  const uint32_t e = mag >> m_bits, m = mag & ((1u << m_bits) - 1u);
  const uint32_t e_all_ones = 0x7fu >> m_bits;
  if (format.mantissa_bits == 3 && mag == 0x7fu) return bits_float(sign | 0x7fc00000u);  // e4m3fn NaN
  if (format.mantissa_bits == 2 && e == e_all_ones)
    return bits_float(sign | (m == 0 ? 0x7f800000u : 0x7fc00000u));  // e5m2 inf / NaN
  if (e == 0) {  // m * 2^(1 - bias - m_bits): m is a small integer, the power of two is exact
    const float mag_f = static_cast<float>(m) * bits_float(static_cast<uint32_t>(127 + 1 - format.bias - m_bits) << 23);
    return bits_float(float_bits(mag_f) | sign);
  }
  return bits_float(sign | ((e + 127u - static_cast<uint32_t>(format.bias)) << 23) | (m << (23 - m_bits)));
}

}  // namespace kvq
