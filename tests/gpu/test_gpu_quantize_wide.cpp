// The wide-group quantize variants (quantize-tokenteam: per-token; quantize-tensor2pass: per-tensor)
// against the CPU quantizer byte for byte, on shapes unlike the bundled data: every team size of
// the per-token kernel (1..32 lanes, 4 and 8 chunks a lane, tokens it reads twice), D = 8..256 and
// D / 8 not a power of two, odd T, B = 1, Hkv = 1..16, BSNH strides, every input dtype and every
// int scheme of the two granularities; tensors of many blocks; non-finite input and scale overflow
// anywhere (the CPU's message); reruns bitwise identical.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "experiments/gate/validate_quantize.hpp"
#include "quant/quantize.hpp"

using namespace kvq;

namespace {

const QuantizeVariant& variant(const std::string& name) {
  for (const QuantizeVariant& v : quantize_variants())
    if (v.name == name) return v;
  throw Error("no quantize variant " + name);
}

// Normal values with outlier channels, a few exact zeros and values on a coarse grid (ties for
// small scales); representable in `dt`.
std::vector<float> test_values(const KvShape& s, uint32_t seed, InputDtype dt) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t d = static_cast<int64_t>(i) % s.head_dim;
    float x = normal(rng) * (d % 29 == 3 ? 20.0f : 1.0f);
    if (i % 37 == 5) x = 0.0f;
    if (i % 41 == 7) x = std::round(x * 4.0f) / 4.0f + 0.125f;
    v[i] = round_to_input(x, dt);
  }
  return v;
}

// The tensor as the device stores it: BNSH, or BSNH (same logical tensor, [B, T, H, D] in memory).
struct DeviceInput {
  DeviceBuffer<uint8_t> bytes;
  DeviceKv kv;
  DeviceInput(const std::vector<float>& values, const KvShape& s, InputDtype dt, bool bsnh)
      : bytes(static_cast<size_t>(s.numel() * element_bytes(dt))), kv(DeviceKv::bnsh(nullptr, dt, s)) {
    std::vector<uint8_t> host(bytes.size());
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t t = 0; t < s.tokens; ++t)
          for (int64_t d = 0; d < s.head_dim; ++d) {
            const int64_t logical = ((b * s.heads + h) * s.tokens + t) * s.head_dim + d;
            const int64_t stored = bsnh ? ((b * s.tokens + t) * s.heads + h) * s.head_dim + d : logical;
            const float x = values[static_cast<size_t>(logical)];
            if (dt == InputDtype::kFp32) {
              std::memcpy(host.data() + 4 * stored, &x, 4);
            } else {
              const uint16_t bits = dt == InputDtype::kFp16 ? fp32_to_fp16_bits(x) : fp32_to_bf16_bits(x);
              std::memcpy(host.data() + 2 * stored, &bits, 2);
            }
          }
    bytes.upload(host);
    kv.data = bytes.data();
    if (bsnh) kv.stride_b = s.tokens * s.heads * s.head_dim, kv.stride_h = s.head_dim, kv.stride_t = s.heads * s.head_dim;
  }
};

struct Outcome {
  GpuQuantized bytes;
  std::string error;  // the InputError's message, or ""
};

Outcome on_cpu(const std::vector<float>& values, const KvShape& s, const Scheme& scheme) {
  try {
    return {device_bytes(quantize(KvView::bnsh(values.data(), s), scheme, "layer 3 V"), CodeLayout::kPlanar), ""};
  } catch (const InputError& e) {
    return {{}, e.what()};
  }
}

Outcome on_gpu(const QuantizeVariant& v, const std::vector<float>& values, const KvShape& s, const Scheme& scheme,
               InputDtype dt, bool bsnh) {
  const DeviceInput in(values, s, dt, bsnh);
  try {
    return {run_quantize(v.launch, in.kv, scheme, CodeLayout::kPlanar, "layer 3 V"), ""};
  } catch (const InputError& e) {
    return {{}, e.what()};
  }
}

std::string first_difference(const char* what, const std::vector<uint8_t>& cpu, const std::vector<uint8_t>& gpu) {
  if (cpu.size() != gpu.size()) return std::string(what) + ": sizes differ";
  for (size_t i = 0; i < cpu.size(); ++i)
    if (cpu[i] != gpu[i])
      return std::string(what) + " byte " + std::to_string(i) + ": CPU " + std::to_string(cpu[i]) + ", GPU " +
             std::to_string(gpu[i]);
  return "";
}

void check_same(const Outcome& cpu, const Outcome& gpu) {
  CHECK(cpu.error == gpu.error);
  if (!cpu.error.empty() || !gpu.error.empty()) return;
  CHECK_MESSAGE(cpu.bytes.codes == gpu.bytes.codes, first_difference("codes", cpu.bytes.codes, gpu.bytes.codes));
  CHECK_MESSAGE(cpu.bytes.scales == gpu.bytes.scales, first_difference("scales", cpu.bytes.scales, gpu.bytes.scales));
  CHECK_MESSAGE(cpu.bytes.zeros == gpu.bytes.zeros, first_difference("zeros", cpu.bytes.zeros, gpu.bytes.zeros));
}

std::vector<Scheme> int_schemes(const char* granularity) {
  std::vector<Scheme> out;
  for (const char* bits : {"int8", "int4"})
    for (const char* sym : {"", "-asym"})
      for (const char* dtype : {"", "-fp32"})
        out.push_back(parse_scheme(std::string(bits) + "-" + granularity + sym + dtype));
  return out;
}

const char* kVariants[] = {"quantize-tokenteam", "quantize-tensor2pass"};
const char* kGranularity[] = {"token", "tensor"};

}  // namespace

TEST_CASE("wide-group variants take their granularity, D a multiple of 8 and the planar layout only") {
  for (int i = 0; i < 2; ++i) {
    const QuantizeVariant& v = variant(kVariants[i]);
    CAPTURE(v.name);
    for (const Scheme& s : int_schemes(kGranularity[i])) {
      CAPTURE(to_string(s));
      for (int64_t d : {8, 24, 64, 128, 256}) CHECK(v.accepts(s, d, CodeLayout::kPlanar, InputDtype::kBf16));
      for (int64_t d : {2, 6, 12, 100}) CHECK_FALSE(v.accepts(s, d, CodeLayout::kPlanar, InputDtype::kBf16));
      CHECK_FALSE(v.accepts(s, 128, CodeLayout::kFbgemm, InputDtype::kBf16));
    }
    CHECK_FALSE(v.accepts(parse_scheme("int8-head"), 128, CodeLayout::kPlanar, InputDtype::kBf16));
    CHECK_FALSE(v.accepts(parse_scheme(i == 0 ? "int8-tensor" : "int8-token"), 128, CodeLayout::kPlanar, InputDtype::kBf16));
    // Launched on a scheme it does not take, it says so instead of writing wrong bytes.
    const std::vector<float> x(128, 1.0f);
    const DeviceInput in(x, {1, 1, 1, 128}, InputDtype::kFp32, false);
    CHECK_THROWS_AS(run_quantize(v.launch, in.kv, parse_scheme("int8-head"), CodeLayout::kPlanar, "K"), InputError);
  }
}

TEST_CASE("wide-group variants equal the CPU quantizer on every scheme, dtype and many shapes") {
  // Per-token team sizes for D = 128: Hkv 1 -> 4 lanes, 2 -> 8, 4 -> 16, 8 -> 32; Hkv 8 D 256 -> 8
  // chunks a lane; Hkv 16 D 256 reads chunks twice; D = 8 one lane per token; D = 24, 40 not powers of two.
  const std::vector<KvShape> shapes = {{1, 1, 1, 8},    {2, 3, 5, 8},    {1, 1, 7, 64},   {3, 1, 11, 40},
                                       {2, 7, 3, 24},   {1, 1, 33, 128}, {2, 2, 9, 128},  {1, 4, 17, 128},
                                       {3, 5, 19, 128}, {1, 8, 129, 128}, {2, 8, 5, 256}, {1, 16, 3, 256},
                                       {2, 3, 0, 128},  {0, 2, 4, 64}};
  const InputDtype dtypes[] = {InputDtype::kBf16, InputDtype::kFp16, InputDtype::kFp32};
  uint32_t seed = 100;
  for (int i = 0; i < 2; ++i) {
    const QuantizeVariant& v = variant(kVariants[i]);
    for (const Scheme& scheme : int_schemes(kGranularity[i]))
      for (const KvShape& shape : shapes)
        for (InputDtype dt : dtypes) {
          CAPTURE(v.name);
          CAPTURE(to_string(scheme));
          const std::string dims = std::to_string(shape.batch) + "x" + std::to_string(shape.heads) + "x" +
                                 std::to_string(shape.tokens) + "x" + std::to_string(shape.head_dim);
          CAPTURE(dims);
          CAPTURE(to_string(dt));
          const std::vector<float> x = test_values(shape, ++seed, dt);
          check_same(on_cpu(x, shape, scheme), on_gpu(v, x, shape, scheme, dt, false));
          if (dt == InputDtype::kBf16) check_same(on_cpu(x, shape, scheme), on_gpu(v, x, shape, scheme, dt, true));
        }
  }
}

TEST_CASE("wide-group variants equal the CPU quantizer on tensors of many blocks") {
  // Per-tensor: hundreds of pass-1 blocks and a grid-strided pass 2; per-token: 16K tokens.
  const KvShape shape{3, 8, 1373, 128};
  const std::vector<float> x = test_values(shape, 7, InputDtype::kBf16);
  for (const char* name : {"int8-tensor", "int4-tensor-asym", "int8-tensor-asym-fp32"}) {
    CAPTURE(name);
    check_same(on_cpu(x, shape, parse_scheme(name)),
               on_gpu(variant("quantize-tensor2pass"), x, shape, parse_scheme(name), InputDtype::kBf16, false));
  }
  for (const char* name : {"int8-token", "int4-token-asym", "int4-token-fp32"}) {
    CAPTURE(name);
    check_same(on_cpu(x, shape, parse_scheme(name)),
               on_gpu(variant("quantize-tokenteam"), x, shape, parse_scheme(name), InputDtype::kBf16, false));
  }
}

TEST_CASE("wide-group variants report non-finite input and scale overflow with the CPU's message") {
  // Bad elements in the first and last chunk, in a head other than 0, in a token's re-read chunks
  // (Hkv 16, D 256), and two at once (the first in flat order is reported).
  const KvShape shape{2, 16, 9, 256};
  auto at = [&](int64_t b, int64_t h, int64_t t, int64_t d) {
    return static_cast<size_t>(((b * shape.heads + h) * shape.tokens + t) * shape.head_dim + d);
  };
  const std::vector<std::vector<std::pair<size_t, float>>> cases = {
      {{0, NAN}},
      {{at(1, 15, 8, 255), INFINITY}},
      {{at(1, 3, 4, 17), -INFINITY}},
      {{at(0, 15, 2, 200), -NAN}},
      {{at(1, 9, 7, 3), NAN}, {at(1, 2, 8, 100), INFINITY}},
  };
  for (int i = 0; i < 2; ++i)
    for (const Scheme& scheme : int_schemes(kGranularity[i]))
      for (InputDtype dt : {InputDtype::kFp32, InputDtype::kBf16})
        for (const auto& bad : cases) {
          CAPTURE(kVariants[i]);
          CAPTURE(to_string(scheme));
          CAPTURE(to_string(dt));
          CAPTURE(bad.front().first);
          std::vector<float> x = test_values(shape, 11, dt);
          for (const auto& [index, value] : bad) x[index] = round_to_input(value, dt);  // what the device holds
          const Outcome cpu = on_cpu(x, shape, scheme);
          REQUIRE(cpu.error.find("non-finite") != std::string::npos);
          check_same(cpu, on_gpu(variant(kVariants[i]), x, shape, scheme, dt, false));
        }
  // Overflow: an fp16 scale beyond 65504 (symmetric), an fp16 zero point below -65504 (asymmetric).
  for (int i = 0; i < 2; ++i)
    for (const char* suffix : {"", "-asym"}) {
      const Scheme scheme = parse_scheme(std::string("int8-") + kGranularity[i] + suffix);
      CAPTURE(to_string(scheme));
      std::vector<float> x = test_values(shape, 12, InputDtype::kFp32);
      x[at(1, 5, 6, 7)] = std::string(suffix).empty() ? 3e38f : -1e6f;
      const Outcome cpu = on_cpu(x, shape, scheme);
      REQUIRE(cpu.error.find("beyond the range") != std::string::npos);
      check_same(cpu, on_gpu(variant(kVariants[i]), x, shape, scheme, InputDtype::kFp32, false));
      // fp32 scales take it.
      const Scheme wide = parse_scheme(to_string(scheme) + "-fp32");
      check_same(on_cpu(x, shape, wide), on_gpu(variant(kVariants[i]), x, shape, wide, InputDtype::kFp32, false));
    }
}

TEST_CASE("wide-group variants give bitwise identical results on reruns") {
  const KvShape shape{4, 8, 700, 128};
  const std::vector<float> x = test_values(shape, 13, InputDtype::kBf16);
  const DeviceInput in(x, shape, InputDtype::kBf16, false);
  for (int i = 0; i < 2; ++i) {
    const Scheme scheme = parse_scheme(std::string("int4-") + kGranularity[i] + "-asym");
    CAPTURE(kVariants[i]);
    QuantizeWorkspace ws(in.kv, scheme, CodeLayout::kPlanar);
    variant(kVariants[i]).launch(ws.params(), nullptr);
    ws.check_flags("K", nullptr);
    const GpuQuantized first = ws.download();
    for (int r = 0; r < 5; ++r) {
      ws.reset();
      variant(kVariants[i]).launch(ws.params(), nullptr);
      ws.check_flags("K", nullptr);
      const GpuQuantized again = ws.download();
      CHECK(again.codes == first.codes);
      CHECK(again.scales == first.scales);
      CHECK(again.zeros == first.zeros);
    }
  }
}
