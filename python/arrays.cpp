#include "python/arrays.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

#include "quant/errors.hpp"
#include "quant/float_formats.hpp"

namespace kvq {
namespace {

using Code = nb::dlpack::dtype_code;

bool is(nb::dlpack::dtype dt, Code code, int bits) {
  return dt.code == static_cast<uint8_t>(code) && dt.bits == bits && dt.lanes == 1;
}

bool is_float(nb::dlpack::dtype dt) {
  return is(dt, Code::Float, 16) || is(dt, Code::Float, 32) || is(dt, Code::Float, 64) || is(dt, Code::Bfloat, 16);
}

bool is_integer(nb::dlpack::dtype dt) {
  return (dt.code == static_cast<uint8_t>(Code::Int) || dt.code == static_cast<uint8_t>(Code::UInt)) && dt.lanes == 1 &&
         (dt.bits == 8 || dt.bits == 16 || dt.bits == 32 || dt.bits == 64);
}

void check_cpu(const AnyArray& a, const std::string& name) {
  if (a.device_type() != nb::device::cpu::value)
    throw InputError(fmt::format("{}: the array is on a non-CPU device (DLPack device type {}); kvq's codec and "
                                 "reference run on the CPU: pass x.cpu()",
                                 name, a.device_type()));
}

template <typename T>
T load(const uint8_t* base, int64_t offset) {
  T v;
  std::memcpy(&v, base + offset * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

// Element `offset` (in elements) of a float array, exactly as double.
double load_float(const uint8_t* base, int64_t offset, nb::dlpack::dtype dt) {
  if (is(dt, Code::Float, 32)) return load<float>(base, offset);
  if (is(dt, Code::Float, 64)) return load<double>(base, offset);
  if (is(dt, Code::Float, 16)) return fp16_bits_to_fp32(load<uint16_t>(base, offset));
  return bf16_bits_to_fp32(load<uint16_t>(base, offset));
}

int64_t load_integer(const uint8_t* base, int64_t offset, nb::dlpack::dtype dt) {
  // each branch widened to int64 on its own: `s ? int32 : uint32` would be uint32, and -1 read as 2^32 - 1
  const bool s = dt.code == static_cast<uint8_t>(Code::Int);
  const auto as = [&](auto value) { return static_cast<int64_t>(value); };
  switch (dt.bits) {
    case 8: return s ? as(load<int8_t>(base, offset)) : as(load<uint8_t>(base, offset));
    case 16: return s ? as(load<int16_t>(base, offset)) : as(load<uint16_t>(base, offset));
    case 32: return s ? as(load<int32_t>(base, offset)) : as(load<uint32_t>(base, offset));
    default: return s ? as(load<int64_t>(base, offset)) : as(load<uint64_t>(base, offset));
  }
}

// Calls f(element offset) for every element in C order.
template <typename F>
void for_each_offset(const AnyArray& a, F f) {
  const size_t n = a.ndim();
  std::vector<int64_t> index(n, 0);
  int64_t offset = 0;
  for (size_t count = 0, total = a.size(); count < total; ++count) {
    f(offset);
    for (size_t axis = n; axis-- > 0;) {
      if (++index[axis] < static_cast<int64_t>(a.shape(axis))) {
        offset += a.stride(axis);
        break;
      }
      offset -= a.stride(axis) * (index[axis] - 1);
      index[axis] = 0;
    }
  }
}

void check_shape(const AnyArray& a, const std::string& name, const std::vector<int64_t>& shape) {
  bool same = a.ndim() == shape.size();
  for (size_t i = 0; same && i < shape.size(); ++i) same = static_cast<int64_t>(a.shape(i)) == shape[i];
  if (!same) throw InputError(fmt::format("{}: expected shape [{}], got {}", name, fmt::join(shape, ", "), shape_string(a)));
}

void check_float(const AnyArray& a, const std::string& name) {
  check_cpu(a, name);
  if (!is_float(a.dtype()))
    throw InputError(fmt::format("{}: dtype {} is not a float type (float16, bfloat16, float32, float64)", name,
                                 dtype_name(a.dtype())));
}

const uint8_t* bytes_of(const AnyArray& a) { return static_cast<const uint8_t*>(a.data()); }

}  // namespace

std::string dtype_name(nb::dlpack::dtype dt) {
  const char* kind = "?";
  switch (static_cast<Code>(dt.code)) {
    case Code::Int: kind = "int"; break;
    case Code::UInt: kind = "uint"; break;
    case Code::Float: kind = "float"; break;
    case Code::Bfloat: kind = "bfloat"; break;
    case Code::Complex: kind = "complex"; break;
    case Code::Bool: kind = "bool"; break;
    default: kind = "dtype-code-"; break;
  }
  return fmt::format("{}{}", kind, dt.bits);
}

std::string shape_string(const AnyArray& a) {
  std::vector<size_t> dims;
  for (size_t i = 0; i < a.ndim(); ++i) dims.push_back(a.shape(i));
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

std::vector<float> Fp32Tensor::contiguous() const {
  const KvShape& s = view.shape;
  std::vector<float> out(static_cast<size_t>(s.numel()));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t t = 0; t < s.tokens; ++t) {
        const float* row = view.row(b, h, t);
        std::copy(row, row + s.head_dim, out.begin() + ((b * s.heads + h) * s.tokens + t) * s.head_dim);
      }
  return out;
}

Fp32Tensor fp32_tensor(const AnyArray& a, const std::string& name, const std::string& layout) {
  if (layout != "bnsh" && layout != "bsnh")
    throw InputError(fmt::format("{}: layout '{}' is not 'bnsh' ([B, H, T, D]) or 'bsnh' ([B, T, H, D])", name, layout));
  const bool bsnh = layout == "bsnh";
  if (a.ndim() != 4)
    throw InputError(fmt::format("{}: expected 4 axes {}, got {}", name, bsnh ? "[B, T, H, D]" : "[B, H, T, D]",
                                 shape_string(a)));
  check_float(a, name);
  const int h_axis = bsnh ? 2 : 1, t_axis = bsnh ? 1 : 2;
  Fp32Tensor t;
  t.view.shape = {static_cast<int64_t>(a.shape(0)), static_cast<int64_t>(a.shape(h_axis)),
                  static_cast<int64_t>(a.shape(t_axis)), static_cast<int64_t>(a.shape(3))};
  if (is(a.dtype(), Code::Float, 32) && (a.stride(3) == 1 || a.shape(3) <= 1)) {  // in place
    t.view.data = static_cast<const float*>(a.data());
    t.view.stride_b = a.stride(0);
    t.view.stride_h = a.stride(h_axis);
    t.view.stride_t = a.stride(t_axis);
    return t;
  }
  t.copy.resize(static_cast<size_t>(t.view.shape.numel()));
  const KvShape& s = t.view.shape;
  const uint8_t* base = bytes_of(a);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t tok = 0; tok < s.tokens; ++tok)
        for (int64_t d = 0; d < s.head_dim; ++d) {
          const int64_t offset = b * a.stride(0) + h * a.stride(h_axis) + tok * a.stride(t_axis) + d * a.stride(3);
          t.copy[((b * s.heads + h) * s.tokens + tok) * s.head_dim + d] =
              static_cast<float>(load_float(base, offset, a.dtype()));
        }
  t.view = KvView::bnsh(t.copy.data(), s);
  return t;
}

std::vector<float> float_values(const AnyArray& a, const std::string& name, const std::vector<int64_t>& shape) {
  check_float(a, name);
  if (!shape.empty()) check_shape(a, name, shape);
  std::vector<float> out;
  out.reserve(a.size());
  for_each_offset(a, [&](int64_t o) { out.push_back(static_cast<float>(load_float(bytes_of(a), o, a.dtype()))); });
  return out;
}

std::vector<double> double_values(const AnyArray& a, const std::string& name) {
  check_float(a, name);
  std::vector<double> out;
  out.reserve(a.size());
  for_each_offset(a, [&](int64_t o) { out.push_back(load_float(bytes_of(a), o, a.dtype())); });
  return out;
}

std::vector<int32_t> int32_values(const AnyArray& a, const std::string& name, const std::vector<int64_t>& shape) {
  check_cpu(a, name);
  if (!is_integer(a.dtype())) throw InputError(fmt::format("{}: dtype {} is not an integer type", name, dtype_name(a.dtype())));
  check_shape(a, name, shape);
  std::vector<int32_t> out;
  for_each_offset(a, [&](int64_t o) {
    const int64_t v = load_integer(bytes_of(a), o, a.dtype());
    if (v < INT32_MIN || v > INT32_MAX) throw InputError(fmt::format("{}: value {} does not fit int32", name, v));
    out.push_back(static_cast<int32_t>(v));
  });
  return out;
}

std::vector<uint8_t> contiguous_bytes(const AnyArray& a, const std::string& name) {
  check_cpu(a, name);
  if (a.dtype().bits != 8 || !is_integer(a.dtype()))
    throw InputError(fmt::format("{}: expected uint8 or int8, got {}", name, dtype_name(a.dtype())));
  std::vector<uint8_t> out;
  out.reserve(a.size());
  for_each_offset(a, [&](int64_t o) { out.push_back(load<uint8_t>(bytes_of(a), o)); });
  return out;
}

nb::object readonly_view(const void* data, const std::vector<int64_t>& shape, nb::dlpack::dtype dtype, nb::handle owner) {
  std::vector<size_t> dims(shape.begin(), shape.end());
  return nb::cast(nb::ndarray<nb::numpy, nb::ro>(data, dims.size(), dims.data(), owner, nullptr, dtype));
}

}  // namespace kvq
