// Planar codes back to fp32: one thread per element, quant/planar_codes.hpp's arithmetic (the
// CPU's). kvq eval's GPU engine reads its quantized cache through it.
#include "gpu/cuda_check.hpp"
#include "gpu/quantize.hpp"
#include "quant/groups.hpp"
#include "quant/planar_codes.hpp"

namespace kvq {
namespace {

__global__ void dequantize_kernel(const DequantizeParams p) {
  const KvShape& x = p.shape;
  const int64_t row_bytes = code_bytes_per_row(p.scheme, x.head_dim);
  const float tensor_scale = p.tensor_scale ? *p.tensor_scale : 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < x.numel(); i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % x.head_dim, r = i / x.head_dim;
    const int64_t t = r % x.tokens, h = (r / x.tokens) % x.heads, b = r / (x.tokens * x.heads);
    const int code = planar_code(p.scheme, p.codes + r * row_bytes, x.head_dim, d);
    float scale = 1.0f, zero = 0.0f;
    if (!p.scheme.scale_free) {
      const int64_t g = group_of(p.scheme, x, b, h, t, d);
      scale = stored_param(p.scales, g, p.scheme.scale_dtype);
      if (p.scheme.asymmetric) zero = stored_param(p.zeros, g, p.scheme.scale_dtype);
    }
    p.out[i] = dequantized_value(p.scheme, code, scale, zero, tensor_scale);
  }
}

}  // namespace

void launch_dequantize(const DequantizeParams& p, cudaStream_t stream) {
  if (p.shape.numel() == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>(ceil_div(p.shape.numel(), kThreads), int64_t(1) << 20);
  dequantize_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  KVQ_CHECK_LAUNCH();
}

}  // namespace kvq
