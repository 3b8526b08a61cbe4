// Proof (or the exact counter-example) that the hardware FP8 conversions equal the codec's
// software definitions: every finite fp32 pattern through __nv_cvt_float_to_fp8(..., __NV_SATFINITE,
// e4m3 / e5m2), every code back through __nv_cvt_fp8_to_halfraw, compared on the device.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "gpu/device.hpp"
#include "gpu/fp8_check.hpp"
#include "quant/codec.hpp"
#include "quant/float_formats.hpp"

namespace kvq {
namespace {

// counters: [0] e4m3 mismatches, [1] e4m3 first bits, [2] e5m2 mismatches, [3] e5m2 first bits,
// [4] non-finite mismatches, [5] decode mismatches.
__global__ void to_fp8_kernel(unsigned long long* counters) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  unsigned long long bad4 = 0, bad5 = 0, bad_nonfinite = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < (1ull << 32); i += stride) {
    const uint32_t bits = static_cast<uint32_t>(i);
    const float f = bits_float(bits);
    const bool finite = (bits & 0x7f800000u) != 0x7f800000u;
    const uint8_t hw4 = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
    const uint8_t hw5 = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2);
    const bool d4 = hw4 != fp32_to_fp8_bits_soft(f, fp8_e4m3()), d5 = hw5 != fp32_to_fp8_bits_soft(f, fp8_e5m2());
    if (!finite) {
      bad_nonfinite += d4 + d5;
      continue;
    }
    if (d4) ++bad4, atomicMin(counters + 1, static_cast<unsigned long long>(bits));
    if (d5) ++bad5, atomicMin(counters + 3, static_cast<unsigned long long>(bits));
  }
  if (bad4) atomicAdd(counters + 0, bad4);
  if (bad5) atomicAdd(counters + 2, bad5);
  if (bad_nonfinite) atomicAdd(counters + 4, bad_nonfinite);
}

__global__ void from_fp8_kernel(unsigned long long* counters) {
  const uint32_t c = threadIdx.x;  // one block of 256
  for (int e5 = 0; e5 < 2; ++e5) {
    const Fp8Format f = e5 ? fp8_e5m2() : fp8_e4m3();
    const float sw = fp8_bits_to_fp32(static_cast<uint8_t>(c), f);
    if (sw != sw) continue;  // NaN codes: any NaN will do
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), e5 ? __NV_E5M2 : __NV_E4M3);
    const float hw = __half2float(__half(h));
    if (float_bits(hw) != float_bits(sw)) atomicAdd(counters + 5, 1ull);
  }
}

// counters: [0] mismatches, [1] first mismatching bits, [2] not sure, [3] finite ones not sure.
// Each thread codes runs of 8 consecutive patterns, as the quantize kernels code 8-element chunks.
__global__ void coder_kernel(GroupParams p, CodeFormat format, unsigned long long* counters) {
  const Fp8Coder coder = fp8_coder(p);
  const Fp8Format f = fp8_format(format);
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  unsigned long long bad = 0, not_sure = 0, finite_not_sure = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < (1ull << 29); i += stride) {
    float x[8];
    for (int e = 0; e < 8; ++e) x[e] = bits_float(static_cast<uint32_t>(8 * i + e));
    uint32_t w[2];
    bool sure = true;
    coder.codes8(x, f, w, sure);
    for (int e = 0; e < 8; ++e) {
      const int want = encode_fp8(x[e], p.scale, format), got = (w[e / 4] >> (8 * (e % 4))) & 0xff;
      if (sure && got != want) ++bad, atomicMin(counters + 1, static_cast<unsigned long long>(8 * i + e));
    }
    if (!sure) {  // per chunk, as kernels fall back; then by element, which of them needed it
      for (int e = 0; e < 8; ++e) {
        bool one = true;
        uint32_t w1[2];
        const float x1[8] = {x[e], 0, 0, 0, 0, 0, 0, 0};
        coder.codes8(x1, f, w1, one);
        not_sure += !one;
        finite_not_sure += !one && is_finite_float(x[e]) && is_finite_float(ieee_div(x[e], p.scale));
      }
    }
  }
  if (bad) atomicAdd(counters + 0, bad);
  if (not_sure) atomicAdd(counters + 2, not_sure);
  if (finite_not_sure) atomicAdd(counters + 3, finite_not_sure);
}

__global__ void convert_one_kernel(const float* in, uint8_t* out, bool e5) {
  out[0] = __nv_cvt_float_to_fp8(in[0], __NV_SATFINITE, e5 ? __NV_E5M2 : __NV_E4M3);
}

}  // namespace

Fp8CheckResult check_fp8_conversions() {
  require_device();
  DeviceBuffer<unsigned long long> counters(6);
  counters.fill_bytes(0);
  KVQ_CUDA_CHECK(cudaMemset(counters.data() + 1, 0xff, 8));
  KVQ_CUDA_CHECK(cudaMemset(counters.data() + 3, 0xff, 8));
  to_fp8_kernel<<<4096, 256>>>(counters.data());
  KVQ_CHECK_LAUNCH();
  from_fp8_kernel<<<1, 256>>>(counters.data());
  KVQ_CHECK_LAUNCH();
  const std::vector<unsigned long long> c = counters.download();
  Fp8CheckResult r{c[0], c[1], c[2], c[3], 0, 0, 0, 0, c[4], c[5]};
  // The codes at the first mismatches, recomputed on the host side of the comparison: the software
  // code here, the hardware code by one more device conversion.
  auto hw_code = [](unsigned long long bits, bool e5) {
    DeviceBuffer<float> in(std::vector<float>{bits_float(static_cast<uint32_t>(bits))});
    DeviceBuffer<uint8_t> out(1);
    convert_one_kernel<<<1, 1>>>(in.data(), out.data(), e5);
    KVQ_CHECK_LAUNCH();
    return out.download()[0];
  };
  if (r.e4m3_mismatches) {
    r.e4m3_first_hw = hw_code(r.e4m3_first_bits, false);
    r.e4m3_first_sw = fp32_to_fp8_bits_soft(bits_float(static_cast<uint32_t>(r.e4m3_first_bits)), fp8_e4m3());
  }
  if (r.e5m2_mismatches) {
    r.e5m2_first_hw = hw_code(r.e5m2_first_bits, true);
    r.e5m2_first_sw = fp32_to_fp8_bits_soft(bits_float(static_cast<uint32_t>(r.e5m2_first_bits)), fp8_e5m2());
  }
  return r;
}

Fp8CoderCheck check_fp8_coder(float scale, bool e5m2) {
  require_device();
  DeviceBuffer<unsigned long long> counters(4);
  counters.fill_bytes(0);
  KVQ_CUDA_CHECK(cudaMemset(counters.data() + 1, 0xff, 8));
  coder_kernel<<<4096, 256>>>(stored_params(scale, 0.0f), e5m2 ? CodeFormat::kFp8E5M2 : CodeFormat::kFp8E4M3,
                              counters.data());
  KVQ_CHECK_LAUNCH();
  const std::vector<unsigned long long> c = counters.download();
  return {scale, e5m2, c[0], c[1], c[2], c[3]};
}

}  // namespace kvq
