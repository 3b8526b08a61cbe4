#include "experiments/bench/bench_input.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "quant/errors.hpp"
#include "quant/float_formats.hpp"

namespace kvq {

BenchInput parse_bench_input(const std::string& name) {
  if (name == "uniform") return BenchInput::kUniform;
  if (name == "gaussian-rows") return BenchInput::kGaussianRows;
  throw InputError(fmt::format("bench input '{}': expected uniform or gaussian-rows", name));
}

const char* bench_input_name(BenchInput input) {
  return input == BenchInput::kUniform ? "uniform" : "gaussian-rows";
}

std::vector<uint16_t> bench_input_pattern(BenchInput input, int64_t elements, int64_t row, uint32_t seed) {
  if (row <= 0) throw InputError(fmt::format("bench input: row length {} is not positive", row));
  constexpr int64_t kMaxPattern = int64_t{1} << 22;
  int64_t n = std::min<int64_t>(std::max<int64_t>(elements, 1), kMaxPattern);
  std::vector<uint16_t> bits;
  if (input == BenchInput::kUniform) {  // an LCG: the committed runs' bytes
    bits.resize(static_cast<size_t>(n));
    uint32_t state = seed;
    for (uint16_t& b : bits) {
      state = state * 1664525u + 1013904223u;
      b = fp32_to_bf16_bits((static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 8.0f);
    }
    return bits;
  }
  // Rows' standard deviations log-uniform in [0.05, 5], as a cache's heads and tokens differ; two
  // channels of every row 8 times larger, as a few of a real K's channels are.
  n = std::max(row, n / row * row);
  bits.resize(static_cast<size_t>(n));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> log_std(std::log(0.05), std::log(5.0));
  std::normal_distribution<double> normal;
  const int64_t outlier_a = std::min<int64_t>(3, row - 1), outlier_b = row * 5 / 8;
  for (int64_t r = 0; r < n / row; ++r) {
    const double stddev = std::exp(log_std(rng));
    for (int64_t d = 0; d < row; ++d) {
      const double x = normal(rng) * stddev * (d == outlier_a || d == outlier_b ? 8.0 : 1.0);
      bits[static_cast<size_t>(r * row + d)] = fp32_to_bf16_bits(static_cast<float>(x));
    }
  }
  return bits;
}

}  // namespace kvq
