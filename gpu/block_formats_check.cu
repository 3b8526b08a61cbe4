#include "gpu/block_formats_check.hpp"

#include <algorithm>
#include <vector>

#include "gpu/device.hpp"
#include "quant/block_formats.hpp"

namespace kvq {
namespace {

__global__ void mxfp4_exponent_kernel(const uint32_t* bits, int64_t n, int32_t* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = mxfp4_exponent(bits_float(bits[i]));
}

// Every float within 2^12 below and 2^6 above each power of two (subnormal ones included), a stride
// of 4099 patterns through all positive finite floats, and +inf (a +had overflow reaches it).
std::vector<uint32_t> amax_patterns() {
  std::vector<uint32_t> v;
  for (int e = -149; e <= 127; ++e) {
    const uint32_t p = e < -126 ? 1u << (e + 149) : static_cast<uint32_t>(e + 127) << 23;
    for (uint32_t b = p > 4096 ? p - 4096 : 1; b < std::min(p + 64, 0x7f800000u); ++b) v.push_back(b);
  }
  for (uint32_t b = 1; b < 0x7f800000u; b += 4099) v.push_back(b);
  v.push_back(0x7f800000u);
  return v;
}

}  // namespace

Mxfp4ExponentCheck check_mxfp4_exponent() {
  require_device();
  const std::vector<uint32_t> bits = amax_patterns();
  const int64_t n = static_cast<int64_t>(bits.size());
  DeviceBuffer<uint32_t> in(bits);
  DeviceBuffer<int32_t> out(bits.size());
  mxfp4_exponent_kernel<<<static_cast<int>((n + 255) / 256), 256>>>(in.data(), n, out.data());
  KVQ_CHECK_LAUNCH();
  const std::vector<int32_t> device = out.download();
  Mxfp4ExponentCheck r;
  r.checked = n;
  for (int64_t i = 0; i < n; ++i) {
    const int host = mxfp4_exponent(bits_float(bits[i]));
    if (host == device[i]) continue;
    if (r.mismatches++ == 0) r.first_bits = bits[i], r.host_e = host, r.device_e = device[i];
  }
  return r;
}

}  // namespace kvq
