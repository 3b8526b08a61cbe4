// The +had rotation on the device equals the host's bit for bit.
#include <doctest/doctest.h>

#include <random>

#include "gpu/hadamard_check.hpp"
#include "quant/hadamard.hpp"
#include "quant/host_device.hpp"

using namespace kvq;

TEST_CASE("the device's Hadamard rotation equals the host's bit for bit") {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t d : {1, 2, 4, 8, 64, 128, 256}) {
    CAPTURE(d);
    std::vector<float> rows(static_cast<size_t>(d) * 300);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = normal(rng) * (i % 29 == 3 ? 50.0f : 1.0f);
    rows[0] = 65504.0f, rows[rows.size() - 1] = -1e-40f;  // large and subnormal values
    std::vector<float> host = rows;
    for (size_t r = 0; r < rows.size(); r += static_cast<size_t>(d)) hadamard_rotate(host.data() + r, d);
    const std::vector<float> device = hadamard_rotate_on_device(rows, d);
    REQUIRE(device.size() == host.size());
    size_t differing = 0;
    for (size_t i = 0; i < host.size(); ++i) differing += float_bits(host[i]) != float_bits(device[i]);
    CHECK(differing == 0);
  }
}
