// GPU quantize variants against the CPU codec (the quick gate), the runtime layer, and timing.
#include <doctest/doctest.h>

#include "experiments/gate/validate_quantize.hpp"
#include "gpu/float_formats_check.hpp"
#include "gpu/timing.hpp"
#include "quant/quantize.hpp"

using namespace kvq;

TEST_CASE("device probe reports a real device") {
  const DeviceInfo d = device_info();
  CHECK(!d.name.empty());
  CHECK(d.sm_count > 0);
  CHECK(d.l2_bytes > 0);
  CHECK(d.driver_version >= d.runtime_version / 1000 * 1000);
}

TEST_CASE("the device's fp16 conversions equal the codec's integer definition for every pattern") {
  const Fp16CheckResult r = check_fp16_conversions();
  CHECK(r.to_fp16_mismatches == 0);
  CHECK(r.to_fp32_mismatches == 0);
}

TEST_CASE("device buffers round-trip and poison") {
  DeviceBuffer<float> b(std::vector<float>{1.5f, -2.0f, 3.25f});
  CHECK(b.download() == std::vector<float>{1.5f, -2.0f, 3.25f});
  DeviceBuffer<uint8_t> u(5);
  u.fill_bytes(0xa5);
  CHECK(u.download() == std::vector<uint8_t>(5, 0xa5));
  CHECK_THROWS_AS(b.upload(std::vector<float>(2)), CudaError);
}

TEST_CASE("every quantize variant passes the quick gate bit for bit") {
  for (const QuantizeVariant& v : quantize_variants()) {
    CAPTURE(v.name);
    int cases = 0;
    const std::vector<CaseResult> results = validate_quantize_variant(v, {true, 3, ""}, [&](const CaseResult& r) {
      ++cases;
      CHECK_MESSAGE(r.ok, r.name << " " << r.scheme << " " << r.dtype << " " << r.layout << " " << r.shape << ": " << r.detail);
    });
    CHECK(cases > 50);  // the variant accepted a real share of the cases
  }
}

TEST_CASE("non-finite input gives the CPU's message on the GPU") {
  const KvShape shape{1, 2, 4, 128};
  std::vector<float> x(shape.numel(), 1.0f);
  x[(1 * 4 + 2) * 128 + 5] = NAN;
  std::string cpu;
  try {
    quantize(KvView::bnsh(x.data(), shape), parse_scheme("int8-head"), "layer 0 K");
  } catch (const InputError& e) {
    cpu = e.what();
  }
  REQUIRE(!cpu.empty());
  const DeviceBuffer<float> input(x);
  for (const QuantizeVariant& v : quantize_variants()) {
    CAPTURE(v.name);
    // The first of these schemes the variant takes (the message does not depend on the scheme).
    std::string scheme;
    for (const char* name : {"int8-head", "int8-token", "int8-tensor"})
      if (scheme.empty() && v.accepts(parse_scheme(name), 128, CodeLayout::kPlanar, InputDtype::kFp32)) scheme = name;
    REQUIRE(!scheme.empty());
    std::string gpu;
    try {
      run_quantize(v.launch, DeviceKv::bnsh(input.data(), InputDtype::kFp32, shape), parse_scheme(scheme),
                   CodeLayout::kPlanar, "layer 0 K");
    } catch (const InputError& e) {
      gpu = e.what();
    }
    CHECK(gpu == cpu);
  }
}

TEST_CASE("graph-replay timing and copy bandwidth are positive and ordered") {
  DeviceBuffer<uint8_t> a(64 << 20), b(64 << 20);
  const GpuTiming t = time_graph_replays(
      [&](cudaStream_t s, int) { KVQ_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), a.bytes(), cudaMemcpyDeviceToDevice, s)); },
      1, 10, 2);
  CHECK(t.reps == 10);
  CHECK(t.p10_us > 0);
  CHECK(t.p10_us <= t.median_us);
  CHECK(t.median_us <= t.p90_us);
  CHECK(copy_bandwidth_gbps(64 << 20, 5) > 100.0);  // any datacenter GPU copies far faster
}
