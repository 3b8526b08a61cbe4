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

// The temporaries of one quantize call, carved from one block: byte offsets, each 256-aligned.
struct ScratchLayout {
  int64_t flags = 0, stats = 0, partials = 0, rotated = 0, planar_codes = 0, planar_scales = 0, planar_zeros = 0;
  int64_t bytes = 0;
  ScratchLayout(const Scheme& s, const KvShape& shape, CodeLayout layout) {
    auto take = [this](int64_t n) {
      const int64_t at = bytes;
      bytes += (n + 255) / 256 * 256;
      return at;
    };
    const QuantizedSizes planar = quantized_sizes(s, shape, CodeLayout::kPlanar);
    const bool fbgemm = layout == CodeLayout::kFbgemm;  // staged planar, then converted to rows
    flags = take(2 * sizeof(unsigned long long));
    stats = take(std::max<int64_t>(num_groups(s, shape), 1) * sizeof(GroupStats));  // scale-free FP8: finiteness
    partials = take(kMaxPartials * sizeof(GroupStats));
    rotated = take(s.hadamard ? shape.numel() * 4 : 0);
    planar_codes = take(fbgemm ? planar.codes : 0);
    planar_scales = take(fbgemm ? planar.scales : 0);
    planar_zeros = take(fbgemm ? planar.zeros : 0);
  }
};

}  // namespace

int64_t quantize_scratch_bytes(const Scheme& s, const KvShape& shape, CodeLayout layout) {
  return ScratchLayout(s, shape, layout).bytes;
}

QuantizeWorkspace::QuantizeWorkspace(const DeviceKv& input, const Scheme& scheme, CodeLayout layout,
                                     const std::vector<int32_t>& seq_lens, const QuantizeOutputs* outputs,
                                     std::optional<float> tensor_scale, const QuantizeScratch* scratch)
    : input_(input), external_outputs_(outputs != nullptr), external_status_(scratch && scratch->status),
      stream_(scratch ? scratch->stream : nullptr) {
  require_device();
  const bool nvfp4 = scheme.format == CodeFormat::kNvfp4;
  if (tensor_scale) check_tensor_scale_taken(scheme);  // the CPU quantizer's check and message
  check_scheme_fits(scheme, static_cast<int>(input.shape.head_dim));
  if (scheme.block_format() && layout != CodeLayout::kPlanar)
    throw SchemeError(fmt::format("{}: the block formats are quantized into kvq's planar layout (ggml's inline blocks: "
                                  "kvq.to_ggml_blocks on the CPU)", to_string(scheme)));
  if (nvfp4 && outputs && !outputs->tensor_scale)
    throw InputError(fmt::format("{}: the outputs need the tensor scale (one float32)", to_string(scheme)));
  if (scratch && !scratch->data) throw InputError("quantize: the caller's scratch has no memory");
  const KvShape& s = input.shape;
  if (!seq_lens.empty() && static_cast<int64_t>(seq_lens.size()) != s.batch)
    throw InputError(fmt::format("quantize: {} seq_lens for a batch of {}", seq_lens.size(), s.batch));
  window_boundaries(scheme, s, seq_lens.empty() ? nullptr : seq_lens.data());  // the CPU's checks and message
  if (scheme.has_window() && !seq_lens.empty()) seq_lens_ = DeviceBuffer<int32_t>(seq_lens);
  const ScratchLayout at(scheme, s, layout);
  if (!scratch) own_scratch_ = DeviceBuffer<uint8_t>(at.bytes);
  uint8_t* base = scratch ? static_cast<uint8_t*>(scratch->data) : own_scratch_.data();
  auto in_scratch = [base](int64_t offset) { return base + offset; };
  const QuantizedSizes out = quantized_sizes(scheme, s, layout);
  const bool planar = layout == CodeLayout::kPlanar;
  codes_ = DeviceBuffer<uint8_t>(outputs ? 0 : out.codes);
  scales_ = DeviceBuffer<uint8_t>(outputs || !planar ? 0 : out.scales);
  zeros_ = DeviceBuffer<uint8_t>(outputs || !planar ? 0 : out.zeros);
  tensor_scale_ = DeviceBuffer<uint8_t>(nvfp4 && !outputs ? 4 : 0);
  flags_ = reinterpret_cast<unsigned long long*>(in_scratch(at.flags));
  params_.scheme = scheme;
  params_.shape = s;
  params_.input = input.data;
  params_.in_dtype = input.dtype;
  params_.stride_b = input.stride_b, params_.stride_h = input.stride_h, params_.stride_t = input.stride_t;
  params_.layout = layout;
  params_.codes = outputs ? outputs->codes : codes_.data();
  params_.scales = !planar ? in_scratch(at.planar_scales) : outputs ? outputs->scales : scales_.data();
  params_.zeros = !planar ? in_scratch(at.planar_zeros) : outputs ? outputs->zeros : zeros_.data();
  params_.stats = reinterpret_cast<GroupStats*>(in_scratch(at.stats));
  params_.partials = reinterpret_cast<GroupStats*>(in_scratch(at.partials));
  params_.scratch = planar ? nullptr : in_scratch(at.planar_codes);
  params_.seq_lens = seq_lens_.size() ? seq_lens_.data() : nullptr;
  params_.rotated = scheme.hadamard ? reinterpret_cast<float*>(in_scratch(at.rotated)) : nullptr;
  unsigned long long* flags = external_status_ ? scratch->status : flags_;
  params_.first_bad = flags;
  params_.first_overflow = flags + 1;
  if (nvfp4) params_.tensor_scale = outputs ? outputs->tensor_scale : reinterpret_cast<float*>(tensor_scale_.data());
  params_.tensor_scale_given = tensor_scale.has_value();
  params_.given_tensor_scale = tensor_scale.value_or(0.0f);
  reset();
}

void QuantizeWorkspace::reset() {
  codes_.fill_bytes(0xa5);
  scales_.fill_bytes(0xa5);
  zeros_.fill_bytes(0xa5);
  tensor_scale_.fill_bytes(0xa5);
  // The caller's status flags are theirs to clear (and the workspace's own go unread then). In the
  // caller's scratch the clear goes on the launch's stream, where a capture records it.
  if (external_status_) return;
  const size_t bytes = 2 * sizeof(unsigned long long);
  if (own_scratch_.size()) KVQ_CUDA_CHECK(cudaMemset(flags_, 0xff, bytes));
  else KVQ_CUDA_CHECK(cudaMemsetAsync(flags_, 0xff, bytes, stream_));
}

void QuantizeWorkspace::check_tensor_scale(const std::string& tensor_name) const {
  if (params_.tensor_scale_given) check_given_tensor_scale(params_.scheme, params_.given_tensor_scale, tensor_name);
}

void QuantizeWorkspace::check_flags(const std::string& tensor_name, cudaStream_t stream) {
  if (external_status_) return check_tensor_scale(tensor_name);
  KVQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  unsigned long long f[2];
  KVQ_CUDA_CHECK(cudaMemcpy(f, flags_, sizeof f, cudaMemcpyDeviceToHost));
  const KvShape& s = params_.shape;
  if (f[0] != ~0ull) {
    const int64_t i = static_cast<int64_t>(f[0]), d = i % s.head_dim, r = i / s.head_dim;
    const int64_t t = r % s.tokens, h = (r / s.tokens) % s.heads, b = r / (s.tokens * s.heads);
    throw InputError(non_finite_message(tensor_name, element_on_device(input_, b, h, t, d), b, h, t, d));
  }
  check_tensor_scale(tensor_name);  // after the input, as the CPU quantizer does
  if (f[1] != ~0ull) {
    const int64_t g = static_cast<int64_t>(f[1]);
    launch_group_stats(statistics_view(params_), g, g + 1, stream);  // the group's min and max, for the message
    KVQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    GroupStats st;
    KVQ_CUDA_CHECK(cudaMemcpy(&st, params_.stats + g, sizeof st, cudaMemcpyDeviceToHost));
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
