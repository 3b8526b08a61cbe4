// Arrays between Python and kvq: any object with the DLPack or buffer protocol (numpy, torch on the
// CPU) in, numpy out. Float tensors are read in place when they are float32 with a contiguous last
// axis, and converted exactly otherwise (float64 is rounded to float32, the codec's input type).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>
#include <vector>

#include "quant/kv_tensor.hpp"

namespace kvq {

namespace nb = nanobind;

using AnyArray = nb::ndarray<nb::ro>;  // any dtype, rank, strides and device; checked here

inline constexpr nb::dlpack::dtype kFloat16{static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};

std::string dtype_name(nb::dlpack::dtype dt);
std::string shape_string(const AnyArray& a);  // "[2, 3, 4]"

// A rank-4 K/V-like tensor as a KvView; `copy` holds converted values when the input could not be
// viewed in place. layout "bnsh": [B, H, T, D]; "bsnh": [B, T, H, D].
struct Fp32Tensor {
  std::vector<float> copy;
  KvView view;
  std::vector<float> contiguous() const;  // BNSH [B, H, T, D]
};
Fp32Tensor fp32_tensor(const AnyArray& a, const std::string& name, const std::string& layout);

// All values in C order, converted to float / double / int32. With `shape`, the array must have it.
std::vector<float> float_values(const AnyArray& a, const std::string& name, const std::vector<int64_t>& shape = {});
std::vector<double> double_values(const AnyArray& a, const std::string& name);
std::vector<int32_t> int32_values(const AnyArray& a, const std::string& name, const std::vector<int64_t>& shape);
std::vector<uint8_t> contiguous_bytes(const AnyArray& a, const std::string& name);  // 1-byte dtypes

// A read-only numpy view of `data`, kept alive by `owner` (the Python object that holds it).
nb::object readonly_view(const void* data, const std::vector<int64_t>& shape, nb::dlpack::dtype dtype, nb::handle owner);

// A numpy array that owns `values`.
template <typename T>
nb::object owned_array(std::vector<T> values, const std::vector<int64_t>& shape) {
  auto* heap = new std::vector<T>(std::move(values));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  std::vector<size_t> dims(shape.begin(), shape.end());
  return nb::cast(nb::ndarray<nb::numpy, T>(heap->data(), dims.size(), dims.data(), owner));
}

}  // namespace kvq
