// Device helpers shared by the quantize kernels: loading any input dtype as fp32 (exactly, through
// quant/float_formats.hpp), storing scales in their dtype, and the error flags.
#pragma once

#include <cstdint>

#include "gpu/quantize.hpp"
#include "quant/codec.hpp"
#include "quant/groups.hpp"

namespace kvq::detail {

inline constexpr unsigned long long kNoIndex = ~0ull;

__device__ __forceinline__ float load_as_float(const void* base, InputDtype dt, int64_t offset) {
  switch (dt) {
    case InputDtype::kFp32: return static_cast<const float*>(base)[offset];
    case InputDtype::kFp16: return fp16_bits_to_fp32(static_cast<const uint16_t*>(base)[offset]);
    case InputDtype::kBf16: return bf16_bits_to_fp32(static_cast<const uint16_t*>(base)[offset]);
  }
  return 0.0f;
}

__device__ __forceinline__ int64_t element_offset(const QuantizeParams& p, int64_t b, int64_t h, int64_t t, int64_t d) {
  return b * p.stride_b + h * p.stride_h + t * p.stride_t + d;
}

// +wW: tokens [0, quantized_tokens) of sequence b are quantized, the rest keep code 0.
__device__ __forceinline__ int64_t quantized_tokens(const QuantizeParams& p, int64_t b) {
  return quantized_length(p.scheme, p.seq_lens ? p.seq_lens[b] : p.shape.tokens, p.shape.tokens);
}

// Flat logical index in [B, H, T, D] order: what the CPU's "first bad index" means.
__device__ __forceinline__ unsigned long long flat_index(const KvShape& s, int64_t b, int64_t h, int64_t t, int64_t d) {
  return static_cast<unsigned long long>(((b * s.heads + h) * s.tokens + t) * s.head_dim + d);
}

// Scales and zero points are stored in the scale dtype; the stored value is what encoding uses.
__device__ __forceinline__ void store_param(void* array, int64_t g, float value, ScaleDtype dt) {
  if (dt == ScaleDtype::kFp16) static_cast<uint16_t*>(array)[g] = fp32_to_fp16_bits(value);
  else static_cast<float*>(array)[g] = value;
}

__device__ __forceinline__ float load_param(const void* array, int64_t g, ScaleDtype dt) {
  return dt == ScaleDtype::kFp16 ? fp16_bits_to_fp32(static_cast<const uint16_t*>(array)[g])
                                 : static_cast<const float*>(array)[g];
}

// Merges the stats of `lanes` neighbouring lanes (a power of two dividing 32) with GroupStats' own
// order, so signed zeros resolve as on the CPU; only what the scheme's params read is exchanged.
__device__ __forceinline__ GroupStats shuffle_merge(GroupStats st, int lanes, bool asymmetric) {
  for (int offset = 1; offset < lanes; offset <<= 1) {
    GroupStats other;
    if (asymmetric) {
      other.lo_key = __shfl_xor_sync(0xffffffffu, st.lo_key, offset);
      other.hi_key = __shfl_xor_sync(0xffffffffu, st.hi_key, offset);
    } else {
      other.amax = __shfl_xor_sync(0xffffffffu, st.amax, offset);
    }
    st.merge(other);
  }
  return st;
}

}  // namespace kvq::detail
