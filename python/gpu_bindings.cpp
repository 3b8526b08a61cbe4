// kvq._gpu: kvq's GPU quantize and decode kernels on the caller's CUDA tensors (torch, CuPy, JAX:
// anything with DLPack), in place, on the caller's stream. The variants, storages and messages are
// those of the `kvq` tools (gpu/registry.hpp). Writing caches: gpu_cache_bindings.cpp; reading them:
// gpu_decode_bindings.cpp; the tensors' checks: gpu_tensors.hpp. The Python side (kvq/gpu.py)
// allocates the outputs and names the stream.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <fmt/format.h>

#include "gpu/device.hpp"
#include "gpu/registry.hpp"
#include "python/errors.hpp"
#include "python/gpu_bindings.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvq::py {
namespace {

nb::list variants() {
  nb::list r;
  for (const auto& v : quantize_variants()) {
    nb::dict d;
    d["kind"] = "quantize", d["name"] = v.name, d["summary"] = v.summary, d["supports"] = v.supports;
    d["incumbent"] = v.incumbent;
    r.append(d);
  }
  for (const auto& v : decode_variants()) {
    nb::dict d;
    d["kind"] = "decode", d["name"] = v.name, d["summary"] = v.summary, d["supports"] = v.supports;
    d["incumbent"] = v.incumbent;
    r.append(d);
  }
  return r;
}

nb::dict device() {
  require_device();
  const DeviceInfo i = device_info();
  nb::dict d;
  d["name"] = i.name, d["sm_count"] = i.sm_count, d["compute_capability"] = fmt::format("{}.{}", i.cc_major, i.cc_minor);
  d["driver"] = i.driver_string(), d["runtime"] = i.runtime_string();
  return d;
}

// The same exception classes as kvq._core, so `except kvq.InputError` catches both modules' errors.
void bind_errors() {
  nb::module_ core = nb::module_::import_("kvq._core");
  translate_kvq_errors(core.attr("Error").inc_ref().ptr(), core.attr("InputError").inc_ref().ptr(),
                       core.attr("SchemeError").inc_ref().ptr());
}

}  // namespace
}  // namespace kvq::py

NB_MODULE(_gpu, m) {
  m.doc() = "kvq's GPU quantize and decode kernels on CUDA tensors (DLPack), in place; kvq/gpu.py is the interface";
  kvq::py::bind_errors();
  m.def("available", &kvq::cuda_device_available);
  m.def("device", &kvq::py::device);
  m.def("variants", &kvq::py::variants);
  m.def("decode_support", &kvq::py::decode_support, "variant"_a, "k"_a, "v"_a, "layout"_a, "head_dim"_a,
        "page_tokens"_a = 16);
  m.def("quantized_sizes", &kvq::py::sizes_of, "scheme"_a, "batch"_a, "heads"_a, "tokens"_a, "head_dim"_a, "layout"_a);
  m.def("quantize", &kvq::py::quantize_py, "x"_a, "scheme"_a, "codes"_a, "scales"_a.none(), "zeros"_a.none(),
        "tensor_scale_out"_a.none(), "tensor_scale"_a.none(), "layout"_a, "variant"_a, "seq_lens"_a, "stream"_a, "scratch"_a,
        "status"_a.none() = nb::none());
  m.def("append_rows", &kvq::py::append_rows_py, "src_codes"_a, "dst_codes"_a, "src_scales"_a.none(), "dst_scales"_a.none(),
        "src_zeros"_a.none(), "dst_zeros"_a.none(), "positions"_a, "block_table"_a.none(), "page_tokens"_a,
        "param_heads"_a, "status"_a, "check"_a, "stream"_a);
  m.def("flush_channel_groups", &kvq::py::flush_channel_groups_py, "x"_a, "storage"_a, "codes"_a, "scales"_a,
        "zeros"_a.none(), "window"_a, "positions"_a, "block_table"_a.none(), "window_table"_a.none(), "page_tokens"_a,
        "status"_a, "stream"_a);
  m.def("dequantize", &kvq::py::dequantize_py, "codes"_a, "scheme"_a, "head_dim"_a, "scales"_a.none(), "zeros"_a.none(),
        "tensor_scale"_a.none(), "out"_a, "stream"_a);
  m.def("decode", &kvq::py::decode_py, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "seq_lens"_a.none(), "alibi_slopes"_a.none(),
        "softmax_scale"_a, "variant"_a, "splits"_a, "stream"_a, "block_table"_a.none() = nb::none(),
        "window_table"_a.none() = nb::none());
}
