// The bench inputs (experiments/bench/bench_input.hpp): the committed runs' bytes kept, whole rows,
// and the property that makes the choice matter: how many int8-head groups get a short scale.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "experiments/bench/bench_input.hpp"
#include "quant/codec.hpp"
#include "quant/errors.hpp"
#include "quant/float_formats.hpp"
#include "quant/scheme.hpp"

using namespace kvq;

namespace {
// Share of `group`-element groups whose int8-head scale has <= 4 significant bits.
double short_scale_share(const std::vector<uint16_t>& bits, int group) {
  const Scheme scheme = parse_scheme("int8-head");
  int64_t groups = 0, short_scales = 0;
  for (size_t g = 0; g + group <= bits.size(); g += group, ++groups) {
    float amax = 0.0f;
    for (int i = 0; i < group; ++i) amax = std::max(amax, std::fabs(bf16_bits_to_fp32(bits[g + i])));
    short_scales += (float_bits(symmetric_params(amax, scheme).scale) & 0xfffffu) == 0;
  }
  return static_cast<double>(short_scales) / static_cast<double>(groups);
}
}  // namespace

TEST_CASE("bench input: uniform keeps the committed runs' bytes, gaussian-rows fills whole rows of varied scale") {
  const std::vector<uint16_t> uniform = bench_input_pattern(BenchInput::kUniform, 1000, 128, 12345);
  REQUIRE(uniform.size() == 1000);  // the uniform pattern ignores rows, as before the choice
  CHECK(bf16_bits_to_fp32(uniform[0]) == round_to_bf16(-3.8367786407470703f));  // the LCG's first draw
  for (uint16_t b : uniform) CHECK(std::fabs(bf16_bits_to_fp32(b)) <= 4.0f);
  CHECK(bench_input_pattern(BenchInput::kUniform, int64_t{1} << 30, 1, 7).size() == size_t{1} << 22);

  const std::vector<uint16_t> rows = bench_input_pattern(BenchInput::kGaussianRows, 100'000, 96, 3);
  REQUIRE(rows.size() == 100'000 / 96 * 96);
  CHECK(rows == bench_input_pattern(BenchInput::kGaussianRows, 100'000, 96, 3));
  CHECK(rows != bench_input_pattern(BenchInput::kGaussianRows, 100'000, 96, 4));
  CHECK(bench_input_pattern(BenchInput::kGaussianRows, 10, 96, 3).size() == 96);  // at least one row
  float lo = INFINITY, hi = 0.0f;
  for (size_t r = 0; r < rows.size(); r += 96) {
    float amax = 0.0f;
    for (int d = 0; d < 96; ++d) amax = std::max(amax, std::fabs(bf16_bits_to_fp32(rows[r + d])));
    REQUIRE(std::isfinite(amax));
    lo = std::min(lo, amax), hi = std::max(hi, amax);
  }
  CHECK(hi / lo > 20.0f);  // two decades of row scale

  CHECK(parse_bench_input("gaussian-rows") == BenchInput::kGaussianRows);
  CHECK(std::string(bench_input_name(parse_bench_input("uniform"))) == "uniform");
  CHECK_THROWS_AS(parse_bench_input("normal"), InputError);
  CHECK_THROWS_AS(bench_input_pattern(BenchInput::kGaussianRows, 10, 0, 1), InputError);
}

TEST_CASE("bench input: the uniform draw gives int8-head groups power-of-two scales far more often than varied rows") {
  // The largest |x| of a uniform [-4, 4) group is often 3.96875 = 127 / 32 (scale 2^-5), on whose
  // half-steps bf16 values fall: the integer coders' tie path runs far more than on a real cache.
  const double uniform = short_scale_share(bench_input_pattern(BenchInput::kUniform, 1 << 20, 128, 12345), 128);
  const double rows = short_scale_share(bench_input_pattern(BenchInput::kGaussianRows, 1 << 20, 128, 1), 128);
  CAPTURE(uniform);
  CAPTURE(rows);
  CHECK(uniform > 0.15);
  CHECK(rows < 0.03);
}
