// The generic quantize variant: correct for every scheme, D and stride; the incumbent that faster
// variants are checked and timed against.
//   0. +had: one thread per row rotates it into p.rotated (fp32), which the passes below read
//   1. stats: one thread per group scans its box (per-tensor: a two-pass block reduction; min and
//      max are exact in any order, so the result is deterministic); +wW: window tokens are checked
//      for finiteness only
//   2. params: one thread per group applies the codec's group_params and stores scale / zero point
//   3. encode: one thread per code byte; FBGEMM rows are then assembled from the planar bytes
// The block formats (q8_0 ... nvfp4) take their own kernel after step 0 (gpu/quantize_blocks.cu):
// their rules need a block's values, not statistics.
#include <algorithm>

#include "gpu/quantize_common.cuh"
#include "quant/hadamard.hpp"

namespace kvq {
namespace {

using detail::kNoIndex;

constexpr int kThreads = 256;

int blocks_for(int64_t work) { return static_cast<int>(std::min<int64_t>((work + kThreads - 1) / kThreads, 65535)); }

// +had: row r of the input, rotated with the codec's transform, into p.rotated (BNSH fp32); the
// non-finite check happens here, on the input, as the CPU's does.
__global__ void rotate_rows_kernel(QuantizeParams p) {
  const KvShape& s = p.shape;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < s.rows(); r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = r % s.tokens, h = (r / s.tokens) % s.heads, b = r / (s.tokens * s.heads);
    float* row = p.rotated + r * s.head_dim;
    unsigned long long bad = kNoIndex;
    for (int64_t d = 0; d < s.head_dim; ++d) {
      row[d] = detail::load_as_float(p.input, p.in_dtype, detail::element_offset(p, b, h, t, d));
      if (!is_finite_float(row[d])) bad = min(bad, detail::flat_index(s, b, h, t, d));
    }
    if (bad != kNoIndex) atomicMin(p.first_bad, bad);
    hadamard_rotate(row, s.head_dim, p.scheme.rotation_block(s.head_dim));
  }
}

__global__ void group_stats_kernel(QuantizeParams p, int64_t g0, int64_t g1) {
  for (int64_t g = g0 + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < g1; g += int64_t(gridDim.x) * blockDim.x) {
    const GroupBox box = group_box(p.scheme, p.shape, g);
    GroupStats st;
    unsigned long long bad = kNoIndex;
    for (int64_t b = box.b0; b < box.b1; ++b) {
      const int64_t quantized = detail::quantized_tokens(p, b);
      for (int64_t h = box.h0; h < box.h1; ++h)
        for (int64_t t = box.t0; t < box.t1; ++t)
          for (int64_t d = box.d0; d < box.d1; ++d) {
            const float x = detail::load_as_float(p.input, p.in_dtype, detail::element_offset(p, b, h, t, d));
            // +had: the input was checked; its rotation is taken as it is (inf -> overflow), as on the CPU
            if (p.input != p.rotated && !is_finite_float(x)) bad = min(bad, detail::flat_index(p.shape, b, h, t, d));
            else if (t < quantized) st.add(x);
          }
    }
    if (bad != kNoIndex) atomicMin(p.first_bad, bad);
    p.stats[g] = st;
  }
}

// Per-tensor pass 1: each block reduces a strided share of all elements into partials[block].
__global__ void tensor_partials_kernel(QuantizeParams p) {
  __shared__ int32_t lo[kThreads], hi[kThreads];  // __shared__ cannot hold GroupStats (initializers)
  __shared__ float amax[kThreads];
  const KvShape& s = p.shape;
  GroupStats st;
  unsigned long long bad = kNoIndex;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < s.numel(); i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % s.head_dim, r = i / s.head_dim;
    const int64_t t = r % s.tokens, h = (r / s.tokens) % s.heads, b = r / (s.tokens * s.heads);
    const float x = detail::load_as_float(p.input, p.in_dtype, detail::element_offset(p, b, h, t, d));
    if (p.input != p.rotated && !is_finite_float(x)) bad = min(bad, static_cast<unsigned long long>(i));
    else if (t < detail::quantized_tokens(p, b)) st.add(x);
  }
  if (bad != kNoIndex) atomicMin(p.first_bad, bad);
  lo[threadIdx.x] = st.lo_key, hi[threadIdx.x] = st.hi_key, amax[threadIdx.x] = st.amax;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {  // GroupStats' order: signed zeros resolve as on the CPU
      GroupStats a, b;
      a.lo_key = lo[threadIdx.x], a.hi_key = hi[threadIdx.x], a.amax = amax[threadIdx.x];
      b.lo_key = lo[threadIdx.x + stride], b.hi_key = hi[threadIdx.x + stride], b.amax = amax[threadIdx.x + stride];
      a.merge(b);
      lo[threadIdx.x] = a.lo_key, hi[threadIdx.x] = a.hi_key, amax[threadIdx.x] = a.amax;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    GroupStats block;
    block.lo_key = lo[0], block.hi_key = hi[0], block.amax = amax[0];
    p.partials[blockIdx.x] = block;
  }
}

// Per-tensor pass 2: one thread merges the partials in order.
__global__ void tensor_finish_kernel(QuantizeParams p, int partials) {
  GroupStats st;
  for (int i = 0; i < partials; ++i) st.merge(p.partials[i]);
  p.stats[0] = st;
}

__global__ void params_kernel(QuantizeParams p, int64_t groups) {
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    const GroupParams gp = p.tensor_scale_given ? given_scale_params(p.given_tensor_scale, p.scheme)  // per-tensor
                                                : group_params(p.stats[g], p.scheme);
    if (gp.overflow) atomicMin(p.first_overflow, static_cast<unsigned long long>(g));
    detail::store_param(p.scales, g, gp.scale, p.scheme.scale_dtype);
    if (p.scheme.asymmetric) detail::store_param(p.zeros, g, gp.zero, p.scheme.scale_dtype);
  }
}

__device__ __forceinline__ int encode_at(const QuantizeParams& p, int64_t b, int64_t h, int64_t t, int64_t d) {
  const int64_t g = group_of(p.scheme, p.shape, b, h, t, d);
  const GroupParams gp = p.scheme.scale_free ? unit_params() : stored_params(detail::load_param(p.scales, g, p.scheme.scale_dtype),
                                      p.scheme.asymmetric ? detail::load_param(p.zeros, g, p.scheme.scale_dtype) : 0.0f);
  return encode(detail::load_as_float(p.input, p.in_dtype, detail::element_offset(p, b, h, t, d)), gp, p.scheme);
}

// One thread per planar code byte.
__global__ void encode_kernel(QuantizeParams p, uint8_t* codes) {
  const KvShape& s = p.shape;
  const int64_t row_bytes = code_bytes_per_row(p.scheme, s.head_dim), total = s.rows() * row_bytes;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / row_bytes, j = i % row_bytes;
    const int64_t t = r % s.tokens, h = (r / s.tokens) % s.heads, b = r / (s.tokens * s.heads);
    if (t >= detail::quantized_tokens(p, b)) {  // +wW window: code 0 (the values stay in the input)
      codes[i] = 0;
      continue;
    }
    codes[i] = p.scheme.bits == 8 ? code_to_byte(encode_at(p, b, h, t, j))
                                  : pack_nibbles(encode_at(p, b, h, t, 2 * j), encode_at(p, b, h, t, 2 * j + 1));
  }
}

// One thread per row: n x (fp16 scale, fp16 shift) then the row's planar code bytes, at (b, t, h).
__global__ void planar_to_fbgemm_kernel(QuantizeParams p, const uint8_t* planar_codes, int n) {
  const KvShape& s = p.shape;
  const int64_t code_bytes = s.head_dim / 2, row_bytes = code_bytes + 4 * n;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < s.rows(); r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = r % s.tokens, h = (r / s.tokens) % s.heads, b = r / (s.tokens * s.heads);
    uint8_t* dst = p.codes + ((b * s.tokens + t) * s.heads + h) * row_bytes;
    const uint16_t* scales = static_cast<const uint16_t*>(p.scales);
    const uint16_t* zeros = static_cast<const uint16_t*>(p.zeros);
    for (int i = 0; i < n; ++i) {
      const uint16_t sc = scales[r * n + i], z = zeros[r * n + i];
      dst[4 * i] = sc & 0xff, dst[4 * i + 1] = sc >> 8, dst[4 * i + 2] = z & 0xff, dst[4 * i + 3] = z >> 8;
    }
    for (int64_t j = 0; j < code_bytes; ++j) dst[4 * n + j] = planar_codes[r * code_bytes + j];
  }
}

}  // namespace

void launch_group_stats(const QuantizeParams& p, int64_t g0, int64_t g1, cudaStream_t stream) {
  if (g1 <= g0) return;
  group_stats_kernel<<<blocks_for(g1 - g0), kThreads, 0, stream>>>(p, g0, g1);
  KVQ_CHECK_LAUNCH();
}

void launch_quantize_generic(const QuantizeParams& input, cudaStream_t stream) {
  QuantizeParams p = input;
  if (p.scheme.hadamard) {  // the passes below read the rotated rows, already checked for finiteness
    if (!p.rotated) throw InputError("quantize-generic: +had needs the rotation workspace (QuantizeWorkspace)");
    rotate_rows_kernel<<<blocks_for(p.shape.rows()), kThreads, 0, stream>>>(p);
    KVQ_CHECK_LAUNCH();
    p = statistics_view(p);
  }
  if (p.scheme.block_format()) return launch_quantize_blocks(p, stream);
  const int64_t groups = num_groups(p.scheme, p.shape);
  if (groups == 0 && !(p.scheme.scale_free && p.shape.numel() > 0)) return;  // scale-free FP8: encode only
  if (p.scheme.granularity == Granularity::kTensor) {
    const int blocks = static_cast<int>(std::min<int64_t>(kMaxPartials, (p.shape.numel() + kThreads - 1) / kThreads));
    tensor_partials_kernel<<<blocks, kThreads, 0, stream>>>(p);
    KVQ_CHECK_LAUNCH();
    tensor_finish_kernel<<<1, 1, 0, stream>>>(p, blocks);
    KVQ_CHECK_LAUNCH();
  } else {
    launch_group_stats(p, 0, groups, stream);
  }
  if (groups > 0) {
    params_kernel<<<blocks_for(groups), kThreads, 0, stream>>>(p, groups);
    KVQ_CHECK_LAUNCH();
  }
  const bool fbgemm = p.layout == CodeLayout::kFbgemm;
  uint8_t* planar_codes = fbgemm ? p.scratch : p.codes;
  encode_kernel<<<blocks_for(p.shape.rows() * code_bytes_per_row(p.scheme, p.shape.head_dim)), kThreads, 0, stream>>>(
      p, planar_codes);
  KVQ_CHECK_LAUNCH();
  if (fbgemm) {
    const int n = static_cast<int>(groups / p.shape.rows());
    planar_to_fbgemm_kernel<<<blocks_for(p.shape.rows()), kThreads, 0, stream>>>(p, planar_codes, n);
    KVQ_CHECK_LAUNCH();
  }
}

}  // namespace kvq
