// The GPU runtime layer as seen from a machine without a device (CI): one clear sentence, no crash.
#include <doctest/doctest.h>

#include "gpu/quantize.hpp"
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
