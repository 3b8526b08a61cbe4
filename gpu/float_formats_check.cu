// Proof that the GPU's fp16 conversions equal the integer definitions in quant/float_formats.hpp:
// every one of the 2^32 fp32 bit patterns and 2^16 fp16 patterns, compared on the device.
#include "gpu/float_formats_check.hpp"

#include "gpu/device.hpp"
#include "quant/float_formats.hpp"

namespace kvq {
namespace {

__global__ void fp32_to_fp16_kernel(unsigned long long* mismatches, unsigned long long* first) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  unsigned long long bad = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < (1ull << 32); i += stride) {
    const float f = bits_float(static_cast<uint32_t>(i));
    if (fp32_to_fp16_bits(f) != fp32_to_fp16_bits_soft(f)) {
      ++bad;
      atomicMin(first, static_cast<unsigned long long>(i));
    }
  }
  if (bad) atomicAdd(mismatches, bad);
}

__global__ void fp16_to_fp32_kernel(unsigned long long* mismatches, unsigned long long* first) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 65536) return;
  if (float_bits(fp16_bits_to_fp32(uint16_t(i))) != float_bits(fp16_bits_to_fp32_soft(uint16_t(i)))) {
    atomicAdd(mismatches, 1ull);
    atomicMin(first, static_cast<unsigned long long>(i));
  }
}

}  // namespace

Fp16CheckResult check_fp16_conversions() {
  require_device();
  DeviceBuffer<unsigned long long> counters(4);
  counters.fill_bytes(0);
  KVQ_CUDA_CHECK(cudaMemset(counters.data() + 1, 0xff, 8));
  KVQ_CUDA_CHECK(cudaMemset(counters.data() + 3, 0xff, 8));
  fp32_to_fp16_kernel<<<4096, 256>>>(counters.data(), counters.data() + 1);
  KVQ_CHECK_LAUNCH();
  fp16_to_fp32_kernel<<<256, 256>>>(counters.data() + 2, counters.data() + 3);
  KVQ_CHECK_LAUNCH();
  const std::vector<unsigned long long> c = counters.download();
  return {c[0], c[1], c[2], c[3]};
}

}  // namespace kvq
