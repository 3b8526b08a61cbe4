// One element of the planar layout read back: its code from a (b, h, t) row, its group's stored
// scale and zero point, its dequantized value. The CPU's dequantize() and the GPU's
// (gpu/dequantize.cu) both call these, so the two give the same bits by construction.
#pragma once

#include <cstdint>

#include "quant/block_formats.hpp"
#include "quant/codec.hpp"
#include "quant/float_formats.hpp"

namespace kvq {

// The code of element d of one row of code_bytes_per_row(s, head_dim) bytes (quant/kv_tensor.hpp
// describes the 8-, 4- and 5-bit rows).
KVQ_HD int planar_code(const Scheme& s, const uint8_t* row, int64_t head_dim, int64_t d) {
  if (s.bits == 8) return byte_to_code(row[d], !s.signed_codes());
  const int low = nibble_to_code(d % 2 ? row[d / 2] >> 4 : row[d / 2], !s.signed_codes());
  if (s.bits == 4) return low;
  return low | (((row[head_dim / 2 + d / 8] >> (d % 8)) & 1) << 4);  // 5-bit
}

// A scale or zero point as stored: fp16 bits, fp32, or one byte (e8m0: mxfp4, e4m3: nvfp4).
KVQ_HD float stored_param(const void* array, int64_t g, ScaleDtype dt) {
  switch (dt) {
    case ScaleDtype::kFp16: return fp16_bits_to_fp32(static_cast<const uint16_t*>(array)[g]);
    case ScaleDtype::kFp32: return static_cast<const float*>(array)[g];
    case ScaleDtype::kE8M0: return e8m0_value(static_cast<const uint8_t*>(array)[g]);
    case ScaleDtype::kE4M3: return fp8_bits_to_fp32(static_cast<const uint8_t*>(array)[g], fp8_e4m3());
  }
  return 0.0f;
}

// The value a code stands for, given its group's scale and zero point (the block formats: scale and
// min; nvfp4 also the per-tensor scale). Scale-free schemes take scale 1.
KVQ_HD float dequantized_value(const Scheme& s, int code, float scale, float zero, float tensor_scale) {
  if (s.block_format()) return block_decode(s.format, code, scale, zero, tensor_scale);
  GroupParams p;
  p.scale = scale;
  p.zero = zero;
  return decode(code, p, s);
}

}  // namespace kvq
