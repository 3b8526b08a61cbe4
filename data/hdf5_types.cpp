#include "data/hdf5_types.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "quant/float_formats.hpp"

namespace kvq::h5 {
namespace {

struct FloatLayout {
  size_t size, spos, epos, esize, mpos, msize, ebias;
  bool operator==(const FloatLayout& o) const {
    return size == o.size && spos == o.spos && epos == o.epos && esize == o.esize && mpos == o.mpos &&
           msize == o.msize && ebias == o.ebias;
  }
};

constexpr FloatLayout kFp16{2, 15, 10, 5, 0, 10, 15};
constexpr FloatLayout kBf16{2, 15, 7, 8, 0, 7, 127};
constexpr FloatLayout kFp32{4, 31, 23, 8, 0, 23, 127};

const FloatLayout& layout_of(StoredDtype dtype) {
  switch (dtype) {
    case StoredDtype::kFp16: return kFp16;
    case StoredDtype::kBf16: return kBf16;
    case StoredDtype::kFp32: return kFp32;
  }
  return kFp32;
}

FloatLayout layout_of(const H5::FloatType& t) {
  FloatLayout l{};
  l.size = t.getSize();
  t.getFields(l.spos, l.epos, l.esize, l.mpos, l.msize);
  l.ebias = t.getEbias();
  return l;
}

// The memory type for raw reads: the file's type in little-endian order (no value conversion).
H5::FloatType little_endian(const H5::DataType& type) {
  H5::FloatType t(type.getId());
  H5::FloatType copy;
  copy.copy(t);
  copy.setOrder(H5T_ORDER_LE);
  return copy;
}

struct Failures {
  bool checksum = false, version = false, truncated = false;
};
thread_local Failures recorded;
hid_t version_error = -1, truncated_error = -1;  // minor error ids, looked up outside the callback

herr_t record_failure(hid_t stack, void*) {
  auto visit = [](unsigned, const H5E_error2_t* e, void*) -> herr_t {
    const std::string desc = e->desc ? e->desc : "";
    recorded.checksum = recorded.checksum || desc.find("checksum") != std::string::npos;
    recorded.version = recorded.version || e->min_num == version_error;
    recorded.truncated = recorded.truncated || e->min_num == truncated_error;
    return 0;
  };
  H5Ewalk2(stack, H5E_WALK_DOWNWARD, visit, nullptr);
  return 0;
}

}  // namespace

void record_failures() {
  version_error = H5E_VERSION, truncated_error = H5E_TRUNCATED;
  H5Eset_auto2(H5E_DEFAULT, record_failure, nullptr);
  // Off again before HDF5 shuts down (its atexit handler runs after ours): a callback still set
  // then makes its shutdown loop ("HDF5: infinite loop closing library") after a corrupt file.
  static const bool registered = std::atexit([] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }) == 0;
  (void)registered;
}

void clear_failures() { recorded = {}; }

std::string failure_reason() {
  const Failures found = recorded;
  if (found.checksum) return "checksum mismatch: the file is corrupt";
  if (found.truncated) return "the file is truncated";
  if (found.version) return "an object version HDF5 1.10 cannot read: corrupt, or written by a newer HDF5 with libver='latest'";
  return "the file is truncated or corrupt";
}

H5::FloatType file_type(StoredDtype dtype) {
  if (dtype == StoredDtype::kFp32) return H5::FloatType(H5::PredType::IEEE_F32LE);
  const FloatLayout& l = layout_of(dtype);
  H5::FloatType t;
  t.copy(H5::PredType::IEEE_F32LE);  // shrink in this order: fields, offset, precision, size
  t.setFields(l.spos, l.epos, l.esize, l.mpos, l.msize);
  t.setOffset(0);
  t.setPrecision(16);
  t.setSize(l.size);
  t.setEbias(l.ebias);
  return t;
}

std::optional<StoredDtype> stored_dtype_of(const H5::DataType& type) {
  if (type.getClass() != H5T_FLOAT) return std::nullopt;
  const FloatLayout l = layout_of(H5::FloatType(type.getId()));
  for (StoredDtype d : {StoredDtype::kFp16, StoredDtype::kBf16, StoredDtype::kFp32})
    if (l == layout_of(d)) return d;
  return std::nullopt;
}

std::string describe(const H5::DataType& type) {
  switch (type.getClass()) {
    case H5T_FLOAT: {
      if (const auto d = stored_dtype_of(type)) return to_string(*d);
      const FloatLayout l = layout_of(H5::FloatType(type.getId()));
      if (l.size == 8) return "float64";
      return fmt::format("float ({} bytes, sign bit {}, exponent {}@{} bias {}, mantissa {}@{})", l.size, l.spos,
                         l.esize, l.epos, l.ebias, l.msize, l.mpos);
    }
    case H5T_INTEGER: return fmt::format("int{}", 8 * type.getSize());
    case H5T_STRING: return "string";
    case H5T_ENUM: return "enum";
    case H5T_COMPOUND: return "compound";
    default: return fmt::format("HDF5 type class {}", static_cast<int>(type.getClass()));
  }
}

std::vector<float> read_as_float(const H5::DataSet& dataset, StoredDtype dtype, const H5::DataSpace& mem_space,
                                 const H5::DataSpace& file_space, size_t count) {
  std::vector<float> out(count);
  if (count == 0) return out;
  const H5::FloatType mem = little_endian(dataset.getDataType());
  if (dtype == StoredDtype::kFp32) {
    dataset.read(out.data(), mem, mem_space, file_space);
    return out;
  }
  std::vector<uint16_t> raw(count);
  dataset.read(raw.data(), mem, mem_space, file_space);
  const bool half = dtype == StoredDtype::kFp16;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i)
    out[i] = half ? fp16_bits_to_fp32(raw[i]) : bf16_bits_to_fp32(raw[i]);
  return out;
}

int64_t write_from_float(const H5::DataSet& dataset, StoredDtype dtype, const std::vector<float>& values) {
  if (values.empty()) return -1;
  const H5::FloatType type = file_type(dtype);
  if (dtype == StoredDtype::kFp32) {
    dataset.write(values.data(), type);
    return -1;
  }
  std::vector<uint16_t> raw(values.size());
  const bool half = dtype == StoredDtype::kFp16;
  const uint16_t exponent = half ? 0x7c00 : 0x7f80;  // all ones: infinity or NaN
  const int64_t n = static_cast<int64_t>(values.size());
  int64_t first_overflow = n;
#pragma omp parallel for schedule(static) reduction(min : first_overflow)
  for (int64_t i = 0; i < n; ++i) {
    raw[i] = half ? fp32_to_fp16_bits(values[i]) : fp32_to_bf16_bits(values[i]);
    if ((raw[i] & exponent) == exponent && std::isfinite(values[i])) first_overflow = std::min(first_overflow, i);
  }
  dataset.write(raw.data(), type);
  return first_overflow < n ? first_overflow : -1;
}

}  // namespace kvq::h5
