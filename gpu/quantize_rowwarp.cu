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

// A lane's EPL input elements as 32-bit words, loaded with the widest aligned vector loads and kept
// in registers (no arrays whose address is taken: those go to local memory).
template <typename Storage, int EPL>
struct LaneWords {
  static constexpr int kWords = EPL * int(sizeof(Storage)) / 4;
  uint32_t w[kWords];

  __device__ __forceinline__ void load(const Storage* src) {
    if (reinterpret_cast<uintptr_t>(src) % (kWords >= 4 ? 16 : 4 * kWords) == 0) {
      if constexpr (kWords == 1) {
        w[0] = *reinterpret_cast<const uint32_t*>(src);
      } else if constexpr (kWords == 2) {
        const uint2 v = *reinterpret_cast<const uint2*>(src);
        w[0] = v.x, w[1] = v.y;
      } else {
#pragma unroll
        for (int i = 0; i < kWords / 4; ++i) {
          const uint4 v = reinterpret_cast<const uint4*>(src)[i];
          w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
      }
    } else {  // strided views may leave rows unaligned
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        if constexpr (sizeof(Storage) == 4) w[i] = __float_as_uint(src[i]);
        else w[i] = uint32_t(src[2 * i]) | (uint32_t(src[2 * i + 1]) << 16);
      }
    }
  }

  __device__ __forceinline__ float element(int e, InputDtype dt) const {
    if constexpr (sizeof(Storage) == 4) {
      return __uint_as_float(w[e]);
    } else {
      const uint16_t bits = static_cast<uint16_t>(w[e / 2] >> (16 * (e % 2)));
      return dt == InputDtype::kFp16 ? fp16_bits_to_fp32(bits) : bf16_bits_to_fp32(bits);
    }
  }
};

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

// EPL codes as one aligned store: int8 one byte each, int4 two per byte (low nibble first).
template <int EPL>
__device__ __forceinline__ void store_codes(uint8_t* dst, const int (&q)[EPL], int bits) {
  uint32_t w[2] = {0, 0};
  if (bits == 8) {
#pragma unroll
    for (int e = 0; e < EPL; ++e) w[e / 4] |= uint32_t(code_to_byte(q[e])) << (8 * (e % 4));
    if constexpr (EPL == 2) *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(w[0]);
    else if constexpr (EPL == 4) *reinterpret_cast<uint32_t*>(dst) = w[0];
    else *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
  } else {
#pragma unroll
    for (int e = 0; e < EPL / 2; ++e) w[0] |= uint32_t(pack_nibbles(q[2 * e], q[2 * e + 1])) << (8 * e);
    if constexpr (EPL == 2) *dst = static_cast<uint8_t>(w[0]);
    else if constexpr (EPL == 4) *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(w[0]);
    else *reinterpret_cast<uint32_t*>(dst) = w[0];
  }
}

template <int EPL, typename Storage, bool ASYM>
__global__ void __launch_bounds__(kThreads) rowwarp_kernel(QuantizeParams p) {
  constexpr int D = 32 * EPL;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const KvShape& s = p.shape;
  Scheme scheme = p.scheme;
  scheme.asymmetric = ASYM;  // a compile-time symmetry lets the compiler drop the other branch
  scheme.format = CodeFormat::kInt;  // integer schemes only (rowwarp_accepts): encode() folds its FP8 branch
  const int G = row_group_size(scheme, D);
  const int groups_per_row = D / G;
  const bool fbgemm = p.layout == CodeLayout::kFbgemm;
  const int64_t fbgemm_row_bytes = D / 2 + 4 * groups_per_row;
  // Contiguous BNSH input needs no (b, h, t): row r starts at r * D. Integer division is the
  // costliest thing this kernel could do per row.
  const bool contiguous = p.stride_t == D && p.stride_h == s.tokens * D && p.stride_b == s.heads * s.tokens * D;
  const Storage* input = static_cast<const Storage*>(p.input);

  for (int64_t base = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; base < s.rows(); base += warps * kRowsInFlight) {
    LaneWords<Storage, EPL> raw[kRowsInFlight];
#pragma unroll
    for (int k = 0; k < kRowsInFlight; ++k) {  // issue every load before any arithmetic
      const int64_t r = base + k * warps;
      if (r >= s.rows()) break;
      int64_t offset = r * D;
      if (!contiguous) {
        const RowIndex i = decompose(r, s);
        offset = detail::element_offset(p, i.b, i.h, i.t, 0);
      }
      raw[k].load(input + offset + lane * EPL);
    }
#pragma unroll
    for (int k = 0; k < kRowsInFlight; ++k) {
      const int64_t r = base + k * warps;
      if (r >= s.rows()) break;  // uniform across the warp
      float x[EPL];
      bool finite = true;
#pragma unroll
      for (int e = 0; e < EPL; ++e) {
        x[e] = raw[k].element(e, p.in_dtype);
        finite &= is_finite_float(x[e]);  // rowwarp keeps the per-element test: its groups may span lanes
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
        st = detail::shuffle_merge(st, G / EPL, ASYM);
        const GroupParams gp = integer_group_params(st, scheme);  // whole groups of a row: never empty
        const int group_in_row = lane * EPL / G;
        if ((lane * EPL) % G == 0) store_group_params(p, r * groups_per_row + group_in_row, gp, row_out, group_in_row);
#pragma unroll
        for (int e = 0; e < EPL; ++e) q[e] = encode(x[e], gp, scheme);
      } else {  // EPL / G whole groups inside the lane
        for (int g0 = 0; g0 < EPL; g0 += G) {
          GroupStats st;
#pragma unroll
          for (int e = 0; e < EPL; ++e)  // constant indices keep x[] in registers
            if (e >= g0 && e < g0 + G) st.add(x[e]);
          const GroupParams gp = integer_group_params(st, scheme);
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

template <int EPL, bool ASYM>
void launch_epl(const QuantizeParams& p, cudaStream_t stream, int blocks) {
  if (p.in_dtype == InputDtype::kFp32) rowwarp_kernel<EPL, float, ASYM><<<blocks, kThreads, 0, stream>>>(p);
  else rowwarp_kernel<EPL, uint16_t, ASYM><<<blocks, kThreads, 0, stream>>>(p);
  KVQ_CHECK_LAUNCH();
}

template <int EPL>
void launch_epl(const QuantizeParams& p, cudaStream_t stream, int blocks) {
  if (p.scheme.asymmetric) launch_epl<EPL, true>(p, stream, blocks);
  else launch_epl<EPL, false>(p, stream, blocks);
}

}  // namespace

bool rowwarp_supports(const Scheme& s, int64_t head_dim) {
  const bool dim = head_dim == 64 || head_dim == 128 || head_dim == 256;
  const bool gran = s.granularity == Granularity::kHead || (s.granularity == Granularity::kGroup && head_dim % s.group == 0);
  return dim && gran && !s.block_format();  // the block formats have rules of their own (quantize_blocks.cu)
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
