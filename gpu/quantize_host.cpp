#include <fmt/format.h>

#include <algorithm>

#include "gpu/quantize.hpp"
#include "quant/fbgemm_layout.hpp"
#include "quant/quantize.hpp"

namespace kvq {

const char* to_string(InputDtype d) {
  switch (d) {
    case InputDtype::kFp32: return "float32";
    case InputDtype::kFp16: return "float16";
    case InputDtype::kBf16: return "bfloat16";
  }
  return "?";
}

const char* to_string(CodeLayout l) { return l == CodeLayout::kPlanar ? "planar" : "fbgemm"; }

int element_bytes(InputDtype d) { return d == InputDtype::kFp32 ? 4 : 2; }

QuantizedSizes quantized_sizes(const Scheme& s, const KvShape& shape, CodeLayout layout) {
  if (layout == CodeLayout::kFbgemm) return {shape.rows() * fbgemm_row_bytes(s, shape.head_dim), 0, 0};
  const int64_t groups = num_groups(s, shape);
  return {shape.rows() * code_bytes_per_row(s, shape.head_dim), groups * s.scale_bytes(),
          s.asymmetric ? groups * s.scale_bytes() : 0, s.format == CodeFormat::kNvfp4 ? 4 : 0};
}

namespace {

float element_on_device(const DeviceKv& in, int64_t b, int64_t h, int64_t t, int64_t d) {
  const int64_t offset = b * in.stride_b + h * in.stride_h + t * in.stride_t + d;
  const char* src = static_cast<const char*>(in.data) + offset * element_bytes(in.dtype);
  if (in.dtype == InputDtype::kFp32) {
    float v;
    KVQ_CUDA_CHECK(cudaMemcpy(&v, src, 4, cudaMemcpyDeviceToHost));
    return v;
  }
  uint16_t bits;
  KVQ_CUDA_CHECK(cudaMemcpy(&bits, src, 2, cudaMemcpyDeviceToHost));
  return in.dtype == InputDtype::kFp16 ? fp16_bits_to_fp32(bits) : bf16_bits_to_fp32(bits);
}

}  // namespace

QuantizeWorkspace::QuantizeWorkspace(const DeviceKv& input, const Scheme& scheme, CodeLayout layout,
                                     const std::vector<int32_t>& seq_lens, const QuantizeOutputs* outputs,
                                     std::optional<float> tensor_scale)
    : input_(input), external_outputs_(outputs != nullptr) {
  require_device();
  const bool nvfp4 = scheme.format == CodeFormat::kNvfp4;
  if (tensor_scale && !nvfp4)  // the CPU quantizer's check and message (quant/quantize.cpp)
    throw InputError(fmt::format("{}: a tensor scale is given, but only nvfp4 takes one", to_string(scheme)));
  check_scheme_fits(scheme, static_cast<int>(input.shape.head_dim));
  if (scheme.block_format() && layout != CodeLayout::kPlanar)
    throw SchemeError(fmt::format("{}: the block formats are quantized into kvq's planar layout (ggml's inline blocks: "
                                  "kvq.to_ggml_blocks on the CPU)", to_string(scheme)));
  if (nvfp4 && outputs && !outputs->tensor_scale)
    throw InputError(fmt::format("{}: the outputs need the tensor scale (one float32)", to_string(scheme)));
  const KvShape& s = input.shape;
  if (!seq_lens.empty() && static_cast<int64_t>(seq_lens.size()) != s.batch)
    throw InputError(fmt::format("quantize: {} seq_lens for a batch of {}", seq_lens.size(), s.batch));
  window_boundaries(scheme, s, seq_lens.empty() ? nullptr : seq_lens.data());  // the CPU's checks and message
  if (scheme.has_window() && !seq_lens.empty()) seq_lens_ = DeviceBuffer<int32_t>(seq_lens);
  if (scheme.hadamard) rotated_ = DeviceBuffer<float>(s.numel());
  const QuantizedSizes out = quantized_sizes(scheme, s, layout), planar = quantized_sizes(scheme, s, CodeLayout::kPlanar);
  const bool planar_outputs = outputs && layout == CodeLayout::kPlanar;
  codes_ = DeviceBuffer<uint8_t>(outputs ? 0 : out.codes);
  scales_ = DeviceBuffer<uint8_t>(planar_outputs ? 0 : planar.scales);  // FBGEMM: workspace of the generic variant
  zeros_ = DeviceBuffer<uint8_t>(planar_outputs ? 0 : planar.zeros);
  scratch_ = DeviceBuffer<uint8_t>(layout == CodeLayout::kFbgemm ? planar.codes : 0);
  stats_ = DeviceBuffer<GroupStats>(std::max<int64_t>(num_groups(scheme, s), 1));  // scale-free FP8: the finiteness pass
  partials_ = DeviceBuffer<GroupStats>(kMaxPartials);
  flags_ = DeviceBuffer<unsigned long long>(2);
  tensor_scale_ = DeviceBuffer<uint8_t>(nvfp4 && !outputs ? 4 : 0);
  params_.scheme = scheme;
  params_.shape = s;
  params_.input = input.data;
  params_.in_dtype = input.dtype;
  params_.stride_b = input.stride_b, params_.stride_h = input.stride_h, params_.stride_t = input.stride_t;
  params_.layout = layout;
  params_.codes = outputs ? outputs->codes : codes_.data();
  params_.scales = planar_outputs ? outputs->scales : scales_.data();
  params_.zeros = planar_outputs ? outputs->zeros : zeros_.data();
  params_.stats = stats_.data();
  params_.partials = partials_.data();
  params_.scratch = scratch_.data();
  params_.seq_lens = seq_lens_.size() ? seq_lens_.data() : nullptr;
  params_.rotated = rotated_.size() ? rotated_.data() : nullptr;
  params_.first_bad = flags_.data();
  params_.first_overflow = flags_.data() + 1;
  if (nvfp4) {
    params_.tensor_scale = outputs ? outputs->tensor_scale : reinterpret_cast<float*>(tensor_scale_.data());
    params_.tensor_scale_given = tensor_scale.has_value();
    params_.given_tensor_scale = tensor_scale.value_or(0.0f);
  }
  reset();
}

void QuantizeWorkspace::reset() {
  codes_.fill_bytes(0xa5);
  scales_.fill_bytes(0xa5);
  zeros_.fill_bytes(0xa5);
  tensor_scale_.fill_bytes(0xa5);
  flags_.fill_bytes(0xff);
}

void QuantizeWorkspace::check_flags(const std::string& tensor_name, cudaStream_t stream) {
  KVQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<unsigned long long> f = flags_.download();
  const KvShape& s = params_.shape;
  if (f[0] != ~0ull) {
    const int64_t i = static_cast<int64_t>(f[0]), d = i % s.head_dim, r = i / s.head_dim;
    const int64_t t = r % s.tokens, h = (r / s.tokens) % s.heads, b = r / (s.tokens * s.heads);
    throw InputError(non_finite_message(tensor_name, element_on_device(input_, b, h, t, d), b, h, t, d));
  }
  const float ts = params_.given_tensor_scale;  // checked after the input, as the CPU quantizer does
  if (params_.tensor_scale_given && !(is_finite_float(ts) && ts >= 0.0f))
    throw InputError(fmt::format("{}: nvfp4 tensor scale {} must be finite and >= 0", tensor_name, ts));
  if (f[1] != ~0ull) {
    const int64_t g = static_cast<int64_t>(f[1]);
    launch_group_stats(statistics_view(params_), g, g + 1, stream);  // the group's min and max, for the message
    KVQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    GroupStats st;
    KVQ_CUDA_CHECK(cudaMemcpy(&st, stats_.data() + g, sizeof st, cudaMemcpyDeviceToHost));
    throw InputError(overflow_message(tensor_name, params_.scheme, g, group_box(params_.scheme, s, g), st));
  }
}

GpuQuantized QuantizeWorkspace::download() const {
  if (external_outputs_) throw Error("QuantizeWorkspace::download: the outputs are the caller's");
  GpuQuantized out{codes_.download(), {}, {}, tensor_scale_.download()};
  if (params_.layout == CodeLayout::kPlanar) {
    out.scales = scales_.download();
    out.zeros = zeros_.download();
  }
  return out;
}

int64_t QuantizeWorkspace::bytes_moved() const {
  const QuantizedSizes out = quantized_sizes(params_.scheme, params_.shape, params_.layout);
  return params_.shape.numel() * element_bytes(input_.dtype) + out.codes + out.scales + out.zeros + out.tensor_scale;
}

QuantizeParams statistics_view(const QuantizeParams& p) {
  if (!p.scheme.hadamard) return p;
  QuantizeParams r = p;
  r.input = p.rotated, r.in_dtype = InputDtype::kFp32;
  r.stride_b = p.shape.heads * p.shape.tokens * p.shape.head_dim, r.stride_h = p.shape.tokens * p.shape.head_dim;
  r.stride_t = p.shape.head_dim;
  return r;
}

GpuQuantized run_quantize(void (*launch)(const QuantizeParams&, cudaStream_t), const DeviceKv& input,
                          const Scheme& scheme, CodeLayout layout, const std::string& tensor_name, cudaStream_t stream,
                          const std::vector<int32_t>& seq_lens, std::optional<float> tensor_scale) {
  QuantizeWorkspace ws(input, scheme, layout, seq_lens, nullptr, tensor_scale);
  launch(ws.params(), stream);
  ws.check_flags(tensor_name, stream);
  return ws.download();
}

}  // namespace kvq
