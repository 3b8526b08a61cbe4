// The bf16 values kvq's GPU benches time on. Their values decide how often the integer coders take
// their half-step path (a bf16 value on a half-step of a power-of-two scale), so the input is named
// with every quantize row: experiments/results/nvidia-h200/quantize-int8-residual/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvq {

enum class BenchInput {
  kUniform,       // uniform in [-4, 4): the input of every committed run before the choice existed
  kGaussianRows,  // Gaussian rows whose scales spread over two decades, two outlier channels (x8)
};

// "uniform" or "gaussian-rows"; InputError naming the choices otherwise.
BenchInput parse_bench_input(const std::string& name);
const char* bench_input_name(BenchInput input);

// The bit patterns a bench repeats to fill its buffers: min(elements, 2^22) of them, for rows of
// `row` elements (> 0) a whole number of rows (at least one), the same for the same seed.
std::vector<uint16_t> bench_input_pattern(BenchInput input, int64_t elements, int64_t row, uint32_t seed);

}  // namespace kvq
