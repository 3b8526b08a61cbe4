// CPU quantize / dequantize of whole K/V tensors (OpenMP), built on the scalar codec.
#pragma once

#include "quant/kv_tensor.hpp"

namespace kvq {

// Quantizes `x` with `scheme` into the planar layout. Throws InputError for non-finite input
// (naming `tensor_name` and the first bad index), for a scale or zero point that overflows the
// scale dtype, and SchemeError when the scheme does not fit the head_dim.
QuantizedKv quantize(const KvView& x, const Scheme& scheme, const std::string& tensor_name);

// Dequantized values, BNSH [B, H, T, D].
std::vector<float> dequantize(const QuantizedKv& q);

// The messages of the quantizers' input errors, shared by the CPU and GPU paths so that both
// report a bad input identically.
std::string non_finite_message(const std::string& tensor_name, float value, int64_t b, int64_t h, int64_t t, int64_t d,
                               const char* why = "quantizers accept finite input only");
std::string overflow_message(const std::string& tensor_name, const Scheme& scheme, int64_t group, const GroupBox& box,
                             const GroupStats& stats);

// Statistics of every group, in group order (the deterministic first pass of quantize()).
std::vector<GroupStats> group_stats(const KvView& x, const Scheme& scheme);

}  // namespace kvq
