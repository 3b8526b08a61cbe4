// kvq._gpu, reading caches: decode attention over K / V operands described by dicts (storage,
// layout, data, parameters, window), contiguous or paged, and what a variant says about a storage pair.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "gpu/cuda_check.hpp"
#include "gpu/decode.hpp"
#include "gpu/device.hpp"
#include "gpu/registry.hpp"
#include "python/gpu_bindings.hpp"
#include "quant/errors.hpp"
#include "quant/fbgemm_layout.hpp"

namespace kvq::py {
namespace {

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

}  // namespace

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

}  // namespace kvq::py
