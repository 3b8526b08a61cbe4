// 8-element chunks for the quantize variants of the wide groups (per-token, per-tensor): one
// 16-byte load of 16-bit input (two of fp32), the chunk's contribution to a group's statistics, and
// its 8 codes encoded by the codec and packed into one aligned store. D must be a multiple of 8, so
// a chunk never crosses a (b, h, t) row and its codes start on an 8-byte (int8) or 4-byte (int4)
// boundary of the planar code array.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gpu/quantize_common.cuh"
#include "gpu/quantize_stats16.hpp"
#include "gpu/quantize_wide_plan.hpp"

namespace kvq::detail {

inline constexpr int kChunkElems = kWideChunk;

template <InputDtype DT>
struct InputChunk {
  using Storage = std::conditional_t<DT == InputDtype::kFp32, float, uint16_t>;
  static constexpr int kWords = kChunkElems * int(sizeof(Storage)) / 4;  // 4 (16-bit) or 8 (fp32)
  uint32_t w[kWords];

  // Strided views may leave a chunk unaligned: then element by element.
  __device__ __forceinline__ void load(const Storage* src) { load(src, reinterpret_cast<uintptr_t>(src) % 16 == 0); }
  // kAligned: every chunk of the launch is 16-byte aligned (wide_chunks_aligned), so no test and no
  // element-by-element path (the compiler predicates that path into every load: 12 issue slots a
  // chunk of 16-bit input, taken or not).
  template <bool kAligned>
  __device__ __forceinline__ void load_chunk(const Storage* src) {
    if constexpr (kAligned) load(src, true);
    else load(src);
  }
  // `aligned`: src is 16-byte aligned, known by the caller (e.g. once for a run of chunks).
  __device__ __forceinline__ void load(const Storage* src, bool aligned) {
    if (aligned) {
#pragma unroll
      for (int i = 0; i < kWords / 4; ++i) {
        const uint4 v = reinterpret_cast<const uint4*>(src)[i];
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        if constexpr (DT == InputDtype::kFp32) w[i] = __float_as_uint(src[i]);
        else w[i] = uint32_t(src[2 * i]) | (uint32_t(src[2 * i + 1]) << 16);
      }
    }
  }

  // Element e as fp32, exactly (the codec's conversions).
  __device__ __forceinline__ float operator[](int e) const {
    if constexpr (DT == InputDtype::kFp32) {
      return __uint_as_float(w[e]);
    } else {
      const uint16_t bits = static_cast<uint16_t>(w[e / 2] >> (16 * (e % 2)));
      if constexpr (DT == InputDtype::kFp16) return fp16_bits_to_fp32(bits);
      else return bf16_bits_to_fp32(bits);
    }
  }
};

// A lane's running statistics of its chunks. 16-bit input: two elements a word with 16x2 SIMD
// (PackedStats16); fp32: the codec's own accumulator. finish() gives the GroupStats the codec's
// add() gives over the same elements, every field (kKeys false: amax, and -amax / amax for min and
// max, all that symmetric schemes read), so the merged statistics give the CPU's group_params().
template <InputDtype DT, bool kKeys = true>
struct LaneStats {
  PackedStats16 packed;
  bool any = false;
  __device__ __forceinline__ void add(const InputChunk<DT>& c) {
#pragma unroll
    for (int i = 0; i < InputChunk<DT>::kWords; ++i) packed.add<kKeys>(c.w[i]);
    any = true;
  }
  __device__ __forceinline__ GroupStats finish() const { return any ? packed.finish(DT, kKeys) : GroupStats{}; }
};

template <bool kKeys>
struct LaneStats<InputDtype::kFp32, kKeys> {
  GroupStats st;
  __device__ __forceinline__ void add(const InputChunk<InputDtype::kFp32>& c) {
#pragma unroll
    for (int e = 0; e < kChunkElems; ++e) st.add(c[e]);
  }
  __device__ __forceinline__ GroupStats finish() const { return st; }
};

// Merges every field of the statistics of `lanes` neighbouring lanes (a power of two dividing 32)
// by xor-shuffles; all 32 lanes must call it.
__device__ __forceinline__ GroupStats merge_lanes(GroupStats st, int lanes) {
  for (int offset = 1; offset < lanes; offset <<= 1) {
    GroupStats other;
    other.lo_key = __shfl_xor_sync(0xffffffffu, st.lo_key, offset);
    other.hi_key = __shfl_xor_sync(0xffffffffu, st.hi_key, offset);
    other.amax = __shfl_xor_sync(0xffffffffu, st.amax, offset);
    st.merge(other);
  }
  return st;
}

// The scheme with its symmetry, bit width and code format fixed at compile time, so that encode()
// and group_params() fold their constants and drop the other branches (an FP8 path left in an integer
// kernel costs it registers, and occupancy; a run-time e4m3 / e5m2 choice, a second conversion an
// element).
template <bool ASYM, int BITS, CodeFormat F = CodeFormat::kInt>
__device__ __forceinline__ Scheme fixed_scheme(Scheme s) {
  static_assert(F == CodeFormat::kInt || (BITS == 8 && !ASYM), "FP8 codes are 8-bit and symmetric");
  s.asymmetric = ASYM;
  s.bits = BITS;
  s.format = F;
  return s;
}

// Calls launch(format) with an FP8 scheme's format as a std::integral_constant (a template argument).
template <typename Launch>
void with_fp8_format(const Scheme& s, Launch&& launch) {
  if (s.format == CodeFormat::kFp8E5M2) launch(std::integral_constant<CodeFormat, CodeFormat::kFp8E5M2>{});
  else launch(std::integral_constant<CodeFormat, CodeFormat::kFp8E4M3>{});
}

// The coder of a group: FP8 schemes' Fp8Coder, or the IntegerCoder of integer ones, whose values the
// group's statistics bound.
template <bool FP8>
using GroupCoder = std::conditional_t<FP8, Fp8Coder, IntegerCoder>;

template <bool FP8>
__device__ __forceinline__ GroupCoder<FP8> group_coder(const GroupParams& gp, const GroupStats& st, const Scheme& s) {
  if constexpr (FP8) return fp8_coder(gp);
  else return s.asymmetric ? integer_coder(gp, s, st.lo(), st.hi()) : integer_coder(gp, s, -st.amax, st.amax);
}

// Planar code words of a chunk: 8 bytes for int8 and FP8, 4 for int4 with element 2i in the low nibble.
template <int BITS>
__device__ __forceinline__ void store_chunk_codes(uint8_t* dst, uint2 w) {
  if constexpr (BITS == 8) *reinterpret_cast<uint2*>(dst) = w;
  else *reinterpret_cast<uint32_t*>(dst) = w.x;
}

template <int BITS, typename Code>
__device__ __forceinline__ uint2 pack_chunk_codes(Code code) {
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int e = 0; e < kChunkElems; ++e) {
    if constexpr (BITS == 8) w[e / 4] |= uint32_t(code_to_byte(code(e))) << (8 * (e % 4));
    else w[0] |= uint32_t(code_to_nibble(code(e))) << (4 * e);
  }
  return make_uint2(w[0], w[1]);
}

// A chunk's integer codes packed for its store (BITS 8: bytes, 4: nibbles, element 2i low).
template <int BITS>
__device__ __forceinline__ void store_biased_codes(uint8_t* dst, const uint32_t (&m)[kChunkElems]) {
  if constexpr (BITS == 8)
    store_chunk_codes<BITS>(
        dst, make_uint2(pack_low_bytes(m[0], m[1], m[2], m[3]), pack_low_bytes(m[4], m[5], m[6], m[7])));
  else
    store_chunk_codes<BITS>(dst, make_uint2(pack_low_nibbles(m), 0));
}

// The chunk's codes by the biased fma alone (one fma an element, no branch); false where an element
// lies near a half-step (in bf16 input: on it), and the codes are then to be written again. Neither
// this nor encode_chunk_residual tests coder.clamp: without kClamp the caller does.
template <bool ASYM, int BITS, InputDtype DT, bool kClamp = false>
__device__ __forceinline__ bool encode_chunk_biased(uint8_t* dst, const InputChunk<DT>& c, const IntegerCoder& coder) {
  static_assert(BITS == 8 || BITS == 4, "int8 or int4 codes");
  bool sure = true;
  uint32_t m[kChunkElems];
#pragma unroll
  for (int e = 0; e < kChunkElems; ++e) m[e] = float_bits(coder.biased_code<ASYM, kClamp>(c[e], sure));
  store_biased_codes<BITS>(dst, m);
  return sure;
}

// The chunk's codes by the exact residual (exact_code: branch-free, no division); false where that
// is not sure either (a scale of more than 15 bits).
template <bool ASYM, int BITS, InputDtype DT, bool kClamp = false>
__device__ __forceinline__ bool encode_chunk_residual(uint8_t* dst, const InputChunk<DT>& c, const IntegerCoder& coder) {
  static_assert(BITS == 8 || BITS == 4, "int8 or int4 codes");
  float closest = INFINITY;
  uint32_t m[kChunkElems];
#pragma unroll
  for (int e = 0; e < kChunkElems; ++e) m[e] = float_bits(coder.exact_code<ASYM, kClamp>(c[e], closest));
  store_biased_codes<BITS>(dst, m);
  return coder.sure(closest);
}

// Encodes the chunk and stores its codes at `dst`: by the biased fma, and a chunk with an element
// near a half-step again by the residual (in bf16 input such elements lie exactly on the step). The
// result is false when that is not sure either (or, without kClamp, the group may need the clamp:
// rare where the statistics bound the group), and the caller then codes its chunks again with
// encode_chunk_exact, outside its hot loop so that the division's registers do not weigh on it.
// kClamp clamps every code (two instructions an element): for a scale not derived from the values,
// such as a given one.
template <bool ASYM, int BITS, InputDtype DT, bool kClamp = false>
__device__ __forceinline__ bool encode_chunk(uint8_t* dst, const InputChunk<DT>& c, const IntegerCoder& coder,
                                             const Scheme&) {
  bool sure = encode_chunk_biased<ASYM, BITS, DT, kClamp>(dst, c, coder);
  if (!sure) {
    // From a copy the compiler cannot see into: sharing the products above kept them live through
    // the hot path (a first form without the copy: +28 registers in tensor2pass's int8 kernel).
    InputChunk<DT> again = c;
#pragma unroll
    for (int i = 0; i < InputChunk<DT>::kWords; ++i) asm volatile("" : "+r"(again.w[i]));
    sure = encode_chunk_residual<ASYM, BITS, DT, kClamp>(dst, again, coder);
  }
  return sure && (kClamp || !coder.clamp);
}

// FP8 codes from the group's Fp8Coder (two multiplies and half a conversion an element; saturating,
// so no clamp to ask for), false likewise near a rounding boundary.
template <bool ASYM, int BITS, InputDtype DT, bool kClamp = false>
__device__ __forceinline__ bool encode_chunk(uint8_t* dst, const InputChunk<DT>& c, const Fp8Coder& coder,
                                             const Scheme& s) {
  static_assert(BITS == 8 && !ASYM, "FP8 codes are 8-bit and symmetric");
  float x[kChunkElems];
#pragma unroll
  for (int e = 0; e < kChunkElems; ++e) x[e] = c[e];
  uint32_t w[2];
  bool sure = true;
  coder.codes8(x, fp8_format(s.format), w, sure);
  store_chunk_codes<BITS>(dst, make_uint2(w[0], w[1]));
  return sure;
}

// A chunk's codes by the IEEE division alone (encode_chunk's fallback).
template <int BITS, InputDtype DT>
__device__ __forceinline__ void encode_chunk_exact(uint8_t* dst, const InputChunk<DT>& c, const GroupParams& gp,
                                                   const Scheme& s) {
  store_chunk_codes<BITS>(dst, pack_chunk_codes<BITS>([&](int e) {
    return s.fp8() ? encode_fp8(c[e], gp.scale, s.format) : encode_integer_exact(c[e], gp, s);
  }));
}

// Rare path: the flat [B, H, T, D] index of the chunk's first non-finite element into first_bad.
// `flat0` is the flat index of element 0.
template <InputDtype DT>
__device__ __forceinline__ void report_non_finite(const QuantizeParams& p, const InputChunk<DT>& c,
                                                  unsigned long long flat0) {
  for (int e = 0; e < kChunkElems; ++e) {
    if (!is_finite_float(c[e])) {
      atomicMin(p.first_bad, flat0 + e);
      return;
    }
  }
}

// Block-wide merge of every thread's statistics (kThreads a multiple of 32); the result is returned
// to every thread. `scratch` holds one GroupStats' fields per warp. Merging is exact in any order.
template <int kThreads>
__device__ __forceinline__ GroupStats block_merge(GroupStats st, int32_t* lo, int32_t* hi, float* amax) {
  constexpr int kWarps = kThreads / 32;
  st = merge_lanes(st, 32);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) lo[warp] = st.lo_key, hi[warp] = st.hi_key, amax[warp] = st.amax;
  __syncthreads();
  GroupStats all;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    GroupStats o;
    o.lo_key = lo[w], o.hi_key = hi[w], o.amax = amax[w];
    all.merge(o);
  }
  __syncthreads();  // the scratch may be reused right after
  return all;
}

}  // namespace kvq::detail
