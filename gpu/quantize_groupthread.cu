// The thread-per-group quantize variant (head and gG granularities, G a multiple of 8): each
// thread owns one scale group, or a 32-element segment of a larger group (G = 64, 128, 256: 2, 4
// or 8 neighbouring lanes, merged with xor-shuffles). The codec's per-group work (division, fp16
// rounding of the scale) is then done by few lanes, not by a whole warp. Consecutive threads own
// consecutive segments, so a warp covers a contiguous stretch of the row-major input. Two kernels,
// by measurement (H200, B=128 T=8192, experiments/results/nvidia-h200/quantize-groupthread-int8/):
//  - int8 and FP8 planar codes: the segment's chunk loads all issued first and the chunks held in
//    registers for both passes (read once), codes from the group's IntegerCoder (one fma an element)
//    or Fp8Coder (a chunk either is not sure of is coded again by the division), at 4 blocks an SM:
//    int8 0.91-0.98x the form below (held under its 5-block cap, it spilled 32-48 bytes and was
//    1.00-1.08x slower); fp8-e4m3-head 0.66x encode() by division (quantize-fp8-coder/).
//  - int4 codes (planar and FBGEMM rows): pass 1 reads the segment in 8-element chunks for its
//    statistics, pass 2 again (from L1) and codes them by the group's IntegerCoder (encode_chunk:
//    a chunk near a half-step by the residual, then the division) at 4 blocks an SM, the segment
//    placed by invariant divisors: 0.91-0.98x encode() an element and 64-bit divisions (the
//    divisors alone: planar 0.99x, FBGEMM rows 0.93-0.95x; quantize-int4-coder/). The held form
//    was 1.01-1.08x slower here, and coding a segment's chunks again only once the segment is done
//    (no spill at 5 blocks) 1.03-1.09x. Before the residual path IntegerCoder lost here
//    (1.09-1.32x): bf16 input met half-steps in most warps, whose lanes then divided
//    (experiments/results/nvidia-h100-80gb-hbm3/quantize-integer-coder/).
#include <algorithm>

#include "gpu/quantize_block_geometry.hpp"
#include "gpu/quantize_chunk.cuh"
#include "gpu/quantize_common.cuh"

namespace kvq {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = detail::kChunkElems;
constexpr int kSegment = 32;  // elements per lane at most: keeps each lane's bytes in L1 between passes

// The int4 kernel. 4 blocks an SM: at 5 (48 registers) the coder's residual path spilled 24-48
// bytes in every 16-bit instantiation; at 4 none spills, and the coder's codes cost fewer
// instructions than encode()'s rounding, conversion and branch (the gain above is at 4).
// kStrided: the launch strides a few resident waves over the segments (see
// launch_quantize_groupthread) and every segment is on 16 bytes (no alignment test). Either way a
// segment's four chunk loads are issued before their statistics, two elements an instruction
// (LaneStats): FBGEMM rows 0.93-0.96x the element-by-element form, which the old 48-register cap
// had needed (quantize-int4-coder/). kFbgemm: FBGEMM rows, whose segments the kernel counts in
// their own [B, T, H] order so that a warp's rows lie together in the output; in the input's order
// rows of eight heads interleave there (Hkv 8 0.83x the input's order with waves, which were 1.65x
// slower than one thread a segment in it: quantize-fbgemm-token-order/, quantize-int4-coder/).
template <typename Storage, InputDtype DT, bool ASYM, bool kStrided, bool kFbgemm>
__global__ void __launch_bounds__(kThreads, 4) groupthread_kernel(QuantizeParams p, BlockGeometry geo) {
  const KvShape& s = p.shape;
  Scheme scheme = p.scheme;
  scheme.asymmetric = ASYM;
  scheme.format = CodeFormat::kInt;  // int4 launches only (FP8: groupthread_int8_kernel): encode() folds its FP8 branch
  const int64_t D = s.head_dim;
  const int G = row_group_size(scheme, static_cast<int>(D));
  const int64_t groups_per_row = D / G, groups = s.rows() * groups_per_row;
  const Storage* input = static_cast<const Storage*>(p.input);

  const int parts = G > kSegment ? G / kSegment : 1;  // lanes per group: 1, 2, 4 or 8
  const int parts_log2 = __ffs(parts) - 1;
  const int seg = G / parts;
  const int lane = threadIdx.x & 31;
  const int64_t total = groups * parts, stride = int64_t(gridDim.x) * blockDim.x;
  // The loop test is uniform across the warp (its first index), so every lane reaches the shuffles.
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i - lane < total; i += stride) {
    const bool active = i < total;
    // The segment's (b, h, t) row by the launch's invariant divisors: 64-bit divisions cost more
    // than quantizing several elements (FBGEMM rows and strided views need b, h and t).
    const BlockAt at = block_at(s, active ? i : 0, geo, seg, kFbgemm);
    const int64_t out_row = kFbgemm ? (at.b * s.tokens + at.t) * s.heads + at.h : at.row;  // the row i counts in
    const int64_t part = i & (parts - 1), gi = (active ? i >> parts_log2 : 0) - out_row * groups_per_row;
    const int64_t g = at.row * groups_per_row + gi, d0 = at.d0;  // g: the group in [B, H, T] order
    const Storage* src = input + detail::element_offset(p, at.b, at.h, at.t, d0);
    const bool aligned = kStrided || reinterpret_cast<uintptr_t>(src) % 16 == 0;

    // Pass 1: the segment's statistics, its chunk loads issued before their arithmetic.
    detail::LaneStats<DT, ASYM> acc;
    if (active && seg == kSegment) {
      detail::InputChunk<DT> chunk[kSegment / kChunk];
#pragma unroll
      for (int k = 0; k < kSegment / kChunk; ++k) chunk[k].load(src + k * kChunk, aligned);
#pragma unroll
      for (int k = 0; k < kSegment / kChunk; ++k) acc.add(chunk[k]);
    } else {
      for (int c = 0; active && c < seg; c += kChunk) {
        detail::InputChunk<DT> chunk;
        chunk.load(src + c, aligned);
        acc.add(chunk);
      }
    }
    GroupStats st = acc.finish();
    const bool finite = st.all_finite(ASYM);  // before the merge: this lane's own segment
    st = detail::shuffle_merge(st, parts, ASYM);  // the group's segments
    if (!active) continue;
    if (!finite) {  // rare: report this segment's first bad element (flat index row * D + d)
      for (int d = seg - 1; d >= 0; --d)
        if (!is_finite_float(detail::load_as_float(src, DT, d)))
          atomicMin(p.first_bad, static_cast<unsigned long long>(at.row * D + d0 + d));
    }
    const GroupParams gp = integer_group_params(st, scheme);  // an active lane added >= 8 elements: never empty
    const bool leader = part == 0;
    if (gp.overflow && leader) atomicMin(p.first_overflow, static_cast<unsigned long long>(g));

    uint8_t* codes;
    if constexpr (kFbgemm) {
      uint8_t* row = p.codes + out_row * (D / 2 + 4 * groups_per_row);
      if (leader) {
        const uint16_t sc = fp32_to_fp16_bits(gp.scale), z = fp32_to_fp16_bits(gp.zero);
        uint8_t* head = row + 4 * gi;
        head[0] = sc & 0xff, head[1] = sc >> 8, head[2] = z & 0xff, head[3] = z >> 8;
      }
      codes = row + 4 * groups_per_row + d0 / 2;
    } else {
      if (leader) {
        detail::store_param(p.scales, g, gp.scale, scheme.scale_dtype);
        if (ASYM) detail::store_param(p.zeros, g, gp.zero, scheme.scale_dtype);
      }
      codes = p.codes + (at.row * D + d0) / 2;
    }
    const IntegerCoder coder = detail::group_coder<false>(gp, st, scheme);
    bool sure = true;
    for (int c = 0; c < seg; c += kChunk) {
      detail::InputChunk<DT> chunk;
      chunk.load(src + c, aligned);
      sure &= detail::encode_chunk<ASYM, 4>(codes + c / 2, chunk, coder, scheme);  // FBGEMM rows: 4-byte aligned too
    }
    if (!sure) {  // rare: the segment again, by the division
      for (int c = 0; c < seg; c += kChunk) {
        detail::InputChunk<DT> chunk;
        chunk.load(src + c, aligned);
        detail::encode_chunk_exact<4>(codes + c / 2, chunk, gp, scheme);
      }
    }
  }
}

// int8 and FP8 planar codes (see the top of the file). kAligned: every chunk of the launch lies on
// 16 bytes (wide_chunks_aligned): no per-load test. fp32 input would hold twice the registers and
// spill: its chunks are read again (from L1) to be coded.
template <typename Storage, InputDtype DT, bool ASYM, CodeFormat F, bool kAligned>
__global__ void __launch_bounds__(kThreads, 4) groupthread_int8_kernel(QuantizeParams p) {
  using Chunk = detail::InputChunk<DT>;
  constexpr int kChunks = kSegment / kChunk;
  constexpr bool kHold = DT != InputDtype::kFp32;
  const KvShape& s = p.shape;
  constexpr bool FP8 = F != CodeFormat::kInt;
  const Scheme scheme = detail::fixed_scheme<ASYM, 8, F>(p.scheme);
  const int64_t D = s.head_dim;
  const int G = row_group_size(scheme, static_cast<int>(D));
  const int64_t groups_per_row = D / G, groups = s.rows() * groups_per_row;
  const bool contiguous = p.stride_t == D && p.stride_h == s.tokens * D && p.stride_b == s.heads * s.tokens * D;
  const Storage* input = static_cast<const Storage*>(p.input);
  const int parts = G > kSegment ? G / kSegment : 1, parts_log2 = __ffs(parts) - 1, seg = G / parts;
  const bool pow2_row = (groups_per_row & (groups_per_row - 1)) == 0;
  const int row_log2 = __ffsll(groups_per_row) - 1;
  const int lane = threadIdx.x & 31;
  const int64_t total = groups * parts, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i - lane < total; i += stride) {
    const bool active = i < total;
    const int64_t g = active ? i >> parts_log2 : 0, part = i & (parts - 1);
    const int64_t r = pow2_row ? g >> row_log2 : g / groups_per_row;
    const int64_t d0 = (pow2_row ? g & (groups_per_row - 1) : g % groups_per_row) * G + part * seg;
    // The segment's input and codes first: its coordinates then die, leaving registers for the chunks.
    const int64_t flat0 = r * D + d0;  // [B, H, T, D] index of its first element: its code index too
    const Storage* src = input + flat0;
    if (!contiguous) {
      const int64_t b = r / (s.tokens * s.heads), h = (r / s.tokens) % s.heads, t = r % s.tokens;
      src = input + detail::element_offset(p, b, h, t, d0);
    }
    uint8_t* codes = p.codes + flat0;
    const bool aligned = kAligned || reinterpret_cast<uintptr_t>(src) % 16 == 0;

    Chunk held[kHold ? kChunks : 1];
    detail::LaneStats<DT, ASYM> acc;  // symmetric schemes read amax only
    if constexpr (kHold) {
#pragma unroll
      for (int k = 0; k < kChunks; ++k)
        if (active && k * kChunk < seg) held[k].load(src + k * kChunk, aligned);
#pragma unroll
      for (int k = 0; k < kChunks; ++k)
        if (active && k * kChunk < seg) acc.add(held[k]);
    } else {
      for (int k = 0; active && k * kChunk < seg; ++k) {
        held[0].load(src + k * kChunk, aligned);
        acc.add(held[0]);
      }
    }
    GroupStats st = acc.finish();
    const bool finite = st.all_finite(ASYM);  // before the merge: this lane's own segment
    st = detail::shuffle_merge(st, parts, ASYM);  // the group's segments
    // An active lane added >= 8 elements: never empty (an inactive lane's are unused).
    const GroupParams gp = FP8 ? fp8_params(st.amax, scheme) : integer_group_params(st, scheme);
    const detail::GroupCoder<FP8> coder = detail::group_coder<FP8>(gp, st, scheme);
    // Integer codes of a warp with a group of a short scale (bf16 values on its half-steps: most of
    // its chunks meet one) by the residual alone; elsewhere by the biased fma, and a warp's chunks
    // again by the residual if any met a half-step. Decided once, by every lane, before any leaves.
    bool by_residual = false;
    if constexpr (!FP8) by_residual = __any_sync(0xffffffffu, active && coder.short_scale);
    if (!active) continue;
    if (!finite) {  // rare: report this segment's first bad element
      for (int d = seg - 1; d >= 0; --d)
        if (!is_finite_float(detail::load_as_float(src, DT, d)))
          atomicMin(p.first_bad, static_cast<unsigned long long>(flat0 + d));
    }
    if (part == 0) {
      if (gp.overflow) atomicMin(p.first_overflow, static_cast<unsigned long long>(g));
      detail::store_param(p.scales, g, gp.scale, scheme.scale_dtype);
      if (ASYM) detail::store_param(p.zeros, g, gp.zero, scheme.scale_dtype);
    }
    bool sure = true;
    auto each_chunk = [&](auto&& encode) {  // encode(dst, chunk) -> sure
#pragma unroll
      for (int k = 0; k < kChunks; ++k) {
        if (k * kChunk >= seg) break;
        if constexpr (!kHold) held[0].load(src + k * kChunk, aligned);  // from L1
        sure &= encode(codes + k * kChunk, held[kHold ? k : 0]);
      }
    };
    if constexpr (FP8) {
      each_chunk([&](uint8_t* dst, const Chunk& c) { return detail::encode_chunk<ASYM, 8>(dst, c, coder, scheme); });
    } else {
      if (!by_residual)
        each_chunk([&](uint8_t* dst, const Chunk& c) { return detail::encode_chunk_biased<ASYM, 8>(dst, c, coder); });
      if (by_residual || __any_sync(__activemask(), !sure)) {
        sure = true;
        each_chunk([&](uint8_t* dst, const Chunk& c) { return detail::encode_chunk_residual<ASYM, 8>(dst, c, coder); });
      }
      sure = sure && !coder.clamp;
    }
    if (!sure) {  // rare: the segment again, by the division (read again: the held chunks are dead here)
      for (int k = 0; k * kChunk < seg; ++k) {
        Chunk c;
        c.load(src + k * kChunk, aligned);
        detail::encode_chunk_exact<8>(codes + k * kChunk, c, gp, scheme);
      }
    }
  }
}

template <typename Storage, InputDtype DT, bool kStrided>
void launch_int4(const QuantizeParams& p, cudaStream_t stream, int blocks) {
  const int64_t G = row_group_size(p.scheme, p.shape.head_dim);
  const BlockGeometry geo = block_geometry(p.shape, static_cast<int>(std::min<int64_t>(G, kSegment)));
  const auto launch = [&](auto kernel) {
    kernel<<<blocks, kThreads, 0, stream>>>(p, geo);
    KVQ_CHECK_LAUNCH();
  };
  const bool fbgemm = p.layout == CodeLayout::kFbgemm;
  if (p.scheme.asymmetric)
    fbgemm ? launch(groupthread_kernel<Storage, DT, true, kStrided, true>) : launch(groupthread_kernel<Storage, DT, true, kStrided, false>);
  else
    fbgemm ? launch(groupthread_kernel<Storage, DT, false, kStrided, true>) : launch(groupthread_kernel<Storage, DT, false, kStrided, false>);
}

template <typename Storage, InputDtype DT, bool kAligned>
void launch_int8(const QuantizeParams& p, cudaStream_t stream, int blocks) {
  const auto launch = [&](auto kernel) {
    kernel<<<blocks, kThreads, 0, stream>>>(p);
    KVQ_CHECK_LAUNCH();
  };
  constexpr CodeFormat kInt = CodeFormat::kInt;
  if (p.scheme.fp8())
    detail::with_fp8_format(p.scheme, [&](auto f) { launch(groupthread_int8_kernel<Storage, DT, false, decltype(f)::value, kAligned>); });
  else if (p.scheme.asymmetric) launch(groupthread_int8_kernel<Storage, DT, true, kInt, kAligned>);
  else launch(groupthread_int8_kernel<Storage, DT, false, kInt, kAligned>);
}

// The one place where the launch's scheme, layout, dtype and alignment become a kernel.
template <typename Storage, InputDtype DT>
void dispatch(const QuantizeParams& p, cudaStream_t stream, int blocks, bool grid_stride) {
  const bool aligned = wide_chunks_aligned(p);
  if (p.scheme.bits == 8)  // int8 and FP8, planar: FBGEMM rows hold int4 only
    aligned ? launch_int8<Storage, DT, true>(p, stream, blocks)
            : launch_int8<Storage, DT, false>(p, stream, blocks);
  else
    grid_stride && aligned ? launch_int4<Storage, DT, true>(p, stream, blocks)
                           : launch_int4<Storage, DT, false>(p, stream, blocks);
}

}  // namespace

bool groupthread_supports(const Scheme& s, int64_t head_dim) {
  const int64_t G = row_group_size(s, head_dim);
  const bool gran = s.granularity == Granularity::kHead || s.granularity == Granularity::kGroup;
  const bool split = G <= kSegment || (G % kSegment == 0 && (G / kSegment & (G / kSegment - 1)) == 0 && G / kSegment <= 32);
  return gran && !s.block_format() && G % kChunk == 0 && head_dim % G == 0 && split;  // blocks: quantize_blocks.cu
}

void launch_quantize_groupthread(const QuantizeParams& p, cudaStream_t stream) {
  if (!groupthread_supports(p.scheme, p.shape.head_dim))
    throw InputError("quantize-groupthread: needs head or gG granularity with a group size that is a multiple of 8");
  const int64_t groups = num_groups(p.scheme, p.shape);
  if (groups == 0) return;
  const int64_t G = row_group_size(p.scheme, p.shape.head_dim);
  const int64_t threads = groups * (G > kSegment ? G / kSegment : 1);
  // Launch shape by measurement (H100, B=128 T=8192 Hkv=8): int4 output is fastest from a grid of 8
  // resident waves (groupthread_kernel keeps 4 blocks an SM) striding over the segments (planar
  // 84% vs 78% of copy; FBGEMM rows, counted in their own order: H200 Hkv 1 0.87-0.90x,
  // nvidia-h200/quantize-token-bytes-fbgemm-waves/, Hkv 8 0.83x, quantize-fbgemm-token-order/),
  // while int8 is fastest with one thread per segment (78% vs 72%).
  int64_t max_blocks = 1 << 20;
  const bool grid_stride = p.scheme.bits == 4;
  if (grid_stride) {
    int device = 0, sms = 0;
    KVQ_CUDA_CHECK(cudaGetDevice(&device));
    KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    max_blocks = int64_t(sms) * 4 * 8;
  }
  const int blocks = static_cast<int>(std::min<int64_t>((threads + kThreads - 1) / kThreads, max_blocks));
  switch (p.in_dtype) {
    case InputDtype::kFp32: dispatch<float, InputDtype::kFp32>(p, stream, blocks, grid_stride); break;
    case InputDtype::kFp16: dispatch<uint16_t, InputDtype::kFp16>(p, stream, blocks, grid_stride); break;
    case InputDtype::kBf16: dispatch<uint16_t, InputDtype::kBf16>(p, stream, blocks, grid_stride); break;
  }
}

}  // namespace kvq
