// The GPU runtime layer as seen from a machine without a device (CI): one clear sentence, no crash.
#include <doctest/doctest.h>

#include "gpu/quantize.hpp"
#include "gpu/timing.hpp"
#include "test_util.hpp"

using namespace kvq;

TEST_CASE("GPU entry points say there is no device in one sentence") {
  if (cuda_device_available()) {  // on a GPU machine the same calls succeed
    CHECK_NOTHROW(require_device());
    CHECK(device_info().sm_count > 0);
    return;
  }
  const std::string expected = "no CUDA device: GPU kernels skipped";
  CHECK(test::message_of<NoDeviceError>([] { require_device(); }) == expected);
  CHECK(test::message_of<NoDeviceError>([] { device_info(); }) == expected);
  std::vector<float> host(16, 1.0f);
  CHECK(test::message_of<NoDeviceError>([&] {
          run_quantize(launch_quantize_generic, DeviceKv::bnsh(host.data(), InputDtype::kFp32, {1, 1, 2, 8}),
                       parse_scheme("int8-head"), CodeLayout::kPlanar, "K");
        }) == expected);
}

TEST_CASE("a build whose kernels were compiled only to check that they build refuses to time them") {
  // KVQ_EXPECT_COMPILE_CHECK: the build's KVQ_CUDA_COMPILE_CHECK (tests/CMakeLists.txt), so the
  // option must reach the kernels' library.
  CHECK(kernels_optimized() == !KVQ_EXPECT_COMPILE_CHECK);
  if (kernels_optimized()) return;
  for (const auto& timed : std::vector<std::function<void()>>{[] { time_graph_replays([](cudaStream_t, int) {}, 1); },
                                                              [] { copy_bandwidth_gbps(1 << 20); },
                                                              [] { read_bandwidth_gbps(1 << 20); },
                                                              [] { empty_kernel_us(1); }})
    CHECK(test::message_of<CudaError>(timed).find("KVQ_CUDA_COMPILE_CHECK=ON") != std::string::npos);
}
