// kvq._gpu: kvq's GPU quantize and decode kernels on the caller's CUDA tensors (torch, CuPy, JAX:
// anything with DLPack), in place, on the caller's stream. The variants, storages and messages are
// those of the `kvq` tools (gpu/registry.hpp); this file checks tensors and fills the params structs.
// The Python side (kvq/gpu.py) allocates the outputs and names the stream.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <string>
#include <vector>

#include "gpu/append.hpp"
#include "gpu/decode.hpp"
#include "gpu/quantize.hpp"
#include "gpu/registry.hpp"
#include "python/arrays.hpp"
#include "python/errors.hpp"
#include "quant/fbgemm_layout.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvq {
namespace {

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

std::string shape_of(const Tensor& t) { return shape_string(AnyArray(t)); }
std::string strides_of(const Tensor& t) {
  std::vector<int64_t> strides;
  for (size_t i = 0; i < t.ndim(); ++i) strides.push_back(t.stride(i));
  return fmt::format("[{}]", fmt::join(strides, ", "));
}

// Checks that `t` is a CUDA tensor on the current device, of one of `dtypes` and rank `rank`
// (-1: any) with a unit stride on its last axis; InputError naming `what` otherwise.
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

// A contiguous buffer of exactly `bytes` bytes (scales, zero points, quantize outputs).
void require_buffer(const Tensor& t, const std::string& what, int64_t bytes) {
  require(t, what, {dt::kUint8, dt::kInt8, dt::kFp16, dt::kFp32, dt::kBf16}, -1);
  if (!contiguous(t)) throw InputError(fmt::format("{}: must be contiguous", what));
  if (static_cast<int64_t>(t.nbytes()) != bytes)
    throw InputError(fmt::format("{}: {} bytes (shape {}, {}), expected {}", what, t.nbytes(), shape_of(t),
                                 dtype_name(t.dtype()), bytes));
}

// A paged cache's per-row parameters (or chan-tN's): `pages` x `page_bytes` bytes, contiguous (a pool
// of their own, any shape), or [pages, ...] whose pages lie apart by the first stride, each page's
// own contiguous: views into a pool that keeps each page's parameters beside its codes (kvq.gpu.one_pool,
// one allocation a page as lmdeploy's blocks). Returns the bytes from one page's parameters to the next.
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

cudaStream_t to_stream(uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

// ---- quantize ----

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

// An int32 [B, entries] table on the device (block_table, window_table).
const int32_t* table_of(nb::object t_obj, const char* what, int64_t batch, int64_t entries = -1) {
  const Tensor t = nb::cast<Tensor>(t_obj);
  require(t, what, {dt::kInt32}, 2);
  check_dim(t, what, 0, batch, "B");
  if (entries >= 0) check_dim(t, what, 1, entries, "entries (block_table's)");
  if (!contiguous(t)) throw InputError(fmt::format("{}: must be contiguous [B, pages per sequence]", what));
  return static_cast<const int32_t*>(t.data());
}

// ---- append ----

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

// ---- decode ----

// One of K or V from the Python side: {"storage", "layout" (bnsh | bsnh | fbgemm | paged), "data",
// "scales", "zero_points", "window"}. Strides come from the tensor (a batch stride of 0 shares one
// cache among queries). "paged": data [pages, P, H, row] through its strides (NHD; an HND pool's
// transposed view too), per-row parameters contiguous [pages, H, P, groups] (per token: [pages, P]);
// `batch` and `tokens` then count pages and tokens per page. +wW schemes: "window", the raw bf16 /
// fp16 values laid out as the codes ([B, H, T, D], or a pool of pages [pages', P, H, D] read through
// the window table), only the window's tokens read.
struct Operand {
  KvOperand op;
  KvFormat format = KvFormat::kBf16;
  int64_t batch = 0, heads = 0, tokens = 0;
  bool paged = false;
  KvWindow window;
};

// A +wW scheme's raw window values (see Operand) for codes of `heads` x `tokens` (paged: per page).
KvWindow window_operand(const nb::dict& d, const Scheme& s, const char* which, const std::string& layout, int64_t batch,
                        int64_t heads, int64_t tokens, int64_t head_dim) {
  if (layout != "bnsh" && layout != "paged")
    throw InputError(fmt::format("{}: {}: a +wW window is read beside planar (bnsh) or paged codes, not {}", which,
                                 to_string(s), layout));
  if (!d.contains("window") || d["window"].is_none())
    throw InputError(fmt::format("{}: {} keeps its window raw: the Cache needs `window` (bf16 / fp16 values)", which,
                                 to_string(s)));
  const Tensor w = nb::cast<Tensor>(d["window"]);
  const std::string what = fmt::format("{} window", which);
  require(w, what, {dt::kBf16, dt::kFp16}, 4);
  const bool paged = layout == "paged";
  if (!paged) check_dim(w, what, 0, batch, "B (the codes')");
  check_dim(w, what, paged ? 2 : 1, heads, "H");
  check_dim(w, what, paged ? 1 : 2, tokens, paged ? "P" : "T");
  check_dim(w, what, 3, head_dim, "D");
  const int64_t bytes = 2;
  KvOperand raw = raw_operand(w.data(), heads, tokens, static_cast<int>(head_dim), paged);
  if (paged) {
    raw = paged_operand(raw, heads, static_cast<int>(tokens), static_cast<int>(head_dim), head_dim * bytes);
    raw.stride_page = w.stride(0) * bytes;
  } else {
    raw.stride_b = w.stride(0) * bytes;
  }
  raw.stride_h = w.stride(paged ? 2 : 1) * bytes, raw.stride_t = w.stride(paged ? 1 : 2) * bytes;
  return scheme_window(s, raw, w.dtype() == dt::kBf16 ? KvFormat::kBf16 : KvFormat::kFp16);
}

Operand operand(const nb::dict& d, const char* which, int64_t head_dim) {
  const std::string storage = nb::cast<std::string>(d["storage"]), layout = nb::cast<std::string>(d["layout"]);
  if (layout != "bnsh" && layout != "bsnh" && layout != "fbgemm" && layout != "paged")
    throw InputError(fmt::format("{}: layout '{}', expected bnsh, bsnh, fbgemm or paged", which, layout));
  Operand r;
  r.paged = layout == "paged";
  const bool fbgemm = layout == "fbgemm", bsnh = layout != "bnsh";  // FBGEMM rows and pages are [B, T, H, row]
  const std::optional<Scheme> s = parse_storage_operand(storage, fbgemm, r.format);
  const Tensor data = nb::cast<Tensor>(d["data"]);
  const std::string what = fmt::format("{} {}", which, s ? (fbgemm ? "rows" : "codes") : "values");
  if (!s) {
    require(data, what, {r.format == KvFormat::kBf16 ? dt::kBf16 : dt::kFp16}, 4);
  } else {
    require(data, what, {dt::kUint8, dt::kInt8}, 4);
  }
  r.batch = static_cast<int64_t>(data.shape(0));
  r.heads = static_cast<int64_t>(data.shape(bsnh ? 2 : 1));
  r.tokens = static_cast<int64_t>(data.shape(bsnh ? 1 : 2));
  const int64_t row = !s ? head_dim : fbgemm ? fbgemm_row_bytes(*s, head_dim) : code_bytes_per_row(*s, head_dim);
  check_dim(data, what, 3, row, !s ? "D" : "bytes per row");
  const int64_t bytes = static_cast<int64_t>(data.itemsize());
  int64_t param_page_stride = -1;  // paged: bytes from a page's parameters to the next's (scales' and zero points')
  if (!s) {
    r.op.data = static_cast<const uint8_t*>(data.data());
  } else {
    const KvShape shape{r.batch, r.heads, r.tokens, head_dim};
    const QuantizedSizes sizes = quantized_sizes(*s, shape, CodeLayout::kPlanar);
    const void* scales = nullptr;
    const void* zeros = nullptr;
    const void* tensor_scale = nullptr;  // nvfp4's fp32 s_t
    if (!fbgemm) {
      for (auto [key, want, ptr] : {std::tuple{"scales", sizes.scales, &scales}, std::tuple{"zero_points", sizes.zeros, &zeros},
                                    std::tuple{"tensor_scale", sizes.tensor_scale, &tensor_scale}}) {
        if (want == 0) continue;
        if (!d.contains(key) || d[key].is_none())
          throw InputError(fmt::format("{}: {} needs {} ({} bytes)", which, storage, key, want));
        const Tensor t = nb::cast<Tensor>(d[key]);
        const std::string name = fmt::format("{} {}", which, key);
        // pages of per-row parameters, wherever each page lies (a per-tensor scale is one value)
        if (r.paged && s->granularity != Granularity::kTensor && std::string_view(key) != "tensor_scale") {
          const int64_t stride = paged_params(t, name, r.batch, want / std::max<int64_t>(r.batch, 1));
          if (param_page_stride >= 0 && stride != param_page_stride)
            throw InputError(fmt::format("{}: scales' pages {} bytes apart, zero points' {}: the kernels read both "
                                         "with one stride", which, param_page_stride, stride));
          param_page_stride = stride;
        } else {
          require_buffer(t, name, want);
        }
        *ptr = t.data();
      }
    }
    r.op = quantized_operand(*s, r.batch, r.heads, r.tokens, static_cast<int>(head_dim), fbgemm,
                             static_cast<const uint8_t*>(data.data()), scales, zeros, static_cast<const float*>(tensor_scale));
  }
  const int b_axis = 0, h_axis = bsnh ? 2 : 1, t_axis = bsnh ? 1 : 2;
  if (r.paged) {  // parameter strides within a page those of [H, P, groups]; code strides the tensor's
    r.op = paged_operand(r.op, r.heads, static_cast<int>(r.tokens), static_cast<int>(head_dim), row * bytes);
    r.op.stride_page = data.stride(0) * bytes;
    const int64_t pb = r.op.param_bytes();
    if (param_page_stride > 0) {
      if (param_page_stride % pb != 0)
        throw InputError(fmt::format("{}: parameter pages {} bytes apart, not a multiple of a {}-byte parameter", which,
                                     param_page_stride, pb));
      r.op.param_stride_page = param_page_stride / pb;
    }
  }
  r.op.stride_b = r.paged ? 0 : data.stride(b_axis) * bytes, r.op.stride_h = data.stride(h_axis) * bytes;
  r.op.stride_t = data.stride(t_axis) * bytes;
  if (s && !fbgemm && !r.paged && r.op.stride_b == 0 && r.op.mode != ParamMode::kNone && r.batch > 1)
    throw InputError(fmt::format("{}: a batch stride of 0 shares the codes but not their scales (kept per sequence "
                                 "in group order): repeat the cache instead", which));
  if (s && s->has_window()) r.window = window_operand(d, *s, which, layout, r.batch, r.heads, r.tokens, head_dim);
  return r;
}

const DecodeVariant& decode_variant_for(const std::string& name, const DecodeParams& p) {
  if (name.empty()) return default_decode_variant(p);
  for (const auto& v : decode_variants())
    if (v.name == name) return v;
  throw InputError(fmt::format("no decode variant named '{}' (kvq.gpu.variants())", name));
}

int sm_count() {
  static std::map<int, int> counts;  // per device
  int device = 0;
  KVQ_CUDA_CHECK(cudaGetDevice(&device));
  auto it = counts.find(device);
  if (it == counts.end()) it = counts.emplace(device, device_info().sm_count).first;
  return it->second;
}

DecodeParams decode_problem(const Tensor& q, const nb::dict& k, const nb::dict& v, const Tensor& out, const Tensor& lse,
                            nb::object seq_lens, nb::object alibi_slopes, double softmax_scale, nb::object block_table,
                            nb::object window_table) {
  require(q, "q", {dt::kBf16}, 3);
  if (!contiguous(q)) throw InputError("q: must be contiguous [B, Hq, D]");
  DecodeParams p;
  p.batch = static_cast<int64_t>(q.shape(0)), p.q_heads = static_cast<int64_t>(q.shape(1));
  p.head_dim = static_cast<int>(q.shape(2));
  const Operand ko = operand(k, "k", p.head_dim), vo = operand(v, "v", p.head_dim);
  const bool paged = !block_table.is_none();
  for (const Operand* o : {&ko, &vo}) {
    const char* which = o == &ko ? "k" : "v";
    if (o->paged != paged)
      throw InputError(o->paged ? fmt::format("{}: a paged cache needs block_table [B, pages per sequence]", which)
                                : fmt::format("{}: a block_table was given, but {}'s layout is not paged", which, which));
    if (!paged && o->batch != p.batch) throw InputError(fmt::format("{}: batch {}, but q has B = {}", which, o->batch, p.batch));
  }
  if (ko.heads != vo.heads || ko.tokens != vo.tokens)
    throw InputError(fmt::format("k has Hkv = {}, {} = {} but v has Hkv = {}, {}", ko.heads, paged ? "P" : "T", ko.tokens,
                                 vo.heads, vo.tokens));
  p.kv_heads = ko.heads, p.tokens = ko.tokens;
  if (paged) {  // T: the tokens the table holds per sequence
    p.block_table = table_of(block_table, "block_table", p.batch);
    p.table_stride = static_cast<int64_t>(nb::cast<Tensor>(block_table).shape(1));
    p.page_tokens = static_cast<int>(ko.tokens);
    p.tokens = p.table_stride * ko.tokens;
  }
  p.k = ko.op, p.v = vo.op, p.k_format = ko.format, p.v_format = vo.format;
  p.k_window = ko.window, p.v_window = vo.window;
  const bool windows = ko.window.present() || vo.window.present();
  if (!window_table.is_none() && !(paged && windows))
    throw InputError("window_table: given, but it goes with a paged cache of a +wW scheme (its window's pages)");
  if (paged && windows) {
    if (window_table.is_none())
      throw InputError("a paged cache of a +wW scheme needs window_table [B, pages per sequence] (its window's pages)");
    p.window_block_table = table_of(window_table, "window_table", p.batch, p.table_stride);
  }
  p.q = static_cast<const uint16_t*>(q.data());
  require(out, "out", {dt::kBf16}, 3);
  require(lse, "lse", {dt::kFp32}, 2);
  if (!contiguous(out) || out.shape(0) != q.shape(0) || out.shape(1) != q.shape(1) || out.shape(2) != q.shape(2))
    throw InputError(fmt::format("out: shape {}, expected contiguous {} like q", shape_of(out), shape_of(q)));
  if (!contiguous(lse) || static_cast<int64_t>(lse.shape(0)) != p.batch || static_cast<int64_t>(lse.shape(1)) != p.q_heads)
    throw InputError(fmt::format("lse: shape {}, expected contiguous [{}, {}]", shape_of(lse), p.batch, p.q_heads));
  p.out = static_cast<uint16_t*>(out.data()), p.lse = static_cast<float*>(lse.data());
  if (!seq_lens.is_none()) {
    const Tensor t = nb::cast<Tensor>(seq_lens);
    require(t, "seq_lens", {dt::kInt32}, 1);
    check_dim(t, "seq_lens", 0, p.batch, "B");
    p.seq_lens = static_cast<const int32_t*>(t.data());
  }
  if (!alibi_slopes.is_none()) {
    const Tensor t = nb::cast<Tensor>(alibi_slopes);
    require(t, "alibi_slopes", {dt::kFp32}, 1);
    check_dim(t, "alibi_slopes", 0, p.q_heads, "Hq");
    p.alibi_slopes = static_cast<const float*>(t.data());
  }
  p.softmax_scale = static_cast<float>(softmax_scale > 0 ? softmax_scale : 1.0 / std::sqrt(double(p.head_dim)));
  return p;  // launch_decode checks the planned problem (check_decode_params)
}

// Writes O (bf16) and LSE (fp32) for q over (k, v). Returns the launch: variant, splits, profile.
nb::dict decode_py(const Tensor& q, const nb::dict& k, const nb::dict& v, const Tensor& out, const Tensor& lse,
                nb::object seq_lens, nb::object alibi_slopes, double softmax_scale, const std::string& variant, int splits,
                uintptr_t stream_handle, nb::object block_table, nb::object window_table) {
  require_device();
  DecodeParams p = decode_problem(q, k, v, out, lse, seq_lens, alibi_slopes, softmax_scale, block_table, window_table);
  const DecodeVariant& var = decode_variant_for(variant, p);
  if (splits < 0) throw InputError(fmt::format("splits {}: expected 0 (the variant's choice) or more", splits));
  if (splits > 0 && !var.split_k) throw InputError(fmt::format("splits {}: {} does not split keys", splits, var.name));
  const std::string why = var.unsupported_reason(p);
  if (!why.empty()) throw InputError(fmt::format("decode variant {}: {}", var.name, why));
  p = var.plan(p, sm_count(), splits);
  const cudaStream_t stream = to_stream(stream_handle);
  const int64_t floats = partial_o_floats(p) + partial_lse_floats(p);
  float* partials = nullptr;
  if (floats) KVQ_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partials), floats * sizeof(float), stream));
  p.partial_o = partials, p.partial_lse = partials ? partials + partial_o_floats(p) : nullptr;
  try {
    launch_decode(p, stream);
  } catch (...) {
    if (partials) cudaFreeAsync(partials, stream);
    throw;
  }
  if (partials) KVQ_CUDA_CHECK(cudaFreeAsync(partials, stream));
  nb::dict r;
  r["variant"] = var.name, r["splits"] = total_splits(p), r["heads_per_cta"] = p.heads_per_cta;
  r["profile"] = std::string(decode_precision_profile(p));
  return r;
}

// What `variant` says about a K/V storage pair at head_dim D before any tensor exists: the reason it
// cannot read them ("" when it can) and the precision profile of its arithmetic (the gate's tolerance).
nb::dict decode_support(const std::string& variant, const std::string& k, const std::string& v, const std::string& layout,
                        int head_dim, int page_tokens) {
  const DecodeVariant* var = nullptr;
  for (const auto& d : decode_variants())
    if (d.name == variant) var = &d;
  if (!var) throw InputError(fmt::format("no decode variant named '{}' (kvq.gpu.variants())", variant));
  nb::dict r;
  r["reason"] = "", r["profile"] = "";
  DecodeParams p;
  p.batch = p.q_heads = p.kv_heads = p.tokens = 1, p.head_dim = head_dim;
  p.family = var->family;
  const bool fbgemm = layout == "fbgemm";
  static const int32_t kAnyTable = 0;  // a paged layout: a table (never read here) of pages of page_tokens
  if (layout == "paged") p.block_table = p.window_block_table = &kAnyTable, p.table_stride = 1, p.page_tokens = page_tokens;
  try {
    for (auto [name, op, format, window] : {std::tuple{&k, &p.k, &p.k_format, &p.k_window},
                                            std::tuple{&v, &p.v, &p.v_format, &p.v_window}}) {
      const std::optional<Scheme> s = parse_storage_operand(*name, fbgemm, *format);
      static const float kAnyTensorScale = 1.0f;  // nvfp4's s_t: a real cache carries one (never read here)
      *op = s ? quantized_operand(*s, 1, 1, 1, head_dim, fbgemm, nullptr, nullptr, nullptr, &kAnyTensorScale)
              : raw_operand(nullptr, 1, 1, head_dim, layout != "bnsh");
      if (s && s->has_window()) *window = scheme_window(*s, raw_operand(&kAnyTable, 1, 1, head_dim, false), KvFormat::kBf16);
    }
  } catch (const SchemeError& e) {
    r["reason"] = std::string(e.what());
    return r;
  }
  r["reason"] = var->unsupported_reason(p);
  r["profile"] = std::string(decode_precision_profile(p));
  return r;
}

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
}  // namespace kvq

NB_MODULE(_gpu, m) {
  m.doc() = "kvq's GPU quantize and decode kernels on CUDA tensors (DLPack), in place; kvq/gpu.py is the interface";
  kvq::bind_errors();
  m.def("available", &kvq::cuda_device_available);
  m.def("device", &kvq::device);
  m.def("variants", &kvq::variants);
  m.def("decode_support", &kvq::decode_support, "variant"_a, "k"_a, "v"_a, "layout"_a, "head_dim"_a,
        "page_tokens"_a = 16);
  m.def("quantized_sizes", &kvq::sizes_of, "scheme"_a, "batch"_a, "heads"_a, "tokens"_a, "head_dim"_a, "layout"_a);
  m.def("quantize", &kvq::quantize_py, "x"_a, "scheme"_a, "codes"_a, "scales"_a.none(), "zeros"_a.none(),
        "tensor_scale_out"_a.none(), "tensor_scale"_a.none(), "layout"_a, "variant"_a, "seq_lens"_a, "stream"_a, "scratch"_a,
        "status"_a.none() = nb::none());
  m.def("append_rows", &kvq::append_rows_py, "src_codes"_a, "dst_codes"_a, "src_scales"_a.none(), "dst_scales"_a.none(),
        "src_zeros"_a.none(), "dst_zeros"_a.none(), "positions"_a, "block_table"_a.none(), "page_tokens"_a,
        "param_heads"_a, "status"_a, "check"_a, "stream"_a);
  m.def("flush_channel_groups", &kvq::flush_channel_groups_py, "x"_a, "storage"_a, "codes"_a, "scales"_a,
        "zeros"_a.none(), "window"_a, "positions"_a, "block_table"_a.none(), "window_table"_a.none(), "page_tokens"_a,
        "status"_a, "stream"_a);
  m.def("dequantize", &kvq::dequantize_py, "codes"_a, "scheme"_a, "head_dim"_a, "scales"_a.none(), "zeros"_a.none(),
        "tensor_scale"_a.none(), "out"_a, "stream"_a);
  m.def("decode", &kvq::decode_py, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "seq_lens"_a.none(), "alibi_slopes"_a.none(),
        "softmax_scale"_a, "variant"_a, "splits"_a, "stream"_a, "block_table"_a.none() = nb::none(),
        "window_table"_a.none() = nb::none());
}
