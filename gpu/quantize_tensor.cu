// The per-tensor quantize variant (tensor granularity, D a multiple of 8): a deterministic two-pass.
// The one scale depends on every element, so each element is read twice (no on-chip store holds a
// cache of gigabytes):
//   1. stats: a grid of at most kMaxPartials blocks strides over the tensor in 8-element chunks
//      (kUnroll 16-byte loads in flight per thread) and writes one GroupStats per block to
//      p.partials. min, max and max |x| are exact in any order, so the result does not depend on
//      the grid or the schedule.
//   2. encode: every block first merges the partials itself (a few KiB from L2: no third kernel and
//      no counter to reset between graph replays), derives the parameters with the codec's
//      group_params(), and block 0 stores them; then the grid encodes the chunks in reverse order,
//      so that its first reads find the tail that pass 1 read last still in L2.
// A given scale (a calibrated symmetric one) needs no statistics: the encode pass alone then reads
// each element once, codes it with the clamp (its values may pass the scale's range) and finds
// non-finite input from each thread's 16x2 magnitudes. Input whose chunks all lie on 16 bytes (the
// usual case) is read by kernels without the per-load alignment test.
// Chunks are numbered in logical [B, H, T, D] order: chunk c holds flat elements 8c..8c+7 and its
// codes start at byte c * bits of the planar code array; only the input address depends on strides.
#include <algorithm>

#include "gpu/quantize_chunk.cuh"
#include "gpu/quantize_wide_plan.hpp"

namespace kvq {
namespace {

using detail::InputChunk;
using detail::kChunkElems;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;    // chunks in flight per thread
constexpr int kMaxWaves = 4;  // pass 2 grid: at most this many rounds of resident blocks

// kAligned: every chunk on 16 bytes (wide_chunks_aligned), loaded without a test.
template <InputDtype DT, bool kAligned>
__global__ void __launch_bounds__(kThreads) tensor_stats_kernel(QuantizeParams p, TensorPlan plan) {
  using Chunk = InputChunk<DT>;
  using Storage = typename Chunk::Storage;
  __shared__ int32_t lo[kWarps], hi[kWarps];  // __shared__ cannot hold GroupStats (initializers)
  __shared__ float amax[kWarps];
  const Storage* input = static_cast<const Storage*>(p.input);
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  detail::LaneStats<DT> acc;
  for (int64_t c0 = blockIdx.x * int64_t(kThreads) + threadIdx.x; c0 < plan.chunks; c0 += kUnroll * stride) {
    Chunk chunk[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u * stride < plan.chunks)
        chunk[u].template load_chunk<kAligned>(input + tensor_chunk_offset(p, plan, c0 + u * stride));
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u * stride < plan.chunks) acc.add(chunk[u]);
  }
  GroupStats st = acc.finish();
  if (!st.all_finite(p.scheme.asymmetric)) {  // rare: find this thread's non-finite elements
    for (int64_t c = blockIdx.x * int64_t(kThreads) + threadIdx.x; c < plan.chunks; c += stride) {
      Chunk chunk;
      chunk.load(input + tensor_chunk_offset(p, plan, c));
      detail::report_non_finite(p, chunk, static_cast<unsigned long long>(c * kChunkElems));
    }
  }
  st = detail::block_merge<kThreads>(st, lo, hi, amax);
  if (threadIdx.x == 0) p.partials[blockIdx.x] = st;
}

// kGiven: p's given scale, no pass 1 (symmetric schemes only). FP8: e4m3 / e5m2 codes.
template <InputDtype DT, bool ASYM, int BITS, bool kGiven, bool kAligned, CodeFormat F>
__global__ void __launch_bounds__(kThreads) tensor_encode_kernel(QuantizeParams p, TensorPlan plan) {
  using Chunk = InputChunk<DT>;
  using Storage = typename Chunk::Storage;
  __shared__ int32_t lo[kWarps], hi[kWarps];
  __shared__ float amax[kWarps];
  constexpr bool FP8 = F != CodeFormat::kInt;
  const Scheme scheme = detail::fixed_scheme<ASYM, BITS, F>(p.scheme);
  GroupParams gp;
  detail::GroupCoder<FP8> coder;
  if constexpr (kGiven) {
    static_assert(!ASYM, "a given tensor scale is symmetric");
    gp = given_scale_params(p.given_tensor_scale, scheme);
    if constexpr (FP8) coder = fp8_coder(gp);
    else coder = integer_coder(gp, scheme, -INFINITY, INFINITY);  // bounds unknown: encode_chunk<.., true> clamps
  } else {
    GroupStats st;
    for (int i = threadIdx.x; i < plan.partials; i += kThreads) st.merge(p.partials[i]);
    st = detail::block_merge<kThreads>(st, lo, hi, amax);
    gp = p.tensor_scale_given ? given_scale_params(p.given_tensor_scale, scheme) : group_params(st, scheme);
    coder = detail::group_coder<FP8>(gp, st, scheme);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (gp.overflow) atomicMin(p.first_overflow, 0ull);
    detail::store_param(p.scales, 0, gp.scale, scheme.scale_dtype);
    if (ASYM) detail::store_param(p.zeros, 0, gp.zero, scheme.scale_dtype);
  }

  const Storage* input = static_cast<const Storage*>(p.input);
  const int64_t stride = int64_t(gridDim.x) * kThreads, last = plan.chunks - 1;
  detail::LaneStats<DT, false> magnitudes;  // kGiven: what tells non-finite input
  for (int64_t i0 = blockIdx.x * int64_t(kThreads) + threadIdx.x; i0 < plan.chunks; i0 += kUnroll * stride) {
    Chunk chunk[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (i0 + u * stride < plan.chunks)
        chunk[u].template load_chunk<kAligned>(input + tensor_chunk_offset(p, plan, last - (i0 + u * stride)));
    bool sure = true;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = last - (i0 + u * stride);
      if (c < 0) continue;
      if constexpr (kGiven) magnitudes.add(chunk[u]);
      sure &= detail::encode_chunk<ASYM, BITS, DT, kGiven>(p.codes + c * BITS, chunk[u], coder, scheme);
    }
    if (!sure) {  // rare: these chunks again, by the division (unrolled: the held chunks stay in registers)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = last - (i0 + u * stride);
        if (c >= 0) detail::encode_chunk_exact<BITS>(p.codes + c * BITS, chunk[u], gp, scheme);
      }
    }
  }
  if constexpr (kGiven) {
    if (!magnitudes.finish().all_finite(false)) {  // rare: this thread's chunks again, to report
      for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < plan.chunks; i += stride) {
        const int64_t c = last - i;
        Chunk chunk;
        chunk.load(input + tensor_chunk_offset(p, plan, c));
        detail::report_non_finite(p, chunk, static_cast<unsigned long long>(c * kChunkElems));
      }
    }
  }
}

int device_sms() {
  int device = 0, sms = 0;
  KVQ_CUDA_CHECK(cudaGetDevice(&device));
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// The encode pass's grid: at most kMaxWaves rounds of resident blocks.
template <InputDtype DT, bool ASYM, int BITS, bool kGiven, bool kAligned, CodeFormat F>
void launch_encode(const QuantizeParams& p, const TensorPlan& plan, int sms, cudaStream_t stream) {
  const auto kernel = tensor_encode_kernel<DT, ASYM, BITS, kGiven, kAligned, F>;
  const int64_t needed = ceil_div(plan.chunks, int64_t(kThreads) * kUnroll);
  int resident = 0;
  KVQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kThreads, 0));
  const int blocks = static_cast<int>(std::min<int64_t>(needed, int64_t(sms) * std::max(resident, 1) * kMaxWaves));
  kernel<<<blocks, kThreads, 0, stream>>>(p, plan);
  KVQ_CHECK_LAUNCH();
}

// Unaligned input (rare) with a given scale takes the two passes (pass 1 finds non-finite input, the
// encode pass uses the given scale): one set of one-pass kernels fewer.
template <InputDtype DT, bool ASYM, int BITS, bool kAligned, CodeFormat F = CodeFormat::kInt>
void launch_passes(const QuantizeParams& p, TensorPlan plan, cudaStream_t stream) {
  const int sms = device_sms();
  if constexpr (!ASYM && kAligned) {
    if (p.tensor_scale_given) return launch_encode<DT, ASYM, BITS, true, kAligned, F>(p, plan, sms, stream);
  }
  const int64_t needed = ceil_div(plan.chunks, int64_t(kThreads) * kUnroll);
  int resident = 0;
  KVQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, tensor_stats_kernel<DT, kAligned>, kThreads, 0));
  // Pass 1: one resident wave (its blocks stride over everything), at most kMaxPartials blocks.
  plan.partials = static_cast<int>(std::min<int64_t>({needed, int64_t(sms) * std::max(resident, 1), kMaxPartials}));
  tensor_stats_kernel<DT, kAligned><<<plan.partials, kThreads, 0, stream>>>(p, plan);
  KVQ_CHECK_LAUNCH();
  launch_encode<DT, ASYM, BITS, false, kAligned, F>(p, plan, sms, stream);
}

// The one place where run-time scheme, dtype and alignment become template arguments.
template <InputDtype DT, bool kAligned>
void dispatch_scheme(const QuantizeParams& p, const TensorPlan& plan, cudaStream_t stream) {
  const bool asym = p.scheme.asymmetric, int8 = p.scheme.bits == 8;
  if (p.scheme.fp8())
    detail::with_fp8_format(p.scheme, [&](auto f) { launch_passes<DT, false, 8, kAligned, decltype(f)::value>(p, plan, stream); });
  else if (asym)
    int8 ? launch_passes<DT, true, 8, kAligned>(p, plan, stream) : launch_passes<DT, true, 4, kAligned>(p, plan, stream);
  else
    int8 ? launch_passes<DT, false, 8, kAligned>(p, plan, stream) : launch_passes<DT, false, 4, kAligned>(p, plan, stream);
}

template <InputDtype DT>
void dispatch_alignment(const QuantizeParams& p, const TensorPlan& plan, cudaStream_t stream) {
  wide_chunks_aligned(p) ? dispatch_scheme<DT, true>(p, plan, stream) : dispatch_scheme<DT, false>(p, plan, stream);
}

}  // namespace

// One stored scale group: a scheme that stores no scale at all (none yet; scale-free codes would
// come with one) is not this kernel's.
bool tensor2pass_supports(const Scheme& s, int64_t head_dim) {
  return s.granularity == Granularity::kTensor && (s.bits == 8 || s.bits == 4) && head_dim > 0 &&
         head_dim % kChunkElems == 0 && num_groups(s, KvShape{1, 1, 1, head_dim}) == 1;
}

void launch_quantize_tensor2pass(const QuantizeParams& p, cudaStream_t stream) {
  if (!tensor2pass_supports(p.scheme, p.shape.head_dim))
    throw InputError("quantize-tensor2pass: needs tensor granularity and D a multiple of 8");
  if (p.layout != CodeLayout::kPlanar) throw InputError("quantize-tensor2pass: writes the planar layout only");
  const KvShape& s = p.shape;
  if (s.numel() == 0) return;  // no group: nothing stored, as on the CPU
  const TensorPlan plan = make_tensor_plan(p);
  switch (p.in_dtype) {
    case InputDtype::kFp32: dispatch_alignment<InputDtype::kFp32>(p, plan, stream); break;
    case InputDtype::kFp16: dispatch_alignment<InputDtype::kFp16>(p, plan, stream); break;
    case InputDtype::kBf16: dispatch_alignment<InputDtype::kBf16>(p, plan, stream); break;
  }
}

}  // namespace kvq
