#include "python/gpu_tensors.hpp"

#include <fmt/format.h>

#include <vector>

#include "gpu/cuda_check.hpp"
#include "quant/errors.hpp"

namespace kvq::py {

std::string shape_of(const Tensor& t) { return shape_string(AnyArray(t)); }
std::string strides_of(const Tensor& t) {
  std::vector<int64_t> strides;
  for (size_t i = 0; i < t.ndim(); ++i) strides.push_back(t.stride(i));
  return fmt::format("[{}]", fmt::join(strides, ", "));
}

void require(const Tensor& t, const std::string& what, std::initializer_list<nb::dlpack::dtype> dtypes, int rank) {
  if (t.device_type() != nb::device::cuda::value)
    throw InputError(fmt::format("{}: expected a CUDA tensor, got one on device type {} (move it with .cuda())", what,
                                 t.device_type()));
  int device = 0;
  KVQ_CUDA_CHECK(cudaGetDevice(&device));
  if (t.device_id() != device)
    throw InputError(fmt::format("{}: on CUDA device {}, but the current device is {} (torch.cuda.set_device)", what,
                                 t.device_id(), device));
  bool ok = false;
  std::vector<std::string> names;
  for (auto d : dtypes) ok |= t.dtype() == d, names.push_back(dtype_name(d));
  if (!ok)
    throw InputError(fmt::format("{}: dtype {}, expected {}", what, dtype_name(t.dtype()), fmt::join(names, " or ")));
  if (rank >= 0 && static_cast<int>(t.ndim()) != rank)
    throw InputError(fmt::format("{}: rank {} (shape {}), expected rank {}", what, t.ndim(), shape_of(t), rank));
  if (t.ndim() && t.size() > 0 && t.shape(t.ndim() - 1) > 1 && t.stride(t.ndim() - 1) != 1)  // (empty: any strides)
    throw InputError(fmt::format("{}: the last axis must be contiguous (stride {}; call .contiguous())", what,
                                 t.stride(t.ndim() - 1)));
}

bool contiguous(const Tensor& t) {
  if (t.size() == 0) return true;
  int64_t want = 1;
  for (size_t i = t.ndim(); i-- > 0;) {
    if (t.shape(i) != 1 && t.stride(i) != want) return false;
    want *= static_cast<int64_t>(t.shape(i));
  }
  return true;
}

void require_buffer(const Tensor& t, const std::string& what, int64_t bytes) {
  require(t, what, {dt::kUint8, dt::kInt8, dt::kFp16, dt::kFp32, dt::kBf16}, -1);
  if (!contiguous(t)) throw InputError(fmt::format("{}: must be contiguous", what));
  if (static_cast<int64_t>(t.nbytes()) != bytes)
    throw InputError(fmt::format("{}: {} bytes (shape {}, {}), expected {}", what, t.nbytes(), shape_of(t),
                                 dtype_name(t.dtype()), bytes));
}

int64_t paged_params(const Tensor& t, const std::string& what, int64_t pages, int64_t page_bytes) {
  require(t, what, {dt::kUint8, dt::kInt8, dt::kFp16, dt::kFp32, dt::kBf16}, -1);
  if (contiguous(t) && static_cast<int64_t>(t.nbytes()) == pages * page_bytes) return page_bytes;
  const int64_t item = static_cast<int64_t>(t.itemsize());
  if (t.ndim() < 1 || static_cast<int64_t>(t.shape(0)) != pages || static_cast<int64_t>(t.nbytes()) != pages * page_bytes)
    throw InputError(fmt::format("{}: shape {} ({}, {} bytes), expected [pages = {}, ...] of {} bytes a page", what,
                                 shape_of(t), dtype_name(t.dtype()), t.nbytes(), pages, page_bytes));
  int64_t want = 1;
  for (size_t i = t.ndim(); i-- > 1;) {
    if (t.shape(i) != 1 && t.stride(i) != want)
      throw InputError(fmt::format("{}: a page's parameters must be contiguous (shape {}, strides {} elements)", what,
                                   shape_of(t), strides_of(t)));
    want *= static_cast<int64_t>(t.shape(i));
  }
  if (pages < 2) return page_bytes;
  const int64_t stride = static_cast<int64_t>(t.stride(0)) * item;
  if (stride < page_bytes)
    throw InputError(fmt::format("{}: pages {} bytes apart overlap their {} bytes of parameters", what, stride, page_bytes));
  return stride;
}

void check_dim(const Tensor& t, const std::string& what, size_t axis, int64_t want, const char* name) {
  if (static_cast<int64_t>(t.shape(axis)) != want)
    throw InputError(fmt::format("{}: shape {}, expected {} = {} on axis {}", what, shape_of(t), name, want, axis));
}

const int32_t* table_of(nb::object t_obj, const char* what, int64_t batch, int64_t entries) {
  const Tensor t = nb::cast<Tensor>(t_obj);
  require(t, what, {dt::kInt32}, 2);
  check_dim(t, what, 0, batch, "B");
  if (entries >= 0) check_dim(t, what, 1, entries, "entries (block_table's)");
  if (!contiguous(t)) throw InputError(fmt::format("{}: must be contiguous [B, pages per sequence]", what));
  return static_cast<const int32_t*>(t.data());
}

}  // namespace kvq::py
