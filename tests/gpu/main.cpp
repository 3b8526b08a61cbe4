// GPU suites: without a CUDA device every test reports skipped (exit 77, ctest's SKIP_RETURN_CODE).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "gpu/device.hpp"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing |= std::string(argv[i]).rfind("--list", 0) == 0;
  if (!listing && !kvq::cuda_device_available()) {
    std::printf("skipped: no CUDA device: GPU kernels skipped\n");
    return 77;
  }
  const int result = context.run();
  return result;
}
