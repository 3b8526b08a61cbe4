// The decode kernel template, instantiated per storage format in decode_<format>.cu.
//
// CTA = (b, KV head, key split, block of HB query heads of that KV head): the HB heads share every
// K/V byte the CTA reads (GQA). The CTA walks its keys in chunks of kChunkKeys. Each row (token) is
// read by L = D/8 lanes, 8 elements per lane, R = 32/L rows per warp step; warps take steps in turn,
// U steps' loads in flight at once:
//   1. QK: each lane dots its 8 dequantized K elements with its 8 elements of every query head; a
//      reduce-scatter over the L lanes leaves one head's score per lane (HB-1 + log2(L/HB) shuffles
//      instead of HB*log2(L)); scores go to shared memory;
//   2. softmax statistics of the chunk (a warp per head): running max and sum, probabilities in
//      place, the factor that rescales the accumulators;
//   3. PV in the QK lane mapping: acc[head][8] += p * V chunk.
// Q lives in registers only in phase 1 and the accumulators matter only in phase 3, which keeps
// the register count (and so the occupancy) of the GQA case workable. Warps sum their accumulators
// in shared memory at the end; with one split the CTA writes bf16 O and LSE, otherwise fp32
// partials that decode_launch.cu merges. Dequantization is the codec's decode(), so the kernel
// reads exactly the values the CPU reference is given. Everything runs in a fixed order: reruns
// are bitwise identical.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "gpu/cuda_check.hpp"
#include "gpu/decode.hpp"
#include "gpu/decode_merge.cuh"
#include "quant/codec.hpp"

namespace kvq::detail {

inline constexpr int kDecodeWarps = 4;
inline constexpr int kDecodeThreads = 32 * kDecodeWarps;

// The raw bytes of one 8-element chunk: 16 B (bf16/fp16), 8 B (int8), 4 B (int4).
template <KvFormat F> struct ChunkBits { using type = uint32_t; };
template <> struct ChunkBits<KvFormat::kBf16> { using type = uint4; };
template <> struct ChunkBits<KvFormat::kFp16> { using type = uint4; };
template <> struct ChunkBits<KvFormat::kInt8> { using type = uint2; };

template <KvFormat F>
KVQ_HD constexpr int chunk_registers() {
  return sizeof(typename ChunkBits<F>::type) / 4;
}
template <KvFormat F>
KVQ_HD constexpr bool is_quantized() {
  return F == KvFormat::kInt8 || F == KvFormat::kInt4 || F == KvFormat::kInt4Fbgemm;
}

// Warp steps whose loads are in flight together: their chunks (and scales and zero points) take
// about 32 registers.
template <KvFormat F>
KVQ_HD constexpr int steps_in_flight() {
  return 32 / (chunk_registers<F>() + (is_quantized<F>() ? 2 : 0));
}

// Keys per softmax chunk: scores of the chunk and the warps' accumulators share 48 KB of shared memory.
template <int D, int HB>
KVQ_HD constexpr int chunk_keys() {
  return D * HB >= 2048 ? 256 : 512;
}

__device__ __forceinline__ float load_param(const void* base, int64_t index, bool fp32) {
  return fp32 ? __ldg(static_cast<const float*>(base) + index)
              : fp16_bits_to_fp32(__ldg(static_cast<const uint16_t*>(base) + index));
}

struct ChunkParams {
  float scale = 0.0f, zero = 0.0f;
};

// The scale and zero point of chunk c of row (b, h, t); `row` is the row's first byte.
__device__ __forceinline__ ChunkParams chunk_params(const KvOperand& op, const DecodeParams& p, const uint8_t* row,
                                                    int64_t b, int64_t h, int64_t t, int c) {
  ChunkParams out;
  int64_t index = 0;
  switch (op.mode) {
    case ParamMode::kNone: return out;
    case ParamMode::kInlineRow: {
      const int g = c * kDecodeChunk / op.group;
      out.scale = fp16_bits_to_fp32(__ldg(reinterpret_cast<const uint16_t*>(row + 4 * g)));
      out.zero = fp16_bits_to_fp32(__ldg(reinterpret_cast<const uint16_t*>(row + 4 * g + 2)));
      return out;
    }
    case ParamMode::kTensor: index = 0; break;
    case ParamMode::kToken: index = b * p.tokens + t; break;
    case ParamMode::kHead: index = (b * p.kv_heads + h) * p.tokens + t; break;
    case ParamMode::kGroup:
      index = ((b * p.kv_heads + h) * p.tokens + t) * (p.head_dim / op.group) + c * kDecodeChunk / op.group;
      break;
  }
  out.scale = load_param(op.scales, index, op.fp32_params());
  out.zero = op.asymmetric ? load_param(op.zeros, index, op.fp32_params()) : 0.0f;
  return out;
}

template <KvFormat F>
__device__ __forceinline__ typename ChunkBits<F>::type load_chunk(const KvOperand& op, const uint8_t* row, int c) {
  using Bits = typename ChunkBits<F>::type;
  return __ldg(reinterpret_cast<const Bits*>(row + op.inline_bytes) + c);
}

template <KvFormat F>
__device__ __forceinline__ void dequantize_chunk(const typename ChunkBits<F>::type& bits, const ChunkParams& cp,
                                                 bool asymmetric, float (&x)[kDecodeChunk]) {
  if constexpr (F == KvFormat::kBf16 || F == KvFormat::kFp16) {
    const uint32_t w[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint16_t lo = static_cast<uint16_t>(w[i] & 0xffffu), hi = static_cast<uint16_t>(w[i] >> 16);
      x[2 * i] = F == KvFormat::kBf16 ? bf16_bits_to_fp32(lo) : fp16_bits_to_fp32(lo);
      x[2 * i + 1] = F == KvFormat::kBf16 ? bf16_bits_to_fp32(hi) : fp16_bits_to_fp32(hi);
    }
  } else if constexpr (F == KvFormat::kInt8) {
    // Codes become floats exactly through the exponent trick: 2^23 + u has u in its low bits.
    // Symmetric codes are biased by 128 first (xor 0x80), so one PRMT and one FADD per code.
    const uint32_t flip = asymmetric ? 0u : 0x80808080u;
    const float bias = asymmetric ? 8388608.0f : 8388736.0f;
    const uint32_t w[2] = {bits.x ^ flip, bits.y ^ flip};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float q = __uint_as_float(__byte_perm(w[i / 4], 0x4b000000u, 0x7540u + (i % 4))) - bias;
      x[i] = asymmetric ? decode_asymmetric(q, cp.scale, cp.zero) : decode_symmetric(q, cp.scale);
    }
  } else {  // int4: element 2j in the low nibble of byte j; symmetric nibbles biased by 8
    const uint32_t w = bits ^ (asymmetric ? 0u : 0x88888888u);
    const float bias = asymmetric ? 8388608.0f : 8388616.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float q = __uint_as_float(0x4b000000u | ((w >> (4 * i)) & 0xfu)) - bias;
      x[i] = asymmetric ? decode_asymmetric(q, cp.scale, cp.zero) : decode_symmetric(q, cp.scale);
    }
  }
}

// The row (within a chunk) that row group `rg` of `warp` reads at warp step j: warps take steps in turn.
template <int R>
__device__ __forceinline__ int step_row(int j, int warp, int rg) {
  return (j * kDecodeWarps + warp) * R + rg;
}

// Chunk c of the rows of U warp steps from j0 in the chunk of keys at c0: their bits and (quantized
// formats) scales and zero points. Rows at or past n (past the chunk, or the sequence: padding,
// maybe NaN) are never read; their bits are zero.
template <KvFormat F, int R, int U>
__device__ __forceinline__ void load_steps(const KvOperand& op, const DecodeParams& p, const uint8_t* head, int64_t b,
                                           int64_t hk, int64_t c0, int n, int j0, int warp, int rg, int c,
                                           typename ChunkBits<F>::type (&bits)[U], ChunkParams (&params)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int row = step_row<R>(j0 + u, warp, rg);
    bits[u] = typename ChunkBits<F>::type{};
    if (row < n) {
      const uint8_t* start = head + (c0 + row) * op.stride_t;
      bits[u] = load_chunk<F>(op, start, c);
      if constexpr (is_quantized<F>()) params[u] = chunk_params(op, p, start, b, hk, c0 + row, c);
    }
  }
}

// Sums v[0..HB) over the L lanes of a row; returns one head's total and sets `head` to it.
template <int HB, int L>
__device__ __forceinline__ float reduce_scatter(float (&v)[HB], int lane, int& head) {
  head = 0;
  int offset = L / 2;
#pragma unroll
  for (int n = HB; n > 1; n /= 2, offset /= 2) {
    const bool upper = (lane & offset) != 0;
#pragma unroll
    for (int j = 0; j < n / 2; ++j) {
      const float send = upper ? v[j] : v[j + n / 2];
      const float keep = upper ? v[j + n / 2] : v[j];
      v[j] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
    }
    if (upper) head += n / 2;
  }
#pragma unroll
  for (; offset >= 1; offset /= 2) v[0] += __shfl_xor_sync(0xffffffffu, v[0], offset);
  return v[0];
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o >= 1; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o >= 1; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// a[i] for a runtime i without spilling the array to local memory.
template <int N>
__device__ __forceinline__ float slope_of(const float (&a)[N], int i) {
  float r = a[0];
#pragma unroll
  for (int j = 1; j < N; ++j) r = j == i ? a[j] : r;
  return r;
}

template <KvFormat F, int D, int HB>
__global__ void __launch_bounds__(kDecodeThreads, HB >= 8 ? 3 : 4) decode_kernel(const DecodeParams p) {
  constexpr int L = D / kDecodeChunk;  // lanes per row
  constexpr int R = 32 / L;            // rows per warp step
  constexpr int U = steps_in_flight<F>();
  constexpr int kChunkKeys = chunk_keys<D, HB>();
  using Bits = typename ChunkBits<F>::type;

  __shared__ float s_p[HB * kChunkKeys];             // the chunk's scores, then probabilities
  __shared__ float s_acc[kDecodeWarps * HB * D];     // each warp's running P.V
  __shared__ float s_m[HB], s_l[HB], s_alpha[HB];

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int c = lane % L, rg = lane / L;
  const int64_t group_size = p.q_heads / p.kv_heads;
  const int64_t head_blocks = (group_size + HB - 1) / HB;
  int64_t cta = blockIdx.x;
  const int64_t hb = cta % head_blocks;
  cta /= head_blocks;
  const int split = static_cast<int>(cta % p.splits);
  cta /= p.splits;
  const int64_t hk = cta % p.kv_heads, b = cta / p.kv_heads;

  const int64_t len = p.seq_lens ? p.seq_lens[b] : p.tokens;
  const int64_t per_split = (len + p.splits - 1) / p.splits;
  const int64_t t_begin = split * per_split;
  const int64_t t_end = t_begin + per_split < len ? t_begin + per_split : len;

  if (threadIdx.x < HB) s_m[threadIdx.x] = -INFINITY, s_l[threadIdx.x] = 0.0f;
  for (int i = threadIdx.x; i < kDecodeWarps * HB * D; i += kDecodeThreads) s_acc[i] = 0.0f;
  __syncthreads();  // also when there are no keys: the final merge reads these

  const uint8_t* k_head = p.k.data + b * p.k.stride_b + hk * p.k.stride_h;
  const uint8_t* v_head = p.v.data + b * p.v.stride_b + hk * p.v.stride_h;
  for (int64_t c0 = t_begin; c0 < t_end; c0 += kChunkKeys) {
    const int n = static_cast<int>(t_end - c0 < kChunkKeys ? t_end - c0 : kChunkKeys);
    {  // 1. QK
      float q[HB][kDecodeChunk], slope[HB];
#pragma unroll
      for (int i = 0; i < HB; ++i) {
        const int64_t in_group = hb * HB + i;
        const bool ok = in_group < group_size;
        const int64_t h = hk * group_size + (ok ? in_group : 0);
        const uint4 bits = __ldg(reinterpret_cast<const uint4*>(p.q + (b * p.q_heads + h) * D) + c);
        const uint32_t w[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          q[i][2 * j] = ok ? bf16_bits_to_fp32(static_cast<uint16_t>(w[j] & 0xffffu)) : 0.0f;
          q[i][2 * j + 1] = ok ? bf16_bits_to_fp32(static_cast<uint16_t>(w[j] >> 16)) : 0.0f;
        }
        slope[i] = p.alibi_slopes && ok ? p.alibi_slopes[h] : 0.0f;
      }
      for (int j0 = 0; step_row<R>(j0, warp, 0) < n; j0 += U) {
        Bits kb[U];
        ChunkParams kp[U];
        load_steps<F, R, U>(p.k, p, k_head, b, hk, c0, n, j0, warp, rg, c, kb, kp);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int row = step_row<R>(j0 + u, warp, rg);
          float k[kDecodeChunk], dot[HB];
          dequantize_chunk<F>(kb[u], kp[u], p.k.asymmetric, k);
#pragma unroll
          for (int i = 0; i < HB; ++i) {
            float d = q[i][0] * k[0];
#pragma unroll
            for (int e = 1; e < kDecodeChunk; ++e) d = __fmaf_rn(q[i][e], k[e], d);
            dot[i] = d;
          }
          int head = 0;
          const float total = reduce_scatter<HB, L>(dot, lane, head);
          if (lane % (L / HB) == 0 && row < n)
            s_p[head * kChunkKeys + row] =
                total * p.softmax_scale - slope_of(slope, head) * static_cast<float>(len - 1 - (c0 + row));
        }
      }
    }
    __syncthreads();
    // 2. Softmax statistics: a warp per head.
    for (int i = warp; i < HB; i += kDecodeWarps) {
      float* sc = s_p + i * kChunkKeys;
      float mx = -INFINITY;
      for (int j = lane; j < n; j += 32) mx = fmaxf(mx, sc[j]);
      const float m_old = s_m[i], m_new = fmaxf(m_old, warp_max(mx));
      float sum = 0.0f;
      for (int j = lane; j < n; j += 32) {
        const float prob = exp_natural(sc[j] - m_new);
        sc[j] = prob;
        sum += prob;
      }
      sum = warp_sum(sum);
      __syncwarp();  // every lane has read s_m[i] before lane 0 replaces it
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? 0.0f : exp_natural(m_old - m_new);
        s_alpha[i] = alpha, s_m[i] = m_new, s_l[i] = s_l[i] * alpha + sum;
      }
    }
    __syncthreads();
    // 3. PV into chunk-local accumulators (not live during QK), added to the warp's running sum.
    float acc[HB][kDecodeChunk];
#pragma unroll
    for (int i = 0; i < HB; ++i)
#pragma unroll
      for (int e = 0; e < kDecodeChunk; ++e) acc[i][e] = 0.0f;
    for (int j0 = 0; step_row<R>(j0, warp, 0) < n; j0 += U) {
      Bits vb[U];
      ChunkParams vp[U];
      load_steps<F, R, U>(p.v, p, v_head, b, hk, c0, n, j0, warp, rg, c, vb, vp);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int row = step_row<R>(j0 + u, warp, rg);
        if (row >= n) continue;
        float v[kDecodeChunk];
        dequantize_chunk<F>(vb[u], vp[u], p.v.asymmetric, v);
#pragma unroll
        for (int i = 0; i < HB; ++i) {
          const float prob = s_p[i * kChunkKeys + row];
#pragma unroll
          for (int e = 0; e < kDecodeChunk; ++e) acc[i][e] = __fmaf_rn(prob, v[e], acc[i][e]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < HB; ++i) {
#pragma unroll
      for (int o = L; o < 32; o *= 2)
#pragma unroll
        for (int e = 0; e < kDecodeChunk; ++e) acc[i][e] += __shfl_xor_sync(0xffffffffu, acc[i][e], o);
      if (rg == 0) {
        float* run = s_acc + (warp * HB + i) * D + c * kDecodeChunk;
#pragma unroll
        for (int e = 0; e < kDecodeChunk; ++e) run[e] = __fmaf_rn(run[e], s_alpha[i], acc[i][e]);
      }
    }
    __syncthreads();  // the next chunk overwrites the probabilities
  }

  for (int idx = threadIdx.x; idx < HB * D; idx += kDecodeThreads) {
    const int i = idx / D, d = idx % D;
    const int64_t in_group = hb * HB + i;
    if (in_group >= group_size) continue;
    const int64_t h = hk * group_size + in_group;
    float o = 0.0f, lse = -INFINITY;
    if (s_m[i] != -INFINITY) {
      float num = 0.0f;
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) num += s_acc[(w * HB + i) * D + d];
      o = num / s_l[i];
      lse = s_m[i] + logf(s_l[i]);
    }
    if (p.splits == 1) {
      p.out[(b * p.q_heads + h) * D + d] = fp32_to_bf16_bits(o);
      if (d == 0) p.lse[b * p.q_heads + h] = lse;
    } else {
      p.partial_o[((split * p.batch + b) * p.q_heads + h) * D + d] = o;
      if (d == 0) p.partial_lse[(split * p.batch + b) * p.q_heads + h] = lse;
    }
  }
}

// Launch (and occupancy) of one format's kernels, dispatched over D and HB.
template <KvFormat F>
struct DecodeFormatKernels {
  static const void* kernel(int head_dim, int heads_per_cta);
  static void launch(const DecodeParams& p, cudaStream_t stream);
};

template <KvFormat F, int D>
const void* kernel_for_heads(int heads_per_cta) {
  switch (heads_per_cta) {
    case 1: return reinterpret_cast<const void*>(&decode_kernel<F, D, 1>);
    case 2: return reinterpret_cast<const void*>(&decode_kernel<F, D, 2>);
    case 4: return reinterpret_cast<const void*>(&decode_kernel<F, D, 4>);
    case 8: return reinterpret_cast<const void*>(&decode_kernel<F, D, 8>);
  }
  return nullptr;
}

template <KvFormat F>
const void* DecodeFormatKernels<F>::kernel(int head_dim, int heads_per_cta) {
  switch (head_dim) {
    case 8: return heads_per_cta == 1 ? reinterpret_cast<const void*>(&decode_kernel<F, 8, 1>) : nullptr;
    case 64: return kernel_for_heads<F, 64>(heads_per_cta);
    case 128: return kernel_for_heads<F, 128>(heads_per_cta);
    case 256: return kernel_for_heads<F, 256>(heads_per_cta);
  }
  return nullptr;
}

template <KvFormat F>
void DecodeFormatKernels<F>::launch(const DecodeParams& p, cudaStream_t stream) {
  const void* fn = kernel(p.head_dim, p.heads_per_cta);
  if (!fn) throw CudaError("decode: no kernel for this head_dim / heads_per_cta");
  const int64_t head_blocks = (p.q_heads / p.kv_heads + p.heads_per_cta - 1) / p.heads_per_cta;
  const int64_t ctas = p.batch * p.kv_heads * p.splits * head_blocks;
  if (ctas == 0) return;
  void* args[] = {const_cast<DecodeParams*>(&p)};
  KVQ_CUDA_CHECK(cudaLaunchKernel(fn, dim3(static_cast<unsigned>(ctas)), dim3(kDecodeThreads), args, 0, stream));
}

}  // namespace kvq::detail
