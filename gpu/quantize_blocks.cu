// The block formats on the GPU: llama.cpp's KV cache types (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl)
// and the FP4 microscaling formats (mxfp4, nvfp4), into kvq's planar layout, byte for byte what
// quant/block_quantize.cpp writes. One thread per block of 32 (nvfp4: 16) contiguous elements along
// D: the block is read into registers (16-byte loads where aligned), and its parameters and codes
// come from the scalar codec itself (block_params, block_encode), whose fp32 rules hold on the
// device because gpu/ compiles with --fmad=false. nvfp4's tensor scale s_t = amax / 2688 is
// computed first, by a two-pass reduction over the quantized elements (max is exact in any order,
// so it is deterministic), unless the caller gives one.
//   params: QuantizeParams (gpu/quantize.hpp); traits: BlockTraits; kernels: block_quantize_kernel,
//   tensor_amax_kernel; launch: launch_quantize_blocks, whose switch is the one dispatch place.
#include <fmt/format.h>

#include <algorithm>

#include "gpu/quantize_block_geometry.hpp"
#include "gpu/quantize_chunk.cuh"
#include "gpu/quantize_common.cuh"
#include "quant/block_formats.hpp"

namespace kvq {
namespace {

using detail::kNoIndex;

constexpr int kThreads = 256;

template <CodeFormat F>
struct BlockTraits {
  static constexpr int kElems = block_elements(F);  // 32, nvfp4 16
  static constexpr int kBits = F == CodeFormat::kQ8_0 ? 8 : F == CodeFormat::kQ5_0 || F == CodeFormat::kQ5_1 ? 5 : 4;
  static constexpr bool kHasMin = F == CodeFormat::kQ4_1 || F == CodeFormat::kQ5_1;  // kvq's zero points
  static constexpr ScaleDtype kScale = F == CodeFormat::kMxfp4   ? ScaleDtype::kE8M0
                                       : F == CodeFormat::kNvfp4 ? ScaleDtype::kE4M3
                                                                 : ScaleDtype::kFp16;
  static_assert(kElems % detail::kChunkElems == 0, "a block is whole 8-element chunks");
};

// The block's elements as fp32 (exact for every input dtype), in 8-element chunks. kAligned: every
// block of the launch starts on 16 bytes (wide_chunks_aligned), so no test and no predicated
// element-by-element loads.
template <InputDtype DT, bool kAligned, int N>
__device__ __forceinline__ void load_block(const QuantizeParams& p, const BlockAt& at, float (&x)[N]) {
  using Storage = typename detail::InputChunk<DT>::Storage;
  const Storage* src = static_cast<const Storage*>(p.input) + detail::element_offset(p, at.b, at.h, at.t, at.d0);
  const bool aligned = kAligned || reinterpret_cast<uintptr_t>(src) % 16 == 0;  // strided views may not be
#pragma unroll
  for (int c = 0; c < N; c += detail::kChunkElems) {
    detail::InputChunk<DT> chunk;
    chunk.load(src + c, aligned);
#pragma unroll
    for (int e = 0; e < detail::kChunkElems; ++e) x[c + e] = chunk[e];
  }
}

// K little-endian words at dst, as wide as dst's alignment allows.
template <int K>
__device__ __forceinline__ void store_words(uint8_t* dst, const uint32_t (&w)[K]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst);
  if (K % 4 == 0 && a % 16 == 0) {
#pragma unroll
    for (int i = 0; i < K; i += 4) reinterpret_cast<uint4*>(dst)[i / 4] = make_uint4(w[i], w[i + 1], w[i + 2], w[i + 3]);
  } else if (K % 2 == 0 && a % 8 == 0) {
#pragma unroll
    for (int i = 0; i < K; i += 2) reinterpret_cast<uint2*>(dst)[i / 2] = make_uint2(w[i], w[i + 1]);
  } else if (a % 4 == 0) {
#pragma unroll
    for (int i = 0; i < K; ++i) reinterpret_cast<uint32_t*>(dst)[i] = w[i];
  } else {
#pragma unroll
    for (int i = 0; i < 4 * K; ++i) dst[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
  }
}

// The block's codes in the planar row (quant/kv_tensor.hpp): q8_0 one byte each; 4-bit formats
// nibbles, element 2i low; q5 the nibbles, then the fifth bits, element d at bit d % 8 of byte
// D/2 + d/8 (a block's 32 bits are one little-endian word). `code(e)`: element e's codec code.
template <CodeFormat F, typename Code>
__device__ __forceinline__ void store_codes(uint8_t* row, int64_t head_dim, int64_t d0, Code code) {
  using T = BlockTraits<F>;
  if constexpr (T::kBits == 8) {
    uint32_t w[T::kElems / 4] = {};
#pragma unroll
    for (int e = 0; e < T::kElems; ++e) w[e / 4] |= uint32_t(code_to_byte(code(e))) << (8 * (e % 4));
    store_words(row + d0, w);
  } else {
    uint32_t w[T::kElems / 8] = {}, high[1] = {0};
#pragma unroll
    for (int e = 0; e < T::kElems; ++e) {
      const int c = code(e);
      w[e / 8] |= uint32_t(c & 0xf) << (4 * (e % 8));
      if constexpr (T::kBits == 5) high[0] |= uint32_t((c >> 4) & 1) << e;
    }
    store_words(row + d0 / 2, w);
    if constexpr (T::kBits == 5) store_words(row + head_dim / 2 + d0 / 8, high);
  }
}

// The stored scale (and min) of block g in the scale dtype's bytes; a window block (+wW) stores
// zero bytes, as on the CPU (scale 0; mxfp4's byte 0).
template <CodeFormat F>
__device__ __forceinline__ void store_params(const QuantizeParams& p, int64_t g, const BlockParams* bp) {
  using T = BlockTraits<F>;
  if constexpr (T::kScale == ScaleDtype::kFp16) {
    static_cast<uint16_t*>(p.scales)[g] = bp ? fp32_to_fp16_bits(bp->scale) : 0;
    if constexpr (T::kHasMin) static_cast<uint16_t*>(p.zeros)[g] = bp ? fp32_to_fp16_bits(bp->min) : 0;
  } else if constexpr (T::kScale == ScaleDtype::kE8M0) {
    static_cast<uint8_t*>(p.scales)[g] = bp ? static_cast<uint8_t>(e8m0_byte(bp->scale)) : 0;
  } else {
    static_cast<uint8_t*>(p.scales)[g] = bp ? fp32_to_fp8_bits(bp->scale, fp8_e4m3()) : 0;
  }
}

// Blocks an SM that the register cap keeps for the FP4 formats (issue-bound: their warps hide each
// other's latency), as many as their kernels had before the aligned loads took a few registers more
// (nvfp4: 6 for every dtype, no spill; mxfp4: 5 for bf16, 4 otherwise, which spill at 48).
template <CodeFormat F, InputDtype DT>
constexpr int min_blocks() {
  if constexpr (F == CodeFormat::kNvfp4) return 6;
  if constexpr (F == CodeFormat::kMxfp4) return DT == InputDtype::kBf16 ? 5 : 4;
  return 1;
}

template <CodeFormat F, InputDtype DT, bool kAligned>
__global__ void __launch_bounds__(kThreads, min_blocks<F, DT>()) block_quantize_kernel(QuantizeParams p,
                                                                                     BlockGeometry geo) {
  using T = BlockTraits<F>;
  const KvShape& s = p.shape;
  const int64_t blocks = s.rows() * geo.per_row;
  const int64_t row_bytes = code_bytes_per_row(p.scheme, s.head_dim);
  const bool check_input = p.input != p.rotated;  // +had: the rotation pass checked the input
  float tensor_scale = 0.0f;
  if constexpr (F == CodeFormat::kNvfp4) tensor_scale = *p.tensor_scale;
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < blocks; g += int64_t(gridDim.x) * blockDim.x) {
    const BlockAt at = block_at(s, g, geo, T::kElems);
    float x[T::kElems];
    load_block<DT, kAligned>(p, at, x);
    // The largest magnitude's bits (NaN sorts above inf) tell whether any element is non-finite:
    // two instructions an element where the per-element test below costs five; the FP4 and iq4_nl
    // encodes are issue-bound (the linear formats keep the test: fewer registers, q8_0 48 against
    // 60). mxfp4 and nvfp4 take their amax from them too.
    constexpr bool kTop = F == CodeFormat::kIq4Nl || F == CodeFormat::kMxfp4 || F == CodeFormat::kNvfp4;
    uint32_t top = 0;
    if constexpr (kTop) {
#pragma unroll
      for (int e = 0; e < T::kElems; ++e) top = max(top, float_bits(x[e]) & 0x7fffffffu);
    }
    if (check_input) {  // the CPU rejects non-finite input before quantizing: nothing to write
      if constexpr (kTop) {
        if (top >= 0x7f800000u) {
          int first = 0;
#pragma unroll
          for (int e = T::kElems - 1; e >= 0; --e)  // unrolled: x[] stays in registers
            if (!is_finite_float(x[e])) first = e;
          atomicMin(p.first_bad, static_cast<unsigned long long>(detail::flat_index(s, at.b, at.h, at.t, at.d0 + first)));
          continue;
        }
      } else {
        unsigned long long bad = kNoIndex;
#pragma unroll
        for (int e = T::kElems - 1; e >= 0; --e)
          if (!is_finite_float(x[e])) bad = detail::flat_index(s, at.b, at.h, at.t, at.d0 + e);
        if (bad != kNoIndex) {
          atomicMin(p.first_bad, bad);
          continue;
        }
      }
    }
    uint8_t* row = p.codes + at.row * row_bytes;
    if (at.t >= detail::quantized_tokens(p, at.b)) {  // +wW window token: zero bytes
      store_params<F>(p, g, nullptr);
      store_codes<F>(row, s.head_dim, at.d0, [](int) { return 0; });
      continue;
    }
    BlockParams bp;
    if constexpr (F == CodeFormat::kNvfp4 || F == CodeFormat::kMxfp4) {
      float amax = bits_float(top);
      if (top > 0x7f800000u) {  // a NaN (possible after a +had rotation): fmaxf over |x| skips it
        amax = 0.0f;
#pragma unroll
        for (int e = 0; e < T::kElems; ++e) amax = fmaxf(amax, fabsf(x[e]));
      }
      bp = F == CodeFormat::kNvfp4 ? nvfp4_params_for_amax(amax, tensor_scale) : mxfp4_params_for_amax(amax);
    } else {
      bp = block_params(F, x, tensor_scale);
    }
    if (bp.overflow) atomicMin(p.first_overflow, static_cast<unsigned long long>(g));
    store_params<F>(p, g, &bp);
    if constexpr (F == CodeFormat::kMxfp4) {  // the block's midpoints once, not per element
      const Mxfp4Grid grid = mxfp4_grid(bp.encode_scale);
      store_codes<F>(row, s.head_dim, at.d0, [&](int e) { return mxfp4_code(x[e], grid); });
    } else if constexpr (F == CodeFormat::kNvfp4) {  // the zero divisor tested once a block
      const float id = bp.encode_scale;
      if (id == 0.0f) store_codes<F>(row, s.head_dim, at.d0, [](int) { return 0; });
      else store_codes<F>(row, s.head_dim, at.d0, [&](int e) { return nvfp4_code(x[e], id); });
    } else {
      store_codes<F>(row, s.head_dim, at.d0, [&](int e) { return block_encode(F, x[e], bp); });
    }
  }
}

// nvfp4's tensor statistic, pass 1: each CTA's amax over a strided share of the quantized blocks
// into partials[blockIdx.x].amax. Non-finite input is the block kernel's to report.
template <InputDtype DT, bool kAligned>
__global__ void __launch_bounds__(kThreads) tensor_amax_kernel(QuantizeParams p, BlockGeometry geo) {
  constexpr int N = BlockTraits<CodeFormat::kNvfp4>::kElems;
  __shared__ float warp_amax[kThreads / 32];
  const KvShape& s = p.shape;
  const int64_t blocks = s.rows() * geo.per_row;
  float amax = 0.0f;
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < blocks; g += int64_t(gridDim.x) * blockDim.x) {
    const BlockAt at = block_at(s, g, geo, N);
    if (at.t >= detail::quantized_tokens(p, at.b)) continue;
    float x[N];
    load_block<DT, kAligned>(p, at, x);
#pragma unroll
    for (int e = 0; e < N; ++e) amax = fmaxf(amax, fabsf(x[e]));
  }
  for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_amax[w]);
    p.partials[blockIdx.x].amax = amax;
  }
}

// Pass 2: one thread merges the partials and stores s_t (or the given one).
__global__ void tensor_scale_kernel(QuantizeParams p, int partials) {
  float amax = 0.0f;
  for (int i = 0; i < partials; ++i) amax = fmaxf(amax, p.partials[i].amax);
  *p.tensor_scale = p.tensor_scale_given ? p.given_tensor_scale : nvfp4_tensor_scale(amax);
}

int grid_for(int64_t work, int64_t cap) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, cap)));
}

template <CodeFormat F, InputDtype DT, bool kAligned>
void launch_format(const QuantizeParams& p, cudaStream_t stream) {
  using T = BlockTraits<F>;
  if (p.scheme.bits != T::kBits || p.scheme.asymmetric != T::kHasMin || p.scheme.scale_dtype != T::kScale ||
      p.scheme.group != T::kElems)  // a hand-made Scheme that parse_scheme would not give
    throw SchemeError(fmt::format("{}: bits {}, group {}, scale dtype {} do not describe this block format",
                                  to_string(p.scheme), p.scheme.bits, p.scheme.group, scale_dtype_name(p.scheme.scale_dtype)));
  const BlockGeometry geo = block_geometry(p.shape, T::kElems);
  const int64_t blocks = p.shape.rows() * geo.per_row;
  if constexpr (F == CodeFormat::kNvfp4) {
    const int partials = p.tensor_scale_given ? 0 : grid_for(blocks, kMaxPartials);
    if (partials > 0 && blocks > 0) {
      tensor_amax_kernel<DT, kAligned><<<partials, kThreads, 0, stream>>>(p, geo);
      KVQ_CHECK_LAUNCH();
    }
    tensor_scale_kernel<<<1, 1, 0, stream>>>(p, blocks > 0 ? partials : 0);
    KVQ_CHECK_LAUNCH();
  }
  if (blocks == 0) return;
  block_quantize_kernel<F, DT, kAligned><<<grid_for(blocks, 65535), kThreads, 0, stream>>>(p, geo);
  KVQ_CHECK_LAUNCH();
}

template <CodeFormat F, InputDtype DT>
void launch_aligned(const QuantizeParams& p, cudaStream_t stream) {
  wide_chunks_aligned(p) ? launch_format<F, DT, true>(p, stream) : launch_format<F, DT, false>(p, stream);
}

template <CodeFormat F>
void launch_dtype(const QuantizeParams& p, cudaStream_t stream) {
  switch (p.in_dtype) {
    case InputDtype::kFp32: return launch_aligned<F, InputDtype::kFp32>(p, stream);
    case InputDtype::kFp16: return launch_aligned<F, InputDtype::kFp16>(p, stream);
    case InputDtype::kBf16: return launch_aligned<F, InputDtype::kBf16>(p, stream);
  }
}

}  // namespace

void launch_quantize_blocks(const QuantizeParams& p, cudaStream_t stream) {
  const Scheme& s = p.scheme;
  if (!s.block_format())
    throw SchemeError(fmt::format("{}: not a block format (quantize-generic quantizes it)", to_string(s)));
  check_scheme_fits(s, static_cast<int>(p.shape.head_dim));
  if (p.layout != CodeLayout::kPlanar)
    throw SchemeError(fmt::format("{}: the block formats are quantized into the planar layout", to_string(s)));
  if (s.format == CodeFormat::kNvfp4 && !p.tensor_scale)
    throw InputError("nvfp4: the launch needs the tensor scale's output (QuantizeWorkspace allocates it)");
  switch (s.format) {
    case CodeFormat::kQ8_0: return launch_dtype<CodeFormat::kQ8_0>(p, stream);
    case CodeFormat::kQ4_0: return launch_dtype<CodeFormat::kQ4_0>(p, stream);
    case CodeFormat::kQ4_1: return launch_dtype<CodeFormat::kQ4_1>(p, stream);
    case CodeFormat::kQ5_0: return launch_dtype<CodeFormat::kQ5_0>(p, stream);
    case CodeFormat::kQ5_1: return launch_dtype<CodeFormat::kQ5_1>(p, stream);
    case CodeFormat::kIq4Nl: return launch_dtype<CodeFormat::kIq4Nl>(p, stream);
    case CodeFormat::kMxfp4: return launch_dtype<CodeFormat::kMxfp4>(p, stream);
    case CodeFormat::kNvfp4: return launch_dtype<CodeFormat::kNvfp4>(p, stream);
    default: break;
  }
  throw SchemeError(fmt::format("{}: no block quantize kernel for this format", to_string(s)));
}

}  // namespace kvq
