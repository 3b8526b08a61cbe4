// Group statistics of 16-bit input (bf16, fp16) two elements at a time, for the wide-group quantize
// variants: a 32-bit word holds two sign-magnitude floats, and their order keys (the 16-bit analogue
// of GroupStats' keys) and magnitudes are reduced with 16x2 SIMD min/max, about 4 instructions an
// element fewer than converting each to fp32 first. finish() converts the three results to fp32
// exactly and gives the GroupStats the codec's add() gives for the same elements: both formats
// convert to fp32 monotonically and injectively, so the min, max and max |x| are the same elements.
// Host and device code: the CPU tests compare it with GroupStats::add over every 16-bit pattern.
#pragma once

#include "gpu/quantize.hpp"
#include "quant/codec.hpp"

namespace kvq {

namespace detail {

// Per 16-bit half: signed min, signed max, unsigned max (the CUDA SIMD intrinsics on the device).
KVQ_HD uint32_t half_min_s16(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __vmins2(a, b);
#else
  const int16_t a0 = int16_t(a & 0xffff), a1 = int16_t(a >> 16), b0 = int16_t(b & 0xffff), b1 = int16_t(b >> 16);
  return uint32_t(uint16_t(a0 < b0 ? a0 : b0)) | (uint32_t(uint16_t(a1 < b1 ? a1 : b1)) << 16);
#endif
}

KVQ_HD uint32_t half_max_s16(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __vmaxs2(a, b);
#else
  const int16_t a0 = int16_t(a & 0xffff), a1 = int16_t(a >> 16), b0 = int16_t(b & 0xffff), b1 = int16_t(b >> 16);
  return uint32_t(uint16_t(a0 > b0 ? a0 : b0)) | (uint32_t(uint16_t(a1 > b1 ? a1 : b1)) << 16);
#endif
}

KVQ_HD uint32_t half_max_u16(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __vmaxu2(a, b);
#else
  const uint32_t lo = (a & 0xffff) > (b & 0xffff) ? (a & 0xffff) : (b & 0xffff);
  const uint32_t hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
  return lo | (hi << 16);
#endif
}

KVQ_HD float half_bits_to_float(uint16_t bits, InputDtype dt) {
  return dt == InputDtype::kFp16 ? fp16_bits_to_fp32(bits) : bf16_bits_to_fp32(bits);
}

}  // namespace detail

struct PackedStats16 {
  // Per half: min and max order key (as int16: b ^ 0x7fff when the sign is set, so that the
  // integers sort like the floats, -0 just below +0), max magnitude. Start: nothing seen.
  uint32_t lo = 0x7fff7fffu, hi = 0x80008000u, amax = 0;

  // Two elements: the low half is the first. kKeys false: the magnitudes only (symmetric schemes
  // read nothing else), one instruction an element instead of 3.5.
  template <bool kKeys = true>
  KVQ_HD void add(uint32_t w) {
    if constexpr (kKeys) {
      const uint32_t sign = (w >> 15) & 0x00010001u;
      const uint32_t key = w ^ (sign * 0x7fffu);  // 0x7fff into each negative half, no carry between halves
      lo = detail::half_min_s16(lo, key);
      hi = detail::half_max_s16(hi, key);
    }
    amax = detail::half_max_u16(amax, w & 0x7fff7fffu);
  }

  // The statistics as the codec's GroupStats; at least one element must have been added. `keys`
  // false (add<false>): min and max are given as -amax and amax, bounds that every reader of a
  // symmetric group's statistics (amax, empty(), integer_coder) is content with.
  KVQ_HD GroupStats finish(InputDtype dt, bool keys = true) const {
    const uint32_t m0 = amax & 0xffff, m1 = amax >> 16;
    GroupStats seen;
    seen.amax = detail::half_bits_to_float(static_cast<uint16_t>(m0 > m1 ? m0 : m1), dt);
    if (!keys) {
      seen.lo_key = GroupStats::key_of(-seen.amax), seen.hi_key = GroupStats::key_of(seen.amax);
      return seen;
    }
    auto key_to_float = [dt](uint32_t packed, bool want_min) {
      const int16_t k0 = int16_t(packed & 0xffff), k1 = int16_t(packed >> 16);
      const int16_t k = want_min ? (k0 < k1 ? k0 : k1) : (k0 > k1 ? k0 : k1);
      const uint16_t bits = uint16_t(k) ^ (k < 0 ? 0x7fffu : 0u);  // the key map is its own inverse
      return detail::half_bits_to_float(bits, dt);
    };
    seen.lo_key = GroupStats::key_of(key_to_float(lo, true));
    seen.hi_key = GroupStats::key_of(key_to_float(hi, false));
    GroupStats st;  // merged into the empty statistics, as add() compares with them: a group of
    st.merge(seen);  // +NaNs keeps lo at +inf's key (and of -NaNs hi at -inf's), as on the CPU
    return st;
  }
};

}  // namespace kvq
