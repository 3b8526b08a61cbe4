// kvq._gpu's checks of the caller's tensors (DLPack: torch, CuPy, JAX): device, dtype, rank, strides
// and sizes, each failure an InputError that names the argument and says what was expected.
#pragma once

#include <cuda_runtime.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "python/arrays.hpp"

namespace kvq::py {

namespace nb = nanobind;
using Tensor = nb::ndarray<>;  // any device and dtype: checked here, with messages that say what is wrong

namespace dt {
constexpr nb::dlpack::dtype make(nb::dlpack::dtype_code c, int bits) { return {static_cast<uint8_t>(c), static_cast<uint8_t>(bits), 1}; }
constexpr auto kBf16 = make(nb::dlpack::dtype_code::Bfloat, 16);
constexpr auto kFp16 = make(nb::dlpack::dtype_code::Float, 16);
constexpr auto kFp32 = make(nb::dlpack::dtype_code::Float, 32);
constexpr auto kUint8 = make(nb::dlpack::dtype_code::UInt, 8);
constexpr auto kInt8 = make(nb::dlpack::dtype_code::Int, 8);
constexpr auto kInt32 = make(nb::dlpack::dtype_code::Int, 32);
constexpr auto kInt64 = make(nb::dlpack::dtype_code::Int, 64);
}  // namespace dt

std::string shape_of(const Tensor& t);
std::string strides_of(const Tensor& t);
// Checks that `t` is a CUDA tensor on the current device, of one of `dtypes` and rank `rank`
// (-1: any) with a unit stride on its last axis; InputError naming `what` otherwise.
void require(const Tensor& t, const std::string& what, std::initializer_list<nb::dlpack::dtype> dtypes, int rank);
bool contiguous(const Tensor& t);
// A contiguous buffer of exactly `bytes` bytes (scales, zero points, quantize outputs).
void require_buffer(const Tensor& t, const std::string& what, int64_t bytes);
// A paged cache's per-row parameters (or chan-tN's): `pages` x `page_bytes` bytes, contiguous (a pool
// of their own, any shape), or [pages, ...] whose pages lie apart by the first stride, each page's
// own contiguous: views into a pool that keeps each page's parameters beside its codes (kvq.gpu.one_pool,
// one allocation a page as lmdeploy's blocks). Returns the bytes from one page's parameters to the next.
int64_t paged_params(const Tensor& t, const std::string& what, int64_t pages, int64_t page_bytes);
void check_dim(const Tensor& t, const std::string& what, size_t axis, int64_t want, const char* name);
// An int32 [B, entries] table on the device (block_table, window_table); entries < 0: any.
const int32_t* table_of(nb::object t_obj, const char* what, int64_t batch, int64_t entries = -1);

inline cudaStream_t to_stream(uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

}  // namespace kvq::py
