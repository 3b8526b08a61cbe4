#include "experiments/gate/validate_quantize.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <random>

#include "data/dump.hpp"
#include "experiments/gate/block_special_values.hpp"
#include "quant/block_quantize.hpp"
#include "quant/fbgemm_layout.hpp"
#include "quant/quantize.hpp"
#include "quant/scheme_pairs.hpp"

namespace kvq {
namespace {

const char* kSchemes[] = {"int8-tensor",    "int8-token",      "int8-head",       "int8-g64",       "int8-g32",
                          "int8-g8-asym",   "int8-head-asym",  "int8-chan-t32",   "int4-tensor",    "int4-token-asym",
                          "int4-head",      "int4-head-asym",  "int4-g64-asym",   "int4-g32-asym",  "int4-g16-asym",
                          "int4-g32",       "int4-g2-asym",    "int4-chan-t32-asym", "int8-head-fp32", "int4-g32-asym-fp32",
                          "int8-token-fp32", "fp8-e4m3-tensor", "fp8-e4m3-token", "fp8-e4m3-head", "fp8-e4m3-g32",
                          "fp8-e5m2-head", "fp8-e5m2-g16-fp32", "fp8-e4m3", "fp8-e5m2"};
const InputDtype kDtypes[] = {InputDtype::kBf16, InputDtype::kFp16, InputDtype::kFp32};

// The per-token and per-tensor schemes beyond kSchemes: every symmetry and scale dtype of both.
const char* kWideSchemes[] = {"int4-token",       "int8-token-asym",  "int4-token-asym-fp32",
                              "int8-tensor-asym", "int4-tensor-asym", "int8-tensor-fp32"};

// llama.cpp's cache types and the FP4 microscaling formats (quant/block_formats.hpp).
const char* kBlockSchemes[] = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4", "nvfp4"};

std::vector<const char*> gate_schemes() {
  std::vector<const char*> all(std::begin(kSchemes), std::end(kSchemes));
  all.insert(all.end(), std::begin(kWideSchemes), std::end(kWideSchemes));
  all.insert(all.end(), std::begin(kBlockSchemes), std::end(kBlockSchemes));
  return all;
}

// Raw device bytes of `values` (already representable in dt).
std::vector<uint8_t> storage_bytes(const std::vector<float>& values, InputDtype dt) {
  std::vector<uint8_t> out(values.size() * element_bytes(dt));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dt == InputDtype::kFp32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t bits = dt == InputDtype::kFp16 ? fp32_to_fp16_bits(values[i]) : fp32_to_bf16_bits(values[i]);
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
  }
  return out;
}

std::string first_difference(const char* what, const std::vector<uint8_t>& cpu, const std::vector<uint8_t>& gpu) {
  if (cpu.size() != gpu.size()) return fmt::format("{}: {} bytes on the CPU, {} on the GPU", what, cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    if (cpu[i] != gpu[i]) return fmt::format("{}: byte {} is {:#04x} on the CPU, {:#04x} on the GPU", what, i, cpu[i], gpu[i]);
  return "";
}

struct Checker {
  const QuantizeVariant& v;
  const std::function<void(const CaseResult&)>& report;
  std::vector<CaseResult> results;

  // One case: GPU vs CPU on `values` (rounded to dt first), BNSH unless `bsnh`; `seq_lens` place
  // a +wW window (empty: every sequence T tokens); `tensor_scale`: a given tensor scale (quantize()).
  void compare(const std::string& name, std::vector<float> values, const KvShape& shape, const Scheme& scheme,
               InputDtype dt, CodeLayout layout, bool bsnh = false, const std::vector<int32_t>& seq_lens = {},
               std::optional<float> tensor_scale = std::nullopt) {
    if (!v.accepts(scheme, shape.head_dim, layout, dt)) return;
    for (float& x : values) x = round_to_input(x, dt);
    CaseResult r{v.name, name, to_string(scheme), to_string(dt), to_string(layout),
                 fmt::format("[{}, {}, {}, {}]{}{}", shape.batch, shape.heads, shape.tokens, shape.head_dim,
                             bsnh ? " BSNH" : "", seq_lens.empty() ? "" : fmt::format(" lens {}", fmt::join(seq_lens, ","))),
                 "", shape.numel(), false};
    std::string cpu_error, gpu_error;
    GpuQuantized cpu, gpu;
    try {
      cpu = device_bytes(quantize(KvView::bnsh(values.data(), shape), scheme, "K",
                                  seq_lens.empty() ? nullptr : seq_lens.data(), tensor_scale),
                         layout);
    } catch (const InputError& e) {
      cpu_error = e.what();
    }
    std::vector<float> device_order = values;
    if (bsnh) {  // same logical tensor, stored [B, T, H, D]
      for (int64_t b = 0; b < shape.batch; ++b)
        for (int64_t h = 0; h < shape.heads; ++h)
          for (int64_t t = 0; t < shape.tokens; ++t)
            for (int64_t d = 0; d < shape.head_dim; ++d)
              device_order[((b * shape.tokens + t) * shape.heads + h) * shape.head_dim + d] =
                  values[((b * shape.heads + h) * shape.tokens + t) * shape.head_dim + d];
    }
    const DeviceBuffer<uint8_t> input(storage_bytes(device_order, dt));
    DeviceKv kv = DeviceKv::bnsh(input.data(), dt, shape);
    if (bsnh) kv.stride_b = shape.tokens * shape.heads * shape.head_dim, kv.stride_h = shape.head_dim,
              kv.stride_t = shape.heads * shape.head_dim;
    try {
      gpu = run_quantize(v.launch, kv, scheme, layout, "K", nullptr, seq_lens, tensor_scale);
    } catch (const InputError& e) {
      gpu_error = e.what();
    }
    if (!cpu_error.empty() || !gpu_error.empty()) {
      r.ok = cpu_error == gpu_error;
      r.detail = r.ok ? "same error: " + cpu_error : fmt::format("CPU error '{}', GPU error '{}'", cpu_error, gpu_error);
    } else {
      r.detail = first_difference("codes", cpu.codes, gpu.codes);
      if (r.detail.empty()) r.detail = first_difference("scales", cpu.scales, gpu.scales);
      if (r.detail.empty()) r.detail = first_difference("zero points", cpu.zeros, gpu.zeros);
      if (r.detail.empty()) r.detail = first_difference("tensor scale", cpu.tensor_scale, gpu.tensor_scale);
      r.ok = r.detail.empty();
      if (r.ok) r.detail = "bit-exact";
    }
    results.push_back(r);
    report(r);
  }
};

std::vector<float> random_values(size_t n, uint32_t seed, int64_t head_dim) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = normal(rng) * ((i % head_dim) % 29 == 3 ? 20.0f : 1.0f);  // outlier channels
  return v;
}

// Rows that hit every corner of the codec: zeros, signed zeros (as minimum and maximum, in both
// orders), 65504, exact half-step ties, tiny and subnormal values, constant rows, a row spanning
// 1e-3..3e4.
std::vector<float> special_values(const KvShape& s) {
  std::vector<float> v(s.numel(), 0.0f);
  const int64_t D = s.head_dim;
  for (int64_t r = 0; r < s.rows(); ++r) {
    float* row = v.data() + r * D;
    switch (r % 10) {
      case 0: break;  // all zero
      case 1: for (int64_t d = 0; d < D; ++d) row[d] = d % 2 ? -0.0f : 0.0f; break;
      case 2: for (int64_t d = 0; d < D; ++d) row[d] = d % 3 == 0 ? 65504.0f : d % 3 == 1 ? -65504.0f : 1.0f; break;
      case 3:  // amax 127 (int8 scale 1) and 7 * 2^k: values on half steps tie to even
        for (int64_t d = 0; d < D; ++d) row[d] = d == 0 ? 127.0f : (static_cast<float>(d % 16) - 8.0f) + 0.5f;
        break;
      case 4: for (int64_t d = 0; d < D; ++d) row[d] = 1e-10f * static_cast<float>(d + 1) * (d % 2 ? -1.0f : 1.0f); break;
      case 5: for (int64_t d = 0; d < D; ++d) row[d] = 3.69921875f; break;
      case 6: for (int64_t d = 0; d < D; ++d) row[d] = 1e-40f * static_cast<float>(d); break;  // fp32 subnormals
      case 7: for (int64_t d = 0; d < D; ++d) row[d] = std::pow(10.0f, -3.0f + 7.5f * d / D) * (d % 2 ? -1.0f : 1.0f); break;
      case 8: for (int64_t d = 0; d < D; ++d) row[d] = d == 0 ? 0.0f : d == 1 ? -0.0f : static_cast<float>(d); break;
      case 9: for (int64_t d = 0; d < D; ++d) row[d] = d == D - 1 ? -0.0f : d == D - 2 ? 0.0f : -static_cast<float>(d); break;
    }
  }
  return v;
}

}  // namespace

// The CPU result in the byte format the GPU writes.
GpuQuantized device_bytes(const QuantizedKv& q, CodeLayout layout) {
  if (layout == CodeLayout::kFbgemm) return {to_fbgemm(q).bytes, {}, {}, {}};
  const ScaleDtype dt = q.scheme.scale_dtype;
  auto params_bytes = [&](const std::vector<float>& v) {
    std::vector<uint8_t> out;
    for (float x : v) {
      if (dt == ScaleDtype::kE8M0 || dt == ScaleDtype::kE4M3) {  // mxfp4, nvfp4: one byte
        out.push_back(scale_byte(dt, x));
      } else if (dt == ScaleDtype::kFp16) {
        const uint16_t bits = fp32_to_fp16_bits(x);
        out.push_back(bits & 0xff), out.push_back(bits >> 8);
      } else {
        uint8_t b[4];
        std::memcpy(b, &x, 4);
        out.insert(out.end(), b, b + 4);
      }
    }
    return out;
  };
  std::vector<uint8_t> tensor_scale;
  if (q.scheme.format == CodeFormat::kNvfp4) {
    tensor_scale.resize(4);
    std::memcpy(tensor_scale.data(), &q.tensor_scale, 4);
  }
  return {q.codes, params_bytes(q.scales), params_bytes(q.zeros), tensor_scale};
}

std::vector<CaseResult> validate_quantize_variant(const QuantizeVariant& v, const ValidateOptions& opt,
                                                  const std::function<void(const CaseResult&)>& report) {
  Checker c{v, report, {}};
  const int64_t D = 128;
  // Random values, every scheme x dtype x layout the variant takes; BSNH strides once per scheme.
  for (const char* name : gate_schemes()) {
    const Scheme s = parse_scheme(name);
    for (InputDtype dt : kDtypes)
      for (CodeLayout layout : {CodeLayout::kPlanar, CodeLayout::kFbgemm}) {
        const KvShape shape{2, 3, opt.quick ? 17 : 67, D};
        c.compare("random", random_values(shape.numel(), 1, D), shape, s, dt, layout, false);
      }
    const KvShape shape{2, 3, 33, D};
    c.compare("random BSNH", random_values(shape.numel(), 2, D), shape, s, InputDtype::kBf16, CodeLayout::kPlanar, true);
    for (int64_t d : {64, 256}) {
      const KvShape other{2, 2, 19, d};
      c.compare("random D=" + std::to_string(d), random_values(other.numel(), 3, d), other, s, InputDtype::kBf16,
                CodeLayout::kPlanar);
    }
  }
  // Shapes unlike the bundled data: D = 8, D / 8 not a power of two, odd T, many or one head.
  for (const KvShape& shape : {KvShape{1, 5, 3, 8}, KvShape{3, 1, 11, 40}, KvShape{2, 7, 3, 24}, KvShape{1, 16, 5, 256},
                               KvShape{3, 5, 37, 96}, KvShape{2, 3, 5, 48}})
    for (const char* name : gate_schemes())
      c.compare("random odd shape", random_values(shape.numel(), 9, shape.head_dim), shape, parse_scheme(name),
                InputDtype::kBf16, CodeLayout::kPlanar);
  // Ten million values and more, at kernel-sized shapes.
  if (!opt.quick)
    for (const char* name : {"int4-g32-asym", "int8-head", "int8-tensor", "int4-token-asym", "q4_0", "nvfp4"}) {
      const KvShape shape{5, 8, 2048, D};
      c.compare("large", random_values(shape.numel(), 4, D), shape, parse_scheme(name), InputDtype::kBf16,
                CodeLayout::kPlanar);
    }
  // Specials, every scheme, fp32 input so that the values arrive exactly.
  for (const char* name : gate_schemes())
    for (CodeLayout layout : {CodeLayout::kPlanar, CodeLayout::kFbgemm}) {
      const KvShape shape{1, 2, 20, D};
      c.compare("specials", special_values(shape), shape, parse_scheme(name), InputDtype::kFp32, layout);
    }
  // The block formats' own corners (experiments/gate/block_special_values.hpp): each rule's ties, the
  // mxfp4 exponent's lift below a power of two, nvfp4's e4m3 and e2m1 ties at s_t = 1, fp16-subnormal
  // scales, blocks so small that 1/d overflows; fp32 and bf16 input.
  for (const char* name : kBlockSchemes)
    for (InputDtype dt : {InputDtype::kFp32, InputDtype::kBf16}) {
      const KvShape shape{2, 3, 8, D};
      c.compare("block specials", block_special_values(shape), shape, parse_scheme(name), dt, CodeLayout::kPlanar);
    }
  // A calibrated tensor scale (values beyond it saturate): nvfp4's s_t and a symmetric per-tensor
  // scheme's one scale; zero, ones the scale dtype cannot hold (1e-30, 1e6 in fp16) and invalid ones.
  for (const char* name : {"nvfp4", "fp8-e4m3-tensor", "int8-tensor", "int4-tensor-fp32", "fp8-e5m2-tensor+w20"})
    for (float ts : {0.01f, 0.0f, 1e-30f, 1e6f, -1.0f, NAN, INFINITY}) {
      const KvShape shape{2, 3, 33, 64};
      c.compare(fmt::format("given tensor scale {}", ts), random_values(shape.numel(), 11, 64), shape,
                parse_scheme(name), InputDtype::kBf16, CodeLayout::kPlanar, false, {33, 25}, ts);
    }
  // Non-finite input under a given scale, which no statistics pass precedes: the GPU must still name
  // the first bad element as the CPU does (BNSH and strided BSNH input, two bad elements apart).
  for (const char* name : {"nvfp4", "fp8-e4m3-tensor", "int8-tensor", "int4-tensor"})
    for (InputDtype dt : {InputDtype::kFp32, InputDtype::kBf16})
      for (bool bsnh : {false, true}) {
        const KvShape shape{2, 3, 17, 64};
        std::vector<float> bad = random_values(shape.numel(), 13, 64);
        bad[((1 * 3 + 2) * 17 + 16) * 64 + 63] = NAN;
        bad[((1 * 3 + 0) * 17 + 3) * 64 + 8] = -INFINITY;
        c.compare("non-finite input, given tensor scale", bad, shape, parse_scheme(name), dt, CodeLayout::kPlanar, bsnh,
                  {}, 0.05f);
      }
  // Hostile shapes: no tokens, no batch, one token, around the 8-rows-per-block tile.
  for (const KvShape& shape : {KvShape{2, 2, 0, D}, KvShape{0, 2, 5, D}, KvShape{1, 1, 1, D}, KvShape{1, 1, 7, D},
                               KvShape{1, 1, 8, D}, KvShape{1, 1, 9, D}, KvShape{3, 1, 33, D}})
    for (const char* name : {"int8-head", "int4-g32-asym", "int8-tensor", "int4-chan-t32-asym", "int8-token",
                             "int4-token-asym", "int4-tensor-asym", "q5_1", "nvfp4"})
      c.compare("hostile shape", random_values(shape.numel(), 5, D), shape, parse_scheme(name), InputDtype::kBf16,
                CodeLayout::kPlanar);
  // +wW over varlen batches (an empty sequence, a full one, one shorter than its window; W = 0;
  // chan-tN's boundary rounded down to whole token groups) and +had, alone and together.
  for (const char* name : {"int4-g32-asym+w16", "int8-head+w0", "int4-chan-t32-asym+w40", "int8-chan-t16+w20",
                           "fp8-e4m3-token+w8", "int8-tensor+w20", "int4-token-asym+w24", "fp8-e4m3+w5",
                           "int4-head-asym+had", "int4-g32-asym+had+w16", "fp8-e4m3-head+had", "int8-tensor-asym+had",
                           "int4-chan-t32-asym+had+w33", "q4_1+w16", "nvfp4+w8", "iq4_nl+w0", "mxfp4+had",
                           "q5_0+had+w16", "nvfp4+had", "q4_0+had64", "int8-head+had32"})
    for (InputDtype dt : kDtypes) {
      const KvShape shape{4, 2, opt.quick ? 40 : 70, 64};
      const int32_t T = static_cast<int32_t>(shape.tokens);
      c.compare("window / rotation", random_values(shape.numel(), 10, 64), shape, parse_scheme(name), dt,
                CodeLayout::kPlanar, false, {T, 0, T / 2 + 3, 7});
    }
  // Bad input: the GPU must fail with the CPU's message.
  for (const char* name : {"int8-head", "int4-g32-asym", "int8-tensor", "int8-token", "int4-chan-t32-asym",
                           "int4-tensor-asym", "int4-token-asym", "int4-g32-asym+had", "int8-head+w4", "q8_0", "q4_0",
                           "q5_1", "iq4_nl", "mxfp4", "nvfp4", "q4_1+w4"}) {
    const KvShape shape{2, 3, 20, D};
    std::vector<float> bad = random_values(shape.numel(), 6, D);
    bad[((1 * 3 + 2) * 20 + 5) * D + 17] = NAN;
    bad[((1 * 3 + 2) * 20 + 9) * D + 1] = INFINITY;
    c.compare("non-finite input", bad, shape, parse_scheme(name), InputDtype::kFp32, CodeLayout::kPlanar);
    std::vector<float> huge = random_values(shape.numel(), 7, D);
    huge[((0 * 3 + 1) * 20 + 3) * D + 64] = 3e38f;
    c.compare("scale overflow", huge, shape, parse_scheme(std::string(name)), InputDtype::kFp32, CodeLayout::kPlanar);
  }
  // q4_1 / q5_1: a min beyond fp16 with a representable d (a constant block of -70000).
  for (const char* name : {"q4_1", "q5_1"}) {
    const KvShape shape{1, 2, 6, D};
    std::vector<float> far = random_values(shape.numel(), 12, D);
    std::fill_n(far.begin() + (1 * 6 + 4) * D + 32, 32, -70000.0f);
    c.compare("min overflow", far, shape, parse_scheme(name), InputDtype::kFp32, CodeLayout::kPlanar);
  }
  // A real dump (the bundled capture by default), every layer's K and V, every default scheme that
  // fits its D.
  if (!opt.bundled_dump.empty() && !opt.quick) {
    const DumpInfo info = open_dump(opt.bundled_dump);
    const std::string file = std::filesystem::path(opt.bundled_dump).filename().string();
    for (size_t i = 0; i < info.layers.size(); ++i) {
      const KvLayer layer = read_layer(info, i);
      for (const SchemePair& pair : default_pairs(layer.kv_shape.head_dim)) {
        c.compare(fmt::format("dump {} K layer {}", file, layer.layer), layer.k, layer.kv_shape, pair.k,
                  InputDtype::kFp32, CodeLayout::kPlanar);
        c.compare(fmt::format("dump {} V layer {}", file, layer.layer), layer.v, layer.kv_shape, pair.v,
                  InputDtype::kFp32, CodeLayout::kPlanar);
      }
    }
  }
  // Reruns: bitwise identical outputs every time.
  for (const char* name : {"int4-g32-asym", "int8-tensor", "int4-token-asym", "nvfp4", "iq4_nl"}) {
    const Scheme s = parse_scheme(name);
    const KvShape shape{4, 8, opt.quick ? 16 : 512, D};
    if (!v.accepts(s, D, CodeLayout::kPlanar, InputDtype::kBf16)) continue;
    std::vector<float> values = random_values(shape.numel(), 8, D);
    for (float& x : values) x = round_to_input(x, InputDtype::kBf16);
    const DeviceBuffer<uint8_t> input(storage_bytes(values, InputDtype::kBf16));
    const DeviceKv kv = DeviceKv::bnsh(input.data(), InputDtype::kBf16, shape);
    QuantizeWorkspace ws(kv, s, CodeLayout::kPlanar);
    v.launch(ws.params(), nullptr);
    ws.check_flags("K", nullptr);
    const GpuQuantized first = ws.download();
    int differing = 0;
    const int reruns = opt.quick ? 3 : opt.reruns;
    for (int i = 1; i < reruns; ++i) {
      ws.reset();
      v.launch(ws.params(), nullptr);
      ws.check_flags("K", nullptr);
      const GpuQuantized again = ws.download();
      differing += again.codes != first.codes || again.scales != first.scales || again.zeros != first.zeros ||
                   again.tensor_scale != first.tensor_scale;
    }
    CaseResult r{v.name, fmt::format("{} reruns", reruns), name, "bfloat16", "planar",
                 fmt::format("[{}, {}, {}, {}]", shape.batch, shape.heads, shape.tokens, shape.head_dim),
                 differing ? fmt::format("{} reruns differ from the first", differing) : "bitwise identical",
                 shape.numel() * reruns, differing == 0};
    c.results.push_back(r);
    report(r);
  }
  return c.results;
}

nlohmann::json to_json(const CaseResult& r) {
  return {{"variant", r.variant}, {"case", r.name},   {"scheme", r.scheme}, {"dtype", r.dtype}, {"layout", r.layout},
          {"shape", r.shape},     {"values", r.values}, {"ok", r.ok},       {"skipped", r.skipped},
          {"detail", r.detail}};
}

}  // namespace kvq
