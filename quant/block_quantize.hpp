// CPU quantize / dequantize of the block formats (q8_0 ... nvfp4) into kvq's planar layout, on the
// scalar codec of quant/block_formats.hpp; quantize() and dequantize() route block schemes here.
#pragma once

#include <optional>
#include <string>

#include "quant/block_formats.hpp"
#include "quant/kv_tensor.hpp"

namespace kvq {

// Fills q.scales, q.zeros (q4_1 / q5_1: the min), q.codes, q.tensor_scale (nvfp4) and the window's
// values of x, for q with its scheme, shape and quantized_tokens set. `tensor_scale`: nvfp4's s_t
// as given (a calibrated one); nullopt: amax / 2688 over the quantized elements of x. Throws
// InputError naming `tensor_name` and the block when a stored fp16 scale or min overflows.
void quantize_blocks(const KvView& x, QuantizedKv& q, const std::string& tensor_name,
                     std::optional<float> tensor_scale);

// One (b, h, t) row's codes (one per element, q8_0 as its int8 byte) to and from the planar layout's
// row of code_bytes_per_row(scheme, head_dim) bytes.
void pack_codes_row(const uint8_t* codes, int64_t head_dim, int bits, uint8_t* row);
void unpack_codes_row(const uint8_t* row, int64_t head_dim, int bits, uint8_t* codes);

// The stored byte of an e8m0 / e4m3 scale value, and back (mxfp4 / nvfp4 scale arrays as bytes).
uint8_t scale_byte(ScaleDtype dt, float value);
float scale_from_byte(ScaleDtype dt, uint8_t byte);

}  // namespace kvq
