// kvq._gpu, writing caches: quantize a tensor into codes and parameters, dequantize them, the sizes
// of those buffers, and append new tokens' rows (or chan-tN groups) into contiguous or paged caches.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <fmt/format.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/append.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/quantize.hpp"
#include "gpu/registry.hpp"
#include "python/gpu_bindings.hpp"
#include "quant/errors.hpp"
#include "quant/fbgemm_layout.hpp"

namespace kvq::py {
namespace {

const QuantizeVariant& quantize_variant_for(const std::string& name, const Scheme& s, int64_t head_dim,
                                            CodeLayout layout, InputDtype dtype) {
  if (!name.empty()) {
    for (const auto& v : quantize_variants())
      if (v.name == name) {
        if (!v.accepts(s, head_dim, layout, dtype))
          throw InputError(fmt::format("quantize variant {} does not take {} at D = {} ({} layout); it supports: {}", name,
                                       to_string(s), head_dim, to_string(layout), v.supports));
        return v;
      }
    throw InputError(fmt::format("no quantize variant named '{}' (kvq.gpu.variants())", name));
  }
  for (const auto& v : quantize_variants())  // the specialised variants first: all are bit-exact
    if (!v.incumbent && v.accepts(s, head_dim, layout, dtype)) return v;
  return incumbent_quantize_variant();
}

// The device pointers of a planar scheme's scales, zero points and nvfp4 tensor scale: each checked
// to be a buffer of `sizes`' bytes where the scheme has it (else left nullptr, the object ignored).
std::tuple<void*, void*, void*> param_buffers(const Scheme& s, const QuantizedSizes& sizes, nb::object scales,
                                              nb::object zeros, nb::object tensor_scale) {
  void* ptrs[3] = {nullptr, nullptr, nullptr};
  int i = 0;
  for (auto [obj, bytes, what] : {std::tuple{scales, sizes.scales, "scales"}, std::tuple{zeros, sizes.zeros, "zero_points"},
                                  std::tuple{tensor_scale, sizes.tensor_scale, "tensor_scale"}}) {
    void*& ptr = ptrs[i++];
    if (bytes == 0) continue;
    if (obj.is_none()) throw InputError(fmt::format("{} needs {} ({} bytes)", to_string(s), what, bytes));
    const Tensor t = nb::cast<Tensor>(obj);
    require_buffer(t, what, bytes);
    ptr = t.data();
  }
  return {ptrs[0], ptrs[1], ptrs[2]};
}

}  // namespace

// x: [B, H, T, D] (any strides but D's); outputs sized by quantized_sizes (nvfp4: tensor_scale_out, one
// float32, written by the launch: `tensor_scale` when given, else amax / 2688); scratch: its "scratch"
// bytes. status (int64 [3], ~0 where no error yet; quantize records into entries 0 and 1): the error
// flags the caller keeps and reads later (nothing waits on the device: the call can be captured in a
// CUDA graph); without it, non-finite input or an overflowing scale throws here. Returns the variant
// used.
std::string quantize_py(const Tensor& x, const std::string& scheme_name, const Tensor& codes, nb::object scales,
                     nb::object zeros, nb::object tensor_scale_out, std::optional<float> tensor_scale,
                     const std::string& layout_name, const std::string& variant, const std::vector<int32_t>& seq_lens,
                     uintptr_t stream, const Tensor& scratch, nb::object status) {
  require(x, "x", {dt::kFp32, dt::kFp16, dt::kBf16}, 4);
  const Scheme s = parse_scheme(scheme_name);
  if (layout_name != "planar" && layout_name != "fbgemm")
    throw InputError(fmt::format("layout '{}': expected planar or fbgemm", layout_name));
  const CodeLayout layout = layout_name == "fbgemm" ? CodeLayout::kFbgemm : CodeLayout::kPlanar;
  const InputDtype in = x.dtype() == dt::kFp32 ? InputDtype::kFp32 : x.dtype() == dt::kFp16 ? InputDtype::kFp16
                                                                                              : InputDtype::kBf16;
  const KvShape shape{static_cast<int64_t>(x.shape(0)), static_cast<int64_t>(x.shape(1)),
                      static_cast<int64_t>(x.shape(2)), static_cast<int64_t>(x.shape(3))};
  const QuantizedSizes sizes = quantized_sizes(s, shape, layout);
  QuantizeOutputs out;
  require_buffer(codes, layout == CodeLayout::kFbgemm ? "rows" : "codes", sizes.codes);
  out.codes = static_cast<uint8_t*>(codes.data());
  if (layout == CodeLayout::kPlanar) {
    void* tensor_scale_ptr = nullptr;
    std::tie(out.scales, out.zeros, tensor_scale_ptr) = param_buffers(s, sizes, scales, zeros, tensor_scale_out);
    out.tensor_scale = static_cast<float*>(tensor_scale_ptr);
  }
  const QuantizeVariant& v = quantize_variant_for(variant, s, shape.head_dim, layout, in);
  const DeviceKv input{x.data(), in, shape, x.stride(0), x.stride(1), x.stride(2)};
  QuantizeScratch temporaries{scratch.data(), to_stream(stream), nullptr};
  require_buffer(scratch, "scratch", quantize_scratch_bytes(s, shape, layout));
  if (!status.is_none()) {
    const Tensor flags = nb::cast<Tensor>(status);
    require(flags, "status", {dt::kInt64}, 1);
    check_dim(flags, "status", 0, 3, "3 flags");
    temporaries.status = static_cast<unsigned long long*>(flags.data());
  }
  QuantizeWorkspace ws(input, s, layout, seq_lens, &out, tensor_scale, &temporaries);
  v.launch(ws.params(), to_stream(stream));
  KVQ_CHECK_LAUNCH();
  ws.check_flags("x", to_stream(stream));
  return v.name;
}

// Writes the rows of a quantized chunk (src: codes [B, H, t, row], scales / zero points [B, H', t, X] in
// group order, H' = param_heads) into a cache (dst) at slots positions[b] + i: a planar cache (codes
// [B, H, T, row], parameters [B, H', T, X]) or, with block_table, a paged one (codes [pages, P, H, row]
// through its strides, parameters [pages, H', P, X]). status (int64 [3]): rows whose slot or page lies
// outside the cache are not written; the first is recorded in status[2]. check: wait for the launch
// and throw if it recorded one (else the caller reads status when it chooses).
void append_rows_py(const Tensor& src_codes, const Tensor& dst_codes, nb::object src_scales, nb::object dst_scales,
                    nb::object src_zeros, nb::object dst_zeros, const Tensor& positions, nb::object block_table,
                    int page_tokens, int param_heads, const Tensor& status, bool check, uintptr_t stream) {
  require(src_codes, "new codes", {dt::kUint8, dt::kBf16, dt::kFp16}, 4);
  require(dst_codes, "cache codes", {dt::kUint8, dt::kBf16, dt::kFp16}, 4);
  if (src_codes.dtype() != dst_codes.dtype() || !contiguous(src_codes))
    throw InputError("append: the new codes must be contiguous and of the cache's dtype");
  const bool paged = !block_table.is_none();
  const int64_t B = src_codes.shape(0), H = src_codes.shape(1), t = src_codes.shape(2), row = src_codes.shape(3);
  const int64_t item = src_codes.itemsize();
  // the cache's axes: planar (b, h, slot), paged (page, slot in page, h)
  const int ax_h = paged ? 2 : 1, ax_t = paged ? 1 : 2;
  check_dim(dst_codes, "cache codes", ax_h, H, "H");
  check_dim(dst_codes, "cache codes", 3, row, "the new rows' width");
  AppendParams p;
  p.batch = static_cast<int>(B), p.tokens = static_cast<int>(t);
  require(positions, "positions", {dt::kInt32}, 1);
  check_dim(positions, "positions", 0, B, "B");
  p.positions = static_cast<const int32_t*>(positions.data());
  if (paged) {
    check_dim(dst_codes, "cache codes", 1, page_tokens, "P");
    p.block_table = table_of(block_table, "block_table", B);
    p.table_stride = nb::cast<Tensor>(block_table).shape(1), p.pages = dst_codes.shape(0), p.page_tokens = page_tokens;
    p.capacity = p.table_stride * page_tokens;
  } else {
    check_dim(dst_codes, "cache codes", 0, B, "B");
    p.capacity = dst_codes.shape(2);
  }
  const int64_t slots = paged ? page_tokens : p.capacity, n0 = dst_codes.shape(0);
  AppendArray& codes = p.arrays[0];
  codes.src = static_cast<const uint8_t*>(src_codes.data()), codes.dst = static_cast<uint8_t*>(dst_codes.data());
  codes.heads = static_cast<int>(H), codes.row_bytes = static_cast<int>(row * item);
  (paged ? codes.stride_page : codes.stride_b) = dst_codes.stride(0) * item;
  codes.stride_h = dst_codes.stride(ax_h) * item, codes.stride_t = dst_codes.stride(ax_t) * item;
  int k = 1;
  for (auto [src_obj, dst_obj, what] : {std::tuple{src_scales, dst_scales, "scales"}, std::tuple{src_zeros, dst_zeros, "zero_points"}}) {
    AppendArray& a = p.arrays[k++];
    if (src_obj.is_none() != dst_obj.is_none())
      throw InputError(fmt::format("append: the new tokens and the cache disagree on having {}", what));
    if (src_obj.is_none()) continue;
    const Tensor src = nb::cast<Tensor>(src_obj), dst = nb::cast<Tensor>(dst_obj);
    // (a paged cache's pages of parameters may lie anywhere: paged_params)
    if (src.dtype() != dst.dtype() || !contiguous(src) || (!paged && !contiguous(dst)))
      throw InputError(fmt::format("append: {}: the new and the cache's must be contiguous, of one dtype", what));
    const int64_t per_row = static_cast<int64_t>(src.size()) / (B * param_heads * t);  // parameters per (b, h', token)
    if (per_row * B * param_heads * t != static_cast<int64_t>(src.size()) ||
        static_cast<int64_t>(dst.size()) != n0 * param_heads * slots * per_row)
      throw InputError(fmt::format("append: {}: {} new and {} cached values do not fit [{}, {}, {} / {}, X]", what,
                                   src.size(), dst.size(), B, param_heads, t, slots));
    const int64_t bytes = per_row * src.itemsize();
    a.src = static_cast<const uint8_t*>(src.data()), a.dst = static_cast<uint8_t*>(dst.data());
    a.heads = param_heads, a.row_bytes = static_cast<int>(bytes);
    if (paged)
      a.stride_page = paged_params(dst, fmt::format("append: cache {}", what), n0, param_heads * slots * bytes);
    else
      a.stride_b = param_heads * slots * bytes;
    a.stride_h = slots * bytes, a.stride_t = bytes;
  }
  require(status, "status", {dt::kInt64}, 1);
  check_dim(status, "status", 0, 3, "3 flags");
  p.out_of_range = static_cast<unsigned long long*>(status.data()) + 2;
  launch_append_rows(p, to_stream(stream));
  if (!check) return;
  unsigned long long first = 0;
  KVQ_CUDA_CHECK(cudaMemcpyAsync(&first, p.out_of_range, sizeof first, cudaMemcpyDeviceToHost, to_stream(stream)));
  KVQ_CUDA_CHECK(cudaStreamSynchronize(to_stream(stream)));
  if (first != ~0ull)  // kvq.gpu.check_status's message
    throw InputError(fmt::format("kvq.ops.append: an appended token's slot lies outside its cache (token {} of its call, "
                                 "counted b * t + i): a position past the capacity ({} slots), or a block table entry "
                                 "past the pool's pages; that token was not written", first, p.capacity));
}

// chan-t<N>[+wW] appends (after append_rows wrote the raw values into the window store `window`):
// quantizes each token group this call completes into codes, scales, zero points (launch_flush_channel_groups).
// Contiguous: codes [B, H, T, row], window [B, H, T, D] bf16, parameters [B, H, ceil(T / N), D]; paged
// (block_table and window_table): codes [pages, P, H, row], window [window pages, P, H, D], parameters
// [pages, H, P / N, D]. x: the call's new tokens, bf16 [B, H, t, D] contiguous.
void flush_channel_groups_py(const Tensor& x, const std::string& storage, const Tensor& codes, const Tensor& scales,
                             nb::object zeros, const Tensor& window, const Tensor& positions, nb::object block_table,
                             nb::object window_table, int page_tokens, const Tensor& status, uintptr_t stream) {
  const Scheme s = parse_scheme(storage);
  if (s.granularity != Granularity::kChannel || !s.has_window() || s.hadamard)
    throw InputError(fmt::format("flush_channel_groups: {}: expected a chan-t<N>+w<W> storage without +had", storage));
  require(x, "new tokens", {dt::kBf16}, 4);
  if (!contiguous(x)) throw InputError("flush_channel_groups: the new tokens must be contiguous bf16 [B, H, t, D]");
  const int64_t B = x.shape(0), H = x.shape(1), t = x.shape(2), D = x.shape(3), N = s.group;
  const bool paged = !block_table.is_none();
  if (paged == window_table.is_none())
    throw InputError("flush_channel_groups: a paged cache takes a block_table and a window_table, a contiguous one neither");
  require(codes, "cache codes", {dt::kUint8}, 4);
  require(window, "window", {dt::kBf16}, 4);
  require(positions, "positions", {dt::kInt32}, 1);
  check_dim(positions, "positions", 0, B, "B");
  const int ax_h = paged ? 2 : 1, ax_t = paged ? 1 : 2;
  const int64_t row = code_bytes_per_row(s, D);
  check_dim(codes, "cache codes", ax_h, H, "H"), check_dim(codes, "cache codes", 3, row, "row bytes");
  check_dim(window, "window", ax_h, H, "H"), check_dim(window, "window", 3, D, "D");
  ChannelFlushParams p;
  p.scheme = s, p.batch = static_cast<int>(B), p.heads = static_cast<int>(H), p.head_dim = static_cast<int>(D);
  p.tokens = static_cast<int>(t), p.x = static_cast<const uint16_t*>(x.data());
  p.positions = static_cast<const int32_t*>(positions.data());
  int64_t slots = 0;  // tokens per sequence (contiguous) or page
  if (paged) {
    if (page_tokens % N != 0)
      throw InputError(fmt::format("flush_channel_groups: {}: pages of {} tokens do not hold whole groups of {}", storage,
                                   page_tokens, N));
    check_dim(codes, "cache codes", 1, page_tokens, "P"), check_dim(window, "window", 1, page_tokens, "P");
    p.block_table = table_of(block_table, "block_table", B);
    const int64_t entries = nb::cast<Tensor>(block_table).shape(1);
    p.window_table = table_of(window_table, "window_table", B, entries);
    p.table_stride = entries, p.pages = codes.shape(0), p.window_pages = window.shape(0), p.page_tokens = page_tokens;
    p.capacity = entries * page_tokens, slots = page_tokens;
  } else {
    check_dim(codes, "cache codes", 0, B, "B"), check_dim(window, "window", 0, B, "B");
    check_dim(window, "window", 2, codes.shape(2), "T (the codes')");
    p.capacity = codes.shape(2), slots = p.capacity;
  }
  p.raw = static_cast<const uint16_t*>(window.data());
  (paged ? p.raw_strides.page : p.raw_strides.b) = window.stride(0);
  p.raw_strides.h = window.stride(ax_h), p.raw_strides.t = window.stride(ax_t);
  p.codes = static_cast<uint8_t*>(codes.data());
  (paged ? p.code_strides.page : p.code_strides.b) = codes.stride(0);
  p.code_strides.h = codes.stride(ax_h), p.code_strides.t = codes.stride(ax_t);
  // parameters: planar per channel, (ceil(slots / N)) groups of D per (b or page, h)
  const int64_t groups = (slots + N - 1) / N, n0 = codes.shape(0);
  const nb::dlpack::dtype param_dtype = s.scale_dtype == ScaleDtype::kFp32 ? dt::kFp32 : dt::kFp16;
  // Checks one parameter array; returns the elements from one page's (sequence's) parameters to the
  // next's: paged ones may lie anywhere (paged_params).
  auto stride_of = [&](const Tensor& a, const char* what) -> int64_t {
    require(a, what, {param_dtype}, -1);
    if (static_cast<int64_t>(a.size()) != n0 * H * groups * D || (!paged && !contiguous(a)))
      throw InputError(fmt::format("flush_channel_groups: {}: {} values, expected contiguous [{}, {}, {}, {}] ({})", what,
                                   a.size(), n0, H, groups, D, paged ? "pages, H, P / N, D" : "B, H, ceil(T / N), D"));
    if (!paged) return H * groups * D;
    const int64_t item = static_cast<int64_t>(a.itemsize());
    return paged_params(a, fmt::format("flush_channel_groups: {}", what), n0, H * groups * D * item) / item;
  };
  const int64_t page_stride = stride_of(scales, "scales");
  p.scales = scales.data();
  if (s.asymmetric != !zeros.is_none())
    throw InputError(fmt::format("flush_channel_groups: {}: zero points {}", storage, s.asymmetric ? "missing" : "given"));
  if (s.asymmetric) {
    const Tensor z = nb::cast<Tensor>(zeros);
    const int64_t zero_stride = stride_of(z, "zero_points");
    if (zero_stride != page_stride)
      throw InputError(fmt::format("flush_channel_groups: scales' pages {} and zero points' {} elements apart: one "
                                   "stride serves both", page_stride, zero_stride));
    p.zeros = z.data();
  }
  (paged ? p.param_strides.page : p.param_strides.b) = page_stride;
  p.param_strides.h = groups * D, p.param_strides.t = D;
  require(status, "status", {dt::kInt64}, 1);
  check_dim(status, "status", 0, 3, "3 flags");
  p.status = static_cast<unsigned long long*>(status.data());
  launch_flush_channel_groups(p, to_stream(stream));
}

nb::dict sizes_of(const std::string& scheme_name, int64_t b, int64_t h, int64_t t, int64_t d, const std::string& layout) {
  if (layout != "planar" && layout != "fbgemm") throw InputError(fmt::format("layout '{}': expected planar or fbgemm", layout));
  const Scheme s = parse_scheme(scheme_name);
  check_scheme_fits(s, static_cast<int>(d));
  const QuantizedSizes q = quantized_sizes(s, {b, h, t, d}, layout == "fbgemm" ? CodeLayout::kFbgemm : CodeLayout::kPlanar);
  nb::dict r;
  r["codes"] = q.codes, r["scales"] = layout == "fbgemm" ? 0 : q.scales, r["zeros"] = layout == "fbgemm" ? 0 : q.zeros;
  r["tensor_scale"] = q.tensor_scale;
  r["scratch"] = quantize_scratch_bytes(s, {b, h, t, d}, layout == "fbgemm" ? CodeLayout::kFbgemm : CodeLayout::kPlanar);
  r["row_bytes"] = layout == "fbgemm" ? fbgemm_row_bytes(s, d) : code_bytes_per_row(s, d);
  return r;
}

// codes: planar [B, H, T, row bytes] (contiguous) of `scheme` at head_dim; scales / zeros / nvfp4's
// tensor_scale as quantize_py wrote them; out: fp32 [B, H, T, D], contiguous.
void dequantize_py(const Tensor& codes, const std::string& scheme_name, int64_t head_dim, nb::object scales,
                   nb::object zeros, nb::object tensor_scale, const Tensor& out, uintptr_t stream) {
  const Scheme s = parse_scheme(scheme_name);
  check_scheme_fits(s, static_cast<int>(head_dim));
  require(codes, "codes", {dt::kUint8, dt::kInt8}, 4);
  if (!contiguous(codes)) throw InputError("codes: must be contiguous");
  check_dim(codes, "codes", 3, code_bytes_per_row(s, head_dim), "bytes per row");
  const KvShape shape{static_cast<int64_t>(codes.shape(0)), static_cast<int64_t>(codes.shape(1)),
                      static_cast<int64_t>(codes.shape(2)), head_dim};
  require(out, "out", {dt::kFp32}, 4);
  if (!contiguous(out)) throw InputError("out: must be contiguous");
  for (size_t axis = 0; axis < 4; ++axis)
    check_dim(out, "out", axis, axis < 3 ? static_cast<int64_t>(codes.shape(axis)) : head_dim, "the codes' [B, H, T, D]");
  const QuantizedSizes sizes = quantized_sizes(s, shape, CodeLayout::kPlanar);
  DequantizeParams p{s, shape, static_cast<const uint8_t*>(codes.data())};
  const auto [scales_ptr, zeros_ptr, tensor_scale_ptr] = param_buffers(s, sizes, scales, zeros, tensor_scale);
  p.scales = scales_ptr, p.zeros = zeros_ptr, p.tensor_scale = static_cast<const float*>(tensor_scale_ptr);
  p.out = static_cast<float*>(out.data());
  launch_dequantize(p, to_stream(stream));
}

}  // namespace kvq::py
