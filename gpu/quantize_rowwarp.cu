// The fused row-wise quantize variant (head and gG granularities, D in {64, 128, 256}): one warp
// per (b, h, t) row, lane l holding elements [l*EPL, (l+1)*EPL) with EPL = D/32. The row is read
// once with one vector load per lane, groups of G >= EPL elements reduce with xor-shuffles over
// G/EPL lanes (smaller groups stay inside a lane), and codes and scales are written straight to
// the planar or the FBGEMM inline-row layout. Each warp keeps two rows in flight.
#include <algorithm>

#include "gpu/quantize_common.cuh"

namespace kvq {
namespace {

using detail::kNoIndex;

constexpr int kThreads = 256;
constexpr int kRowsInFlight = 2;

template <typename Storage, int N>
__device__ __forceinline__ void load_lane(const Storage* src, Storage (&dst)[N]) {
  constexpr int bytes = N * sizeof(Storage);
  if (reinterpret_cast<uintptr_t>(src) % (bytes < 16 ? bytes : 16) == 0) {
    if constexpr (bytes == 4) *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(src);
    else if constexpr (bytes == 8) *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src);
    else if constexpr (bytes % 16 == 0) {
#pragma unroll
      for (int i = 0; i < bytes / 16; ++i) reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = src[i];
  }
}

template <typename Storage>
__device__ __forceinline__ float to_float(Storage v, InputDtype dt) {
  if constexpr (sizeof(Storage) == 4) return v;
  else return dt == InputDtype::kFp16 ? fp16_bits_to_fp32(v) : bf16_bits_to_fp32(v);
}

// Merges the stats of `lanes` neighbouring lanes; only what the scheme's params read is exchanged.
__device__ __forceinline__ GroupStats shuffle_merge(GroupStats st, int lanes, bool asymmetric) {
  for (int offset = 1; offset < lanes; offset <<= 1) {
    if (asymmetric) {
      st.lo = fminf(st.lo, __shfl_xor_sync(0xffffffffu, st.lo, offset));
      st.hi = fmaxf(st.hi, __shfl_xor_sync(0xffffffffu, st.hi, offset));
    } else {
      st.amax = fmaxf(st.amax, __shfl_xor_sync(0xffffffffu, st.amax, offset));
    }
  }
  return st;
}

struct RowIndex {
  int64_t b, h, t;
};

__device__ __forceinline__ RowIndex decompose(int64_t r, const KvShape& s) {
  return {r / (s.tokens * s.heads), (r / s.tokens) % s.heads, r % s.tokens};
}

__device__ __forceinline__ void store_group_params(const QuantizeParams& p, int64_t g, const GroupParams& gp,
                                                   uint8_t* fbgemm_row, int group_in_row) {
  if (gp.overflow) atomicMin(p.first_overflow, static_cast<unsigned long long>(g));
  if (fbgemm_row) {
    const uint16_t sc = fp32_to_fp16_bits(gp.scale), z = fp32_to_fp16_bits(gp.zero);
    uint8_t* h = fbgemm_row + 4 * group_in_row;
    h[0] = sc & 0xff, h[1] = sc >> 8, h[2] = z & 0xff, h[3] = z >> 8;
  } else {
    detail::store_param(p.scales, g, gp.scale, p.scheme.scale_dtype);
    if (p.scheme.asymmetric) detail::store_param(p.zeros, g, gp.zero, p.scheme.scale_dtype);
  }
}

template <int EPL>
__device__ __forceinline__ void store_codes(uint8_t* dst, const int (&q)[EPL], int bits) {
  if (bits == 8) {
    uint8_t bytes[EPL];
#pragma unroll
    for (int e = 0; e < EPL; ++e) bytes[e] = code_to_byte(q[e]);
    if constexpr (EPL == 2) *reinterpret_cast<uint16_t*>(dst) = *reinterpret_cast<uint16_t*>(bytes);
    else if constexpr (EPL == 4) *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<uint32_t*>(bytes);
    else *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<uint2*>(bytes);
  } else {
    uint8_t bytes[EPL / 2];
#pragma unroll
    for (int e = 0; e < EPL / 2; ++e) bytes[e] = pack_nibbles(q[2 * e], q[2 * e + 1]);
    if constexpr (EPL == 2) dst[0] = bytes[0];
    else if constexpr (EPL == 4) *reinterpret_cast<uint16_t*>(dst) = *reinterpret_cast<uint16_t*>(bytes);
    else *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<uint32_t*>(bytes);
  }
}

template <int EPL, typename Storage>
__global__ void __launch_bounds__(kThreads) rowwarp_kernel(QuantizeParams p) {
  constexpr int D = 32 * EPL;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const KvShape& s = p.shape;
  const Scheme& scheme = p.scheme;
  const int G = scheme.granularity == Granularity::kHead ? D : scheme.group;
  const int groups_per_row = D / G;
  const bool fbgemm = p.layout == CodeLayout::kFbgemm;
  const int64_t fbgemm_row_bytes = D / 2 + 4 * groups_per_row;
  // Contiguous BNSH input needs no (b, h, t): row r starts at r * D. Integer division is the
  // costliest thing this kernel could do per row.
  const bool contiguous = p.stride_t == D && p.stride_h == s.tokens * D && p.stride_b == s.heads * s.tokens * D;
  const Storage* input = static_cast<const Storage*>(p.input);

  for (int64_t base = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; base < s.rows(); base += warps * kRowsInFlight) {
    Storage raw[kRowsInFlight][EPL];
#pragma unroll
    for (int k = 0; k < kRowsInFlight; ++k) {  // issue every load before any arithmetic
      const int64_t r = base + k * warps;
      if (r >= s.rows()) break;
      int64_t offset = r * D;
      if (!contiguous) {
        const RowIndex i = decompose(r, s);
        offset = detail::element_offset(p, i.b, i.h, i.t, 0);
      }
      load_lane(input + offset + lane * EPL, raw[k]);
    }
#pragma unroll
    for (int k = 0; k < kRowsInFlight; ++k) {
      const int64_t r = base + k * warps;
      if (r >= s.rows()) break;  // uniform across the warp
      float x[EPL];
      bool finite = true;
#pragma unroll
      for (int e = 0; e < EPL; ++e) {
        x[e] = to_float(raw[k][e], p.in_dtype);
        finite &= is_finite_float(x[e]);
      }
      if (!finite) {  // rare: find this lane's first bad element (flat [B,H,T,D] index = r*D + d)
        for (int e = EPL - 1; e >= 0; --e)
          if (!is_finite_float(x[e])) atomicMin(p.first_bad, static_cast<unsigned long long>(r * D + lane * EPL + e));
      }
      uint8_t* row_out = nullptr;
      if (fbgemm) {
        const RowIndex i = decompose(r, s);
        row_out = p.codes + ((i.b * s.tokens + i.t) * s.heads + i.h) * fbgemm_row_bytes;
      }
      int q[EPL];
      if (G >= EPL) {  // one group per lane, spread over G / EPL lanes
        GroupStats st;
#pragma unroll
        for (int e = 0; e < EPL; ++e) st.add(x[e]);  // a non-finite input fails the call anyway
        st = shuffle_merge(st, G / EPL, scheme.asymmetric);
        const GroupParams gp = group_params(st, scheme);
        const int group_in_row = lane * EPL / G;
        if ((lane * EPL) % G == 0) store_group_params(p, r * groups_per_row + group_in_row, gp, row_out, group_in_row);
#pragma unroll
        for (int e = 0; e < EPL; ++e) q[e] = encode(x[e], gp, scheme);
      } else {  // EPL / G whole groups inside the lane
        for (int g0 = 0; g0 < EPL; g0 += G) {
          GroupStats st;
          for (int e = g0; e < g0 + G; ++e) st.add(x[e]);
          const GroupParams gp = group_params(st, scheme);
          const int group_in_row = (lane * EPL + g0) / G;
          store_group_params(p, r * groups_per_row + group_in_row, gp, row_out, group_in_row);
#pragma unroll
          for (int e = 0; e < EPL; ++e)
            if (e >= g0 && e < g0 + G) q[e] = encode(x[e], gp, scheme);
        }
      }
      if (fbgemm) {
        uint8_t* dst = row_out + 4 * groups_per_row + lane * EPL / 2;  // rows are only 4-byte aligned: bytes
#pragma unroll
        for (int e = 0; e < EPL / 2; ++e) dst[e] = pack_nibbles(q[2 * e], q[2 * e + 1]);
      } else {
        store_codes<EPL>(p.codes + r * (D * scheme.bits / 8) + lane * EPL * scheme.bits / 8, q, scheme.bits);
      }
    }
  }
}

template <int EPL>
void launch_epl(const QuantizeParams& p, cudaStream_t stream, int blocks) {
  if (p.in_dtype == InputDtype::kFp32) rowwarp_kernel<EPL, float><<<blocks, kThreads, 0, stream>>>(p);
  else rowwarp_kernel<EPL, uint16_t><<<blocks, kThreads, 0, stream>>>(p);
  KVQ_CHECK_LAUNCH();
}

}  // namespace

bool rowwarp_supports(const Scheme& s, int64_t head_dim) {
  const bool dim = head_dim == 64 || head_dim == 128 || head_dim == 256;
  const bool gran = s.granularity == Granularity::kHead || (s.granularity == Granularity::kGroup && head_dim % s.group == 0);
  return dim && gran;
}

void launch_quantize_rowwarp(const QuantizeParams& p, cudaStream_t stream) {
  if (!rowwarp_supports(p.scheme, p.shape.head_dim))
    throw InputError("quantize-rowwarp: needs head or gG granularity and D in {64, 128, 256}");
  if (p.shape.rows() == 0) return;
  int device = 0, sms = 0;
  KVQ_CUDA_CHECK(cudaGetDevice(&device));
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t warps_needed = (p.shape.rows() + kRowsInFlight - 1) / kRowsInFlight;
  const int blocks = static_cast<int>(std::min<int64_t>((warps_needed + 7) / 8, int64_t(sms) * 8));
  switch (p.shape.head_dim) {
    case 64: launch_epl<2>(p, stream, blocks); break;
    case 128: launch_epl<4>(p, stream, blocks); break;
    default: launch_epl<8>(p, stream, blocks); break;
  }
}

}  // namespace kvq
