// The block formats on the GPU (gpu/quantize_blocks.cu, through quantize-generic) against the CPU
// quantizer byte for byte: codes, scales, mins and nvfp4's tensor scale, for every format, input
// dtype and head dim 64 / 96 / 128 / 256 on B = 3, H = 5, T = 37; BNSH, BSNH and padded rows whose
// starts are not 16-byte aligned; outputs at unaligned addresses; each rule's corners
// (experiments/gate/block_special_values.hpp) and the gate's zeros, ±65504 and constant rows; the
// device's mxfp4 exponent; nvfp4's device-computed tensor scale (deterministic) and a given one;
// +wW windows and +had; errors with the CPU's messages; empty tensors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "experiments/gate/block_special_values.hpp"
#include "experiments/gate/validate_quantize.hpp"
#include "gpu/block_formats_check.hpp"
#include "quant/quantize.hpp"

using namespace kvq;

namespace {

const char* kFormats[] = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4", "nvfp4"};
const InputDtype kDtypes[] = {InputDtype::kFp32, InputDtype::kFp16, InputDtype::kBf16};

// Normal values with outlier channels, exact zeros and quarter steps; representable in dt.
std::vector<float> random_values(const KvShape& s, uint32_t seed, InputDtype dt) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    float x = normal(rng) * (static_cast<int64_t>(i) % s.head_dim % 29 == 3 ? 20.0f : 1.0f);
    if (i % 37 == 5) x = 0.0f;
    if (i % 41 == 7) x = std::round(x * 4.0f) / 4.0f;
    v[i] = round_to_input(x, dt);
  }
  return v;
}

enum class Layout { kBnsh, kBsnh, kPadded };  // padded: BNSH rows D + 3 elements apart
const char* layout_name(Layout l) { return l == Layout::kBnsh ? "BNSH" : l == Layout::kBsnh ? "BSNH" : "padded"; }

// The logical tensor `values` ([B, H, T, D]) on the device in `layout`.
struct DeviceInput {
  DeviceBuffer<uint8_t> bytes;
  DeviceKv kv;
  DeviceInput(const std::vector<float>& values, const KvShape& s, InputDtype dt, Layout layout)
      : kv(DeviceKv::bnsh(nullptr, dt, s)) {
    const int64_t D = s.head_dim, row = layout == Layout::kPadded ? D + 3 : D;
    if (layout == Layout::kBsnh) kv.stride_b = s.tokens * s.heads * D, kv.stride_h = D, kv.stride_t = s.heads * D;
    if (layout == Layout::kPadded) kv.stride_t = row, kv.stride_h = s.tokens * row, kv.stride_b = s.heads * s.tokens * row;
    const int64_t n = std::max<int64_t>(s.batch * s.heads * s.tokens * row, 1);
    std::vector<uint8_t> host(static_cast<size_t>(n * element_bytes(dt)), 0xff);  // padding: NaN, never read
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t t = 0; t < s.tokens; ++t)
          for (int64_t d = 0; d < D; ++d) {
            const float x = values[static_cast<size_t>(((b * s.heads + h) * s.tokens + t) * D + d)];
            const int64_t at = b * kv.stride_b + h * kv.stride_h + t * kv.stride_t + d;
            if (dt == InputDtype::kFp32) {
              std::memcpy(host.data() + 4 * at, &x, 4);
            } else {
              const uint16_t bits = dt == InputDtype::kFp16 ? fp32_to_fp16_bits(x) : fp32_to_bf16_bits(x);
              std::memcpy(host.data() + 2 * at, &bits, 2);
            }
          }
    bytes = DeviceBuffer<uint8_t>(host);
    kv.data = bytes.data();
  }
};

struct Outcome {
  GpuQuantized bytes;
  std::string error;
};

Outcome on_cpu(const std::vector<float>& x, const KvShape& s, const Scheme& scheme, const std::vector<int32_t>& lens = {},
               std::optional<float> tensor_scale = std::nullopt) {
  try {
    return {device_bytes(quantize(KvView::bnsh(x.data(), s), scheme, "layer 2 K", lens.empty() ? nullptr : lens.data(),
                                  tensor_scale),
                         CodeLayout::kPlanar),
            ""};
  } catch (const InputError& e) {
    return {{}, e.what()};
  }
}

Outcome on_gpu(const DeviceInput& in, const Scheme& scheme, const std::vector<int32_t>& lens = {},
               std::optional<float> tensor_scale = std::nullopt) {
  try {
    return {run_quantize(launch_quantize_generic, in.kv, scheme, CodeLayout::kPlanar, "layer 2 K", nullptr, lens,
                         tensor_scale),
            ""};
  } catch (const InputError& e) {
    return {{}, e.what()};
  }
}

// "" when equal, else the first difference.
std::string difference(const Outcome& cpu, const Outcome& gpu) {
  if (cpu.error != gpu.error) return "CPU error '" + cpu.error + "', GPU error '" + gpu.error + "'";
  const std::pair<const char*, const std::vector<uint8_t>*> parts[] = {
      {"codes", &cpu.bytes.codes}, {"scales", &cpu.bytes.scales}, {"zeros", &cpu.bytes.zeros},
      {"tensor scale", &cpu.bytes.tensor_scale}};
  const std::vector<uint8_t>* mine[] = {&gpu.bytes.codes, &gpu.bytes.scales, &gpu.bytes.zeros, &gpu.bytes.tensor_scale};
  for (int i = 0; i < 4; ++i) {
    const std::vector<uint8_t>& a = *parts[i].second;
    const std::vector<uint8_t>& b = *mine[i];
    if (a.size() != b.size()) return std::string(parts[i].first) + ": sizes differ";
    for (size_t j = 0; j < a.size(); ++j)
      if (a[j] != b[j])
        return std::string(parts[i].first) + " byte " + std::to_string(j) + ": CPU " + std::to_string(a[j]) + ", GPU " +
               std::to_string(b[j]);
  }
  return "";
}

void check_same(const std::vector<float>& x, const KvShape& s, const char* scheme, InputDtype dt, Layout layout,
                const std::vector<int32_t>& lens = {}, std::optional<float> tensor_scale = std::nullopt) {
  const std::string scheme_name = scheme, dtype_name = to_string(dt), layout_str = layout_name(layout);
  CAPTURE(scheme_name);  // strings, not the pointers doctest would print for a const char*
  CAPTURE(dtype_name);
  CAPTURE(layout_str);
  const std::string dims = std::to_string(s.batch) + "x" + std::to_string(s.heads) + "x" + std::to_string(s.tokens) + "x" +
                           std::to_string(s.head_dim);
  CAPTURE(dims);
  const Scheme sc = parse_scheme(scheme);
  const Outcome cpu = on_cpu(x, s, sc, lens, tensor_scale);
  const Outcome gpu = on_gpu(DeviceInput(x, s, dt, layout), sc, lens, tensor_scale);
  const std::string why = difference(cpu, gpu);
  CHECK_MESSAGE(why.empty(), why);
}

}  // namespace

TEST_CASE("mxfp4's exponent on the device equals the host's near every power of two") {
  const Mxfp4ExponentCheck r = check_mxfp4_exponent();
  CHECK(r.checked > 1000000);
  CHECK_MESSAGE(r.ok(), r.mismatches << " mismatches, first amax bits " << r.first_bits << ": host " << r.host_e
                                     << ", device " << r.device_e);
}

TEST_CASE("block formats: GPU bytes equal the CPU's on random data, every dtype, D and layout") {
  for (int64_t D : {64, 96, 128, 256})
    for (const char* f : kFormats)
      for (InputDtype dt : kDtypes)
        for (Layout layout : {Layout::kBnsh, Layout::kBsnh, Layout::kPadded}) {
          const KvShape s{3, 5, 37, D};
          check_same(random_values(s, static_cast<uint32_t>(D) + 7, dt), s, f, dt, layout);
        }
  const KvShape nv{2, 3, 11, 48};  // nvfp4 alone takes D = 48 (blocks of 16)
  check_same(random_values(nv, 3, InputDtype::kBf16), nv, "nvfp4", InputDtype::kBf16, Layout::kPadded);
}

TEST_CASE("block formats: each rule's corners and the gate's special rows") {
  // 16-bit inputs: the special values as the device receives them (rounded to the dtype), on both sides
  for (const KvShape& s : {KvShape{2, 3, 12, 128}, KvShape{1, 2, 13, 256}})
    for (InputDtype dt : kDtypes) {
      std::vector<float> x = block_special_values(s);
      for (float& v : x) v = round_to_input(v, dt);
      for (const char* f : kFormats) check_same(x, s, f, dt, Layout::kBnsh);
    }
  // zeros, ±65504 (the largest fp16), constants, fp32 subnormals, a 1e-3..3e4 sweep, one row each
  const KvShape s{1, 1, 6, 128};
  std::vector<float> x(static_cast<size_t>(s.numel()), 0.0f);
  for (int64_t d = 0; d < 128; ++d) {
    x[128 + d] = d % 3 == 0 ? 65504.0f : d % 3 == 1 ? -65504.0f : 1.0f;
    x[256 + d] = 3.69921875f;
    x[384 + d] = 1e-40f * static_cast<float>(d);
    x[512 + d] = std::pow(10.0f, -3.0f + 7.5f * static_cast<float>(d) / 128.0f) * (d % 2 ? -1.0f : 1.0f);
    x[640 + d] = d % 2 ? -0.0f : 0.0f;
  }
  for (const char* f : kFormats) check_same(x, s, f, InputDtype::kFp32, Layout::kBsnh);
}

TEST_CASE("block formats: codes at unaligned output addresses") {
  const KvShape s{2, 3, 7, 128};
  const std::vector<float> x = random_values(s, 5, InputDtype::kBf16);
  const DeviceInput in(x, s, InputDtype::kBf16, Layout::kBnsh);
  for (const char* f : kFormats)
    for (int offset : {1, 4, 8}) {  // byte stores, 4-byte and 8-byte words instead of 16-byte ones
      CAPTURE(f);
      CAPTURE(offset);
      const Scheme sc = parse_scheme(f);
      const QuantizedSizes z = quantized_sizes(sc, s, CodeLayout::kPlanar);
      DeviceBuffer<uint8_t> codes(static_cast<size_t>(z.codes + 16)), scales(static_cast<size_t>(z.scales)),
          zeros(static_cast<size_t>(std::max<int64_t>(z.zeros, 1)));
      DeviceBuffer<float> ts(1);
      codes.fill_bytes(0xa5);
      QuantizeOutputs out{codes.data() + offset, scales.data(), zeros.data(), ts.data()};
      QuantizeWorkspace ws(in.kv, sc, CodeLayout::kPlanar, {}, &out);
      launch_quantize_generic(ws.params(), nullptr);
      ws.check_flags("K", nullptr);
      const std::vector<uint8_t> all = codes.download();
      const GpuQuantized cpu = device_bytes(quantize(KvView::bnsh(x.data(), s), sc, "K"), CodeLayout::kPlanar);
      CHECK(std::vector<uint8_t>(all.begin() + offset, all.begin() + offset + z.codes) == cpu.codes);
      CHECK(all[static_cast<size_t>(offset - 1)] == 0xa5);  // nothing written outside
      CHECK(all[static_cast<size_t>(offset + z.codes)] == 0xa5);
      CHECK(scales.download() == cpu.scales);
    }
}

TEST_CASE("nvfp4's tensor scale: computed on the device, deterministic, or given") {
  const KvShape s{4, 8, 300, 128};
  std::vector<float> x = random_values(s, 9, InputDtype::kBf16);
  x[static_cast<size_t>(s.numel() - 77)] = -150.0f;  // the amax (the outliers stay below 130), near the end
  const DeviceInput in(x, s, InputDtype::kBf16, Layout::kBnsh);
  const Scheme nv = parse_scheme("nvfp4");
  QuantizeWorkspace ws(in.kv, nv, CodeLayout::kPlanar);
  const GpuQuantized cpu = device_bytes(quantize(KvView::bnsh(x.data(), s), nv, "K"), CodeLayout::kPlanar);
  const float expected = 150.0f / 2688.0f;
  float got = 0.0f;
  for (int i = 0; i < 20; ++i) {
    ws.reset();
    launch_quantize_generic(ws.params(), nullptr);
    ws.check_flags("K", nullptr);
    const GpuQuantized q = ws.download();
    REQUIRE(q.tensor_scale.size() == 4);
    std::memcpy(&got, q.tensor_scale.data(), 4);
    CHECK(got == expected);
    CHECK(q.codes == cpu.codes);
    CHECK(q.scales == cpu.scales);
  }
  const KvShape small{2, 3, 9, 64};
  const std::vector<float> y = random_values(small, 4, InputDtype::kFp32);
  for (float ts : {0.01f, 0.0f, 1e-30f, 3.5f})  // saturating codes, the zero tensor's rule, tiny, coarse
    check_same(y, small, "nvfp4", InputDtype::kFp32, Layout::kBsnh, {}, ts);
  for (float ts : {-1.0f, NAN, INFINITY}) {  // the CPU's message, naming the tensor
    const Outcome gpu = on_gpu(DeviceInput(y, small, InputDtype::kFp32, Layout::kBnsh), nv, {}, ts);
    CHECK(gpu.error == on_cpu(y, small, nv, {}, ts).error);
    CHECK(gpu.error.find("layer 2 K: nvfp4 tensor scale") == 0);
  }
  const Outcome other = on_gpu(DeviceInput(y, small, InputDtype::kFp32, Layout::kBnsh), parse_scheme("q4_0"), {}, 1.0f);
  CHECK(other.error == on_cpu(y, small, parse_scheme("q4_0"), {}, 1.0f).error);  // the CPU codec's refusal
  CHECK(other.error.find("q4_0: a tensor scale is given, but only nvfp4") == 0);
}

TEST_CASE("block formats with +wW windows and +had, over varlen batches") {
  const KvShape s{4, 2, 45, 64};
  const int32_t T = static_cast<int32_t>(s.tokens);
  for (const char* f : {"q8_0+w16", "q4_1+w8", "q5_0+w0", "iq4_nl+w20", "mxfp4+w5", "nvfp4+w8", "q4_0+had",
                        "q5_1+had", "nvfp4+had", "mxfp4+had+w7", "q8_0+had+w16"})
    for (InputDtype dt : {InputDtype::kBf16, InputDtype::kFp32})
      check_same(random_values(s, 6, dt), s, f, dt, Layout::kBsnh, {T, 0, T / 2 + 3, 7});
}

TEST_CASE("block formats: bad input gives the CPU's message") {
  const KvShape s{2, 3, 20, 128};
  for (const char* f : kFormats) {
    std::vector<float> bad = random_values(s, 7, InputDtype::kFp32);
    bad[static_cast<size_t>(((1 * 3 + 2) * 20 + 9) * 128 + 1)] = INFINITY;
    bad[static_cast<size_t>(((1 * 3 + 2) * 20 + 5) * 128 + 17)] = NAN;  // the first in [B, H, T, D] order
    check_same(bad, s, f, InputDtype::kFp32, Layout::kBnsh);
    const Outcome gpu = on_gpu(DeviceInput(bad, s, InputDtype::kFp32, Layout::kBnsh), parse_scheme(f));
    CHECK(gpu.error.find("layer 2 K: non-finite value nan at [1, 2, 5, 17]") == 0);
  }
  // A d or min beyond fp16 names its block (mxfp4 / nvfp4 cannot overflow: bytes compared instead).
  for (const char* f : kFormats) {
    std::vector<float> huge = random_values(s, 8, InputDtype::kFp32);
    huge[static_cast<size_t>(((0 * 3 + 1) * 20 + 3) * 128 + 70)] = 3e38f;
    std::fill_n(huge.begin() + ((1 * 3 + 0) * 20 + 2) * 128 + 96, 32, -70000.0f);  // q4_1 / q5_1's min alone
    check_same(huge, s, f, InputDtype::kFp32, Layout::kBnsh);
    const std::string want = parse_scheme(f).format == CodeFormat::kMxfp4 || parse_scheme(f).format == CodeFormat::kNvfp4
                                 ? ""
                                 : std::string("layer 2 K: ") + f + " group 94 starting at [0, 1, 3, 64]";
    CHECK(on_gpu(DeviceInput(huge, s, InputDtype::kFp32, Layout::kBnsh), parse_scheme(f)).error.find(want) == 0);
  }
}

TEST_CASE("block formats: empty tensors write nothing but nvfp4's tensor scale (0)") {
  for (const KvShape& s : {KvShape{2, 3, 0, 64}, KvShape{0, 3, 5, 64}})
    for (const char* f : kFormats) check_same({}, s, f, InputDtype::kBf16, Layout::kBnsh);
}

TEST_CASE("the registry: quantize-generic takes the block formats planar, no other variant takes them") {
  for (const char* f : kFormats)
    for (const QuantizeVariant& v : quantize_variants()) {
      CAPTURE(f);
      CAPTURE(v.name);
      CHECK(v.accepts(parse_scheme(f), 128, CodeLayout::kPlanar, InputDtype::kBf16) == v.incumbent);
      CHECK_FALSE(v.accepts(parse_scheme(f), 128, CodeLayout::kFbgemm, InputDtype::kBf16));
      CHECK_FALSE(v.accepts(parse_scheme(f), 40, CodeLayout::kPlanar, InputDtype::kBf16));
    }
  const DeviceBuffer<uint8_t> x(2 * 1 * 1 * 4 * 128);
  CHECK_THROWS_AS(QuantizeWorkspace(DeviceKv::bnsh(x.data(), InputDtype::kBf16, {1, 1, 4, 128}), parse_scheme("q4_1"),
                                    CodeLayout::kFbgemm),
                  SchemeError);
}
