// CPU quantize / dequantize of whole K/V tensors (OpenMP), built on the scalar codec.
#pragma once

#include <optional>

#include "quant/kv_tensor.hpp"

namespace kvq {

// Quantizes `x` with `scheme` into the planar layout. Throws InputError for non-finite input
// (naming `tensor_name` and the first bad index), for a scale or zero point that overflows the
// scale dtype, and SchemeError when the scheme does not fit the head_dim.
// +had rotates x along D first (what is stored, and dequantized, is the rotated tensor); +wW keeps
// the last W tokens of each sequence (lengths `seq_lens` [B], nullptr: all T) in full precision.
// Block formats (q8_0 ... nvfp4) follow their reference rules (quant/block_formats.hpp).
// `tensor_scale`, a calibrated per-tensor scale (e.g. for a cache quantized as it grows), replaces
// the one computed from the whole tensor: nvfp4's s_t (else amax / (6 * 448) over the quantized
// elements), or a symmetric per-tensor scheme's one scale (e.g. fp8-e4m3-tensor; stored rounded to
// the scale dtype, codes saturate). InputError when another scheme is given one.
QuantizedKv quantize(const KvView& x, const Scheme& scheme, const std::string& tensor_name,
                     const int32_t* seq_lens = nullptr, std::optional<float> tensor_scale = std::nullopt);

// Schemes whose one tensor-wide scale may be given: nvfp4 (s_t) and the symmetric per-tensor
// schemes with a scale (int8-tensor, fp8-e4m3-tensor, ...).
bool takes_tensor_scale(const Scheme& s);
// InputError unless `s` takes a tensor scale; then unless `scale` can be used: nvfp4's finite and >= 0,
// a per-tensor scheme's finite, > 0 and still so once rounded to the scale dtype.
void check_tensor_scale_taken(const Scheme& s);
void check_given_tensor_scale(const Scheme& s, float scale, const std::string& tensor_name);

// Dequantized values, BNSH [B, H, T, D]; in the rotated basis for +had schemes (H is its own
// inverse: hadamard_rotate each row to return to the input basis).
std::vector<float> dequantize(const QuantizedKv& q);

// +wW: quantized tokens per batch entry (quantized_length of each seq_len; InputError for a
// seq_len outside [0, T]); empty without a window.
std::vector<int32_t> window_boundaries(const Scheme& scheme, const KvShape& shape, const int32_t* seq_lens);

// The messages of the quantizers' input errors, shared by the CPU and GPU paths so that both
// report a bad input identically.
std::string non_finite_message(const std::string& tensor_name, float value, int64_t b, int64_t h, int64_t t, int64_t d,
                               const char* why = "quantizers accept finite input only");
std::string overflow_message(const std::string& tensor_name, const Scheme& scheme, int64_t group, const GroupBox& box,
                             const GroupStats& stats);

// Statistics of every group, in group order (the deterministic first pass of quantize()), over
// the tokens t < quantized_tokens[b] (empty: all tokens).
std::vector<GroupStats> group_stats(const KvView& x, const Scheme& scheme,
                                    const std::vector<int32_t>& quantized_tokens = {});

}  // namespace kvq
