// kvq._gpu's functions, as gpu_bindings.cpp binds them (the Python side, kvq/gpu.py, allocates the
// outputs and names the stream; each function checks the tensors and fills the params structs).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "python/gpu_tensors.hpp"

namespace kvq::py {

// Writing caches (gpu_cache_bindings.cpp): quantize, dequantize, the buffers' sizes, append.
std::string quantize_py(const Tensor& x, const std::string& scheme_name, const Tensor& codes, nb::object scales,
                        nb::object zeros, nb::object tensor_scale_out, std::optional<float> tensor_scale,
                        const std::string& layout_name, const std::string& variant, const std::vector<int32_t>& seq_lens,
                        uintptr_t stream, const Tensor& scratch, nb::object status);
void dequantize_py(const Tensor& codes, const std::string& scheme_name, int64_t head_dim, nb::object scales,
                   nb::object zeros, nb::object tensor_scale, const Tensor& out, uintptr_t stream);
nb::dict sizes_of(const std::string& scheme_name, int64_t b, int64_t h, int64_t t, int64_t d, const std::string& layout);
void append_rows_py(const Tensor& src_codes, const Tensor& dst_codes, nb::object src_scales, nb::object dst_scales,
                    nb::object src_zeros, nb::object dst_zeros, const Tensor& positions, nb::object block_table,
                    int page_tokens, int param_heads, const Tensor& status, bool check, uintptr_t stream);
void flush_channel_groups_py(const Tensor& x, const std::string& storage, const Tensor& codes, const Tensor& scales,
                             nb::object zeros, const Tensor& window, const Tensor& positions, nb::object block_table,
                             nb::object window_table, int page_tokens, const Tensor& status, uintptr_t stream);

// Reading them (gpu_decode_bindings.cpp).
nb::dict decode_py(const Tensor& q, const nb::dict& k, const nb::dict& v, const Tensor& out, const Tensor& lse,
                   nb::object seq_lens, nb::object alibi_slopes, double softmax_scale, const std::string& variant, int splits,
                   uintptr_t stream_handle, nb::object block_table, nb::object window_table);
nb::dict decode_support(const std::string& variant, const std::string& k, const std::string& v, const std::string& layout,
                        int head_dim, int page_tokens);

}  // namespace kvq::py
