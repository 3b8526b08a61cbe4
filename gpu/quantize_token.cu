// The per-token quantize variant (token granularity, D a multiple of 8). A token (b, t) is one scale
// group of Hkv x D elements, Hkv rows of D that BNSH stores T x D apart. The token is cut into
// S = Hkv D / 8 chunks of 8 elements (chunk c: head c / (D/8), elements 8 (c % (D/8)) ..+8) and owned
// by a team of L lanes of one warp (L a power of two, 1..32): lane j takes chunks j, j + L, j + 2L ..
// so that the team's loads of one step are contiguous pieces of a head row. L is the smallest team
// that leaves at most K chunks a lane (K = 4, or 8 for large tokens of 16-bit input): the token is
// then read once, held in registers, reduced with xor-shuffles inside the team and encoded from the
// registers. Tokens of more than 32 K chunks (16-bit input: Hkv D > 2048) read their further chunks
// twice, the second time from L1/L2. Scales and zero points come from the codec's group_params(),
// codes from its IntegerCoder or Fp8Coder (FP8 in kernels of their own). Input whose
// chunks all lie on 16 bytes (the usual case) is read by kernels without the per-load alignment
// test. The plan (gpu/quantize_wide_plan.hpp) is tested on the CPU.
#include <algorithm>

#include "gpu/quantize_chunk.cuh"
#include "gpu/quantize_wide_plan.hpp"

namespace kvq {
namespace {

using detail::InputChunk;
using detail::kChunkElems;

constexpr int kThreads = 256;
constexpr int kMaxWaves = 4;  // grid: at most this many rounds of resident blocks; the warps loop

template <InputDtype DT, bool ASYM, int BITS, int K, bool kAligned, CodeFormat F>
__global__ void __launch_bounds__(kThreads) token_kernel(QuantizeParams p, TokenPlan plan) {
  using Chunk = InputChunk<DT>;
  using Storage = typename Chunk::Storage;
  constexpr bool FP8 = F != CodeFormat::kInt;
  const Scheme scheme = detail::fixed_scheme<ASYM, BITS, F>(p.scheme);
  const KvShape& s = p.shape;
  const Storage* input = static_cast<const Storage*>(p.input);
  const TeamWalk walk = token_walk(plan, blockIdx.x * int64_t(kThreads) + threadIdx.x, int64_t(gridDim.x) * kThreads);
  const int j = walk.j, L = 1 << plan.lanes_log2;
  const int lane_chunks = token_lane_chunks(plan, j);
  // Where the held chunks lie relative to their token (input elements, code bytes), the same for
  // every token: a table per block, read once a chunk. Computed per chunk (a division and two 64-bit
  // products) they cost ~20 instructions each, twice; kept in registers, K x 4 registers. The table:
  // 0.87-0.93x (H200, experiments/results/nvidia-h200/quantize-token-offsets/).
  auto input_offset_of = [&](const ChunkPos& at) { return at.h * p.stride_h + at.d0; };
  __shared__ int64_t input_offset[32 * K], code_byte_offset[32 * K];
  for (int e = threadIdx.x; e < L * K; e += kThreads) {
    const ChunkPos at = token_chunk(plan, e & (L - 1), e >> plan.lanes_log2);
    input_offset[e] = input_offset_of(at);
    code_byte_offset[e] = chunk_flat_offset(s, at) * BITS / 8;  // chunks start on whole bytes
  }
  __syncthreads();
  for (int64_t first = walk.warp_first; first < plan.tokens; first += walk.stride) {  // uniform across the warp
    const int64_t token = first + walk.team_in_warp;
    const bool active = token < plan.tokens;
    int64_t b = 0, t = 0;
    if (active) token_coordinates(plan, s, token, b, t);
    const int n = active ? lane_chunks : 0;
    const Storage* src = input + b * p.stride_b + t * p.stride_t;
    // Chunk positions do not depend on the token: left visible, the compiler keeps all of them
    // across the loop (+8..40 registers). Through a copy of j it cannot see into, each is read
    // (held chunks) or recomputed (further ones) where it is used.
    int jt = j;
    asm volatile("" : "+r"(jt));
    auto load = [&](Chunk& c, int k) {
      const int64_t at = k < K ? input_offset[(k << plan.lanes_log2) + jt] : input_offset_of(token_chunk(plan, jt, k));
      c.template load_chunk<kAligned>(src + at);
    };

    Chunk cache[K];
#pragma unroll
    for (int k = 0; k < K; ++k)  // every load before any arithmetic
      if (k < n) load(cache[k], k);
    detail::LaneStats<DT, ASYM> acc;  // symmetric schemes (FP8 too) read amax only
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (k < n) acc.add(cache[k]);
    for (int k = K; k < n; ++k) {
      Chunk c;
      load(c, k);
      acc.add(c);
    }
    GroupStats st = acc.finish();
    const bool finite = st.all_finite(ASYM);  // this lane's chunks, before the merge
    st = detail::merge_lanes(st, L);
    const GroupParams gp = group_params(st, scheme);  // an inactive lane's: empty, unused
    const detail::GroupCoder<FP8> coder = detail::group_coder<FP8>(gp, st, scheme);
    // Integer codes of a warp with a token of a short scale (bf16 values on its half-steps) by the
    // residual alone; elsewhere by the biased fma, and chunks that met a half-step again by the residual
    // (encode_chunk_biased / _residual). Decided once, by every lane, before any leaves.
    bool by_residual = false;
    if constexpr (!FP8) by_residual = __any_sync(0xffffffffu, active && coder.short_scale);
    if (!active) continue;

    // flat [B, Hkv, T, D] index of the chunk's element 0: also where its codes go
    const int64_t flat0 = token_flat_base(s, b, t);
    auto flat_index = [&](const ChunkPos& at) { return flat0 + chunk_flat_offset(s, at); };
    if (!finite) {  // rare: report this lane's first non-finite element
      for (int k = 0; k < n; ++k) {
        Chunk c;
        load(c, k);
        detail::report_non_finite(p, c, static_cast<unsigned long long>(flat_index(token_chunk(plan, jt, k))));
      }
    }
    if (j == 0) {
      if (gp.overflow) atomicMin(p.first_overflow, static_cast<unsigned long long>(token));
      detail::store_param(p.scales, token, gp.scale, scheme.scale_dtype);
      if (ASYM) detail::store_param(p.zeros, token, gp.zero, scheme.scale_dtype);
    }
    uint8_t* const token_codes = p.codes + flat0 * BITS / 8;
    auto codes_of = [&](int k) {
      return k < K ? token_codes + code_byte_offset[(k << plan.lanes_log2) + jt]
                   : p.codes + flat_index(token_chunk(plan, jt, k)) * BITS / 8;
    };
    // Bit k: held chunk k (bit K: a further one) was not sure. The retry codes again only the slots k
    // some lane of the warp was unsure of, not all: at Hkv 1 a warp holds 8 tokens, and int4-token-asym
    // then coded 1.1 slots of 4 again instead of 2.0 (0.90-0.93x, H200,
    // experiments/results/nvidia-h200/quantize-token-chunk-retry/).
    unsigned unsure = 0;
    auto each_chunk = [&](unsigned which, auto&& encode) {  // encode(dst, chunk) -> sure
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (k < n && (which >> k & 1u) && !encode(codes_of(k), cache[k])) unsure |= 1u << k;
      for (int k = K; k < n && (which >> K & 1u); ++k) {
        Chunk c;
        load(c, k);
        if (!encode(codes_of(k), c)) unsure |= 1u << K;
      }
    };
    constexpr unsigned kAll = (2u << K) - 1;
    if constexpr (FP8) {
      each_chunk(kAll, [&](uint8_t* dst, const Chunk& c) { return detail::encode_chunk<ASYM, BITS>(dst, c, coder, scheme); });
    } else {
      if (!by_residual)
        each_chunk(kAll, [&](uint8_t* dst, const Chunk& c) { return detail::encode_chunk_biased<ASYM, BITS>(dst, c, coder); });
      const unsigned again = by_residual ? kAll : __reduce_or_sync(__activemask(), unsure);
      if (again) {
        unsure = 0;
        each_chunk(again, [&](uint8_t* dst, const Chunk& c) { return detail::encode_chunk_residual<ASYM, BITS>(dst, c, coder); });
      }
      if (coder.clamp) unsure = kAll;
    }
    const bool sure = unsure == 0;
    for (int k = 0; !sure && k < n; ++k) {  // rare: the lane's chunks again, by the division
      Chunk c;
      load(c, k);
      detail::encode_chunk_exact<BITS>(codes_of(k), c, gp, scheme);
    }
  }
}

template <InputDtype DT, bool ASYM, int BITS, int K, bool kAligned, CodeFormat F = CodeFormat::kInt>
void launch_kernel(const QuantizeParams& p, const TokenPlan& plan, cudaStream_t stream) {
  int device = 0, sms = 0, resident = 0;
  KVQ_CUDA_CHECK(cudaGetDevice(&device));
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  KVQ_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, token_kernel<DT, ASYM, BITS, K, kAligned, F>, kThreads, 0));
  const int64_t needed = ceil_div(plan.tokens << plan.lanes_log2, kThreads);
  const int blocks = static_cast<int>(std::min<int64_t>(needed, int64_t(sms) * std::max(resident, 1) * kMaxWaves));
  token_kernel<DT, ASYM, BITS, K, kAligned, F><<<blocks, kThreads, 0, stream>>>(p, plan);
  KVQ_CHECK_LAUNCH();
}

// The one place where run-time scheme and dtype become template arguments.
template <InputDtype DT, int K, bool kAligned>
void dispatch_format(const QuantizeParams& p, const TokenPlan& plan, cudaStream_t stream) {
  const bool asym = p.scheme.asymmetric, int8 = p.scheme.bits == 8;
  if (p.scheme.fp8())
    detail::with_fp8_format(p.scheme, [&](auto f) { launch_kernel<DT, false, 8, K, kAligned, decltype(f)::value>(p, plan, stream); });
  else if (asym)
    int8 ? launch_kernel<DT, true, 8, K, kAligned>(p, plan, stream) : launch_kernel<DT, true, 4, K, kAligned>(p, plan, stream);
  else
    int8 ? launch_kernel<DT, false, 8, K, kAligned>(p, plan, stream) : launch_kernel<DT, false, 4, K, kAligned>(p, plan, stream);
}

template <InputDtype DT>
void dispatch_scheme(const QuantizeParams& p, const TokenPlan& plan, bool aligned, cudaStream_t stream) {
  if (!aligned) dispatch_format<DT, 4, false>(p, plan, stream);  // the plan keeps K = 4 (make_token_plan)
  else if (plan.cached == 4 || DT == InputDtype::kFp32) dispatch_format<DT, 4, true>(p, plan, stream);
  else if constexpr (DT != InputDtype::kFp32) dispatch_format<DT, 8, true>(p, plan, stream);
}

}  // namespace

bool tokenteam_supports(const Scheme& s, int64_t head_dim) {
  return s.granularity == Granularity::kToken && (s.bits == 8 || s.bits == 4) && head_dim > 0 &&
         head_dim % kChunkElems == 0;
}

void launch_quantize_tokenteam(const QuantizeParams& p, cudaStream_t stream) {
  if (!tokenteam_supports(p.scheme, p.shape.head_dim))
    throw InputError("quantize-tokenteam: needs token granularity and D a multiple of 8");
  if (p.layout != CodeLayout::kPlanar) throw InputError("quantize-tokenteam: writes the planar layout only");
  const KvShape& s = p.shape;
  if (s.batch * s.tokens == 0) return;
  if (s.heads * s.head_dim / kChunkElems > (int64_t{1} << 30))
    throw InputError("quantize-tokenteam: tokens of more than 2^33 elements are not supported");
  const bool aligned = wide_chunks_aligned(p);
  const TokenPlan plan = make_token_plan(s, p.in_dtype, aligned);
  switch (p.in_dtype) {
    case InputDtype::kFp32: dispatch_scheme<InputDtype::kFp32>(p, plan, aligned, stream); break;
    case InputDtype::kFp16: dispatch_scheme<InputDtype::kFp16>(p, plan, aligned, stream); break;
    case InputDtype::kBf16: dispatch_scheme<InputDtype::kBf16>(p, plan, aligned, stream); break;
  }
}

}  // namespace kvq
