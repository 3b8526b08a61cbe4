// The per-token quantize variant (token granularity, D a multiple of 8). A token (b, t) is one scale
// group of Hkv x D elements, Hkv rows of D that BNSH stores T x D apart. The token is cut into
// S = Hkv D / 8 chunks of 8 elements (chunk c: head c / (D/8), elements 8 (c % (D/8)) ..+8) and owned
// by a team of L lanes of one warp (L a power of two, 1..32): lane j takes chunks j, j + L, j + 2L ..
// so that the team's loads of one step are contiguous pieces of a head row. L is the smallest team
// that leaves at most K chunks a lane (K = 4, or 8 for large tokens): the token is then read once,
// held in registers, reduced with xor-shuffles inside the team and encoded from the registers.
// Tokens larger than 32 K chunks (Hkv D > 2048) read their further chunks twice, the second time
// from L1/L2. Scales and zero points come from the codec's group_params(), codes from encode().
#include <algorithm>

#include "gpu/quantize_chunk.cuh"

namespace kvq {
namespace {

using detail::InputChunk;
using detail::kChunkElems;

constexpr int kThreads = 256;
constexpr int kMaxWaves = 4;  // grid: at most this many rounds of resident blocks; the warps loop

struct TokenPlan {
  int64_t tokens = 0;        // B * T: the groups
  int chunks_per_token = 0;  // S = Hkv * D / 8
  int chunks_per_row = 0;    // D / 8
  int row_log2 = -1;         // log2(D / 8) when a power of two (shifts, not divisions), else -1
  int lanes_log2 = 0;        // team size L = 1 << lanes_log2
  bool narrow = false;       // tokens and T fit 32 bits: 32-bit division for (b, t)
};

// Chunk c of a token: its head and first element along D.
__device__ __forceinline__ void chunk_position(const TokenPlan& plan, int c, int& h, int& d0) {
  h = plan.row_log2 >= 0 ? c >> plan.row_log2 : c / plan.chunks_per_row;
  d0 = (c - h * plan.chunks_per_row) * kChunkElems;
}

template <InputDtype DT, bool ASYM, int BITS, int K>
__global__ void __launch_bounds__(kThreads) token_kernel(QuantizeParams p, TokenPlan plan) {
  using Chunk = InputChunk<DT>;
  using Storage = typename Chunk::Storage;
  const Scheme scheme = detail::fixed_scheme<ASYM, BITS>(p.scheme);
  const KvShape& s = p.shape;
  const Storage* input = static_cast<const Storage*>(p.input);
  const int L = 1 << plan.lanes_log2, lane = threadIdx.x & 31, j = lane & (L - 1);
  const int S = plan.chunks_per_token;
  const int lane_chunks = j < S ? (S - j + L - 1) >> plan.lanes_log2 : 0;
  const int64_t team_stride = (int64_t(gridDim.x) * kThreads) >> plan.lanes_log2;
  // The loop runs on the warp's first team, so all 32 lanes reach every shuffle.
  const int64_t warp_first = (blockIdx.x * int64_t(kThreads) + threadIdx.x - lane) >> plan.lanes_log2;
  for (int64_t first = warp_first; first < plan.tokens; first += team_stride) {
    const int64_t token = first + (lane >> plan.lanes_log2);
    const bool active = token < plan.tokens;
    int64_t b = 0, t = 0;
    if (active) {
      b = plan.narrow ? int64_t(uint32_t(token) / uint32_t(s.tokens)) : token / s.tokens;
      t = token - b * s.tokens;
    }
    const int n = active ? lane_chunks : 0;
    const Storage* src = input + b * p.stride_b + t * p.stride_t;
    auto load = [&](Chunk& c, int k) {
      int h, d0;
      chunk_position(plan, j + (k << plan.lanes_log2), h, d0);
      c.load(src + h * p.stride_h + d0);
    };

    Chunk cache[K];
#pragma unroll
    for (int k = 0; k < K; ++k)  // every load before any arithmetic
      if (k < n) load(cache[k], k);
    GroupStats st;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (k < n) detail::add_chunk<ASYM>(st, cache[k]);
    for (int k = K; k < n; ++k) {
      Chunk c;
      load(c, k);
      detail::add_chunk<ASYM>(st, c);
    }
    const bool finite = st.all_finite(ASYM);  // this lane's chunks, before the merge
    st = detail::shuffle_merge(st, L, ASYM);
    if (!active) continue;

    // Codes of head h start at element ((b Hkv + h) T + t) D of the planar [B, Hkv, T, D] array.
    const int64_t code_base = (b * s.heads * s.tokens + t) * s.head_dim, head_step = s.tokens * s.head_dim;
    auto code_index = [&](int k, int& h, int& d0) {
      chunk_position(plan, j + (k << plan.lanes_log2), h, d0);
      return code_base + h * head_step + d0;  // flat [B, Hkv, T, D] index of the chunk's element 0
    };
    if (!finite) {  // rare: report this lane's first non-finite element
      for (int k = 0; k < n; ++k) {
        int h, d0;
        const int64_t flat = code_index(k, h, d0);
        Chunk c;
        c.load(src + h * p.stride_h + d0);
        detail::report_non_finite(p, c, static_cast<unsigned long long>(flat));
      }
    }
    const GroupParams gp = group_params(st, scheme);
    if (j == 0) {
      if (gp.overflow) atomicMin(p.first_overflow, static_cast<unsigned long long>(token));
      detail::store_param(p.scales, token, gp.scale, scheme.scale_dtype);
      if (ASYM) detail::store_param(p.zeros, token, gp.zero, scheme.scale_dtype);
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (k < n) {
        int h, d0;
        const int64_t flat = code_index(k, h, d0);
        detail::encode_chunk<ASYM, BITS>(p.codes + flat * BITS / 8, cache[k], gp, scheme);
      }
    }
    for (int k = K; k < n; ++k) {
      int h, d0;
      const int64_t flat = code_index(k, h, d0);
      Chunk c;
      c.load(src + h * p.stride_h + d0);
      detail::encode_chunk<ASYM, BITS>(p.codes + flat * BITS / 8, c, gp, scheme);
    }
  }
}

template <InputDtype DT, bool ASYM, int BITS, int K>
void launch_kernel(const QuantizeParams& p, const TokenPlan& plan, cudaStream_t stream) {
  int device = 0, sms = 0, resident = 0;
  KVQ_CUDA_CHECK(cudaGetDevice(&device));
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  KVQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, token_kernel<DT, ASYM, BITS, K>, kThreads, 0));
  const int64_t needed = ceil_div(plan.tokens << plan.lanes_log2, kThreads);
  const int blocks = static_cast<int>(std::min<int64_t>(needed, int64_t(sms) * std::max(resident, 1) * kMaxWaves));
  token_kernel<DT, ASYM, BITS, K><<<blocks, kThreads, 0, stream>>>(p, plan);
  KVQ_CHECK_LAUNCH();
}

// The one place where run-time scheme and dtype become template arguments.
template <InputDtype DT>
void dispatch_scheme(const QuantizeParams& p, const TokenPlan& plan, int k, cudaStream_t stream) {
  const bool asym = p.scheme.asymmetric, int8 = p.scheme.bits == 8;
  if (k == 4 || DT == InputDtype::kFp32) {
    if (asym) int8 ? launch_kernel<DT, true, 8, 4>(p, plan, stream) : launch_kernel<DT, true, 4, 4>(p, plan, stream);
    else int8 ? launch_kernel<DT, false, 8, 4>(p, plan, stream) : launch_kernel<DT, false, 4, 4>(p, plan, stream);
  } else if constexpr (DT != InputDtype::kFp32) {
    if (asym) int8 ? launch_kernel<DT, true, 8, 8>(p, plan, stream) : launch_kernel<DT, true, 4, 8>(p, plan, stream);
    else int8 ? launch_kernel<DT, false, 8, 8>(p, plan, stream) : launch_kernel<DT, false, 4, 8>(p, plan, stream);
  }
}

int log2_if_power_of_two(int64_t x) {
  if (x <= 0 || (x & (x - 1)) != 0) return -1;
  int l = 0;
  while ((int64_t{1} << l) < x) ++l;
  return l;
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
  TokenPlan plan;
  plan.tokens = s.batch * s.tokens;
  if (plan.tokens == 0) return;
  if (s.heads * s.head_dim / kChunkElems > (int64_t{1} << 30))
    throw InputError("quantize-tokenteam: a token of more than 2^33 elements");
  plan.chunks_per_row = static_cast<int>(s.head_dim / kChunkElems);
  plan.chunks_per_token = static_cast<int>(s.heads * plan.chunks_per_row);
  plan.row_log2 = log2_if_power_of_two(plan.chunks_per_row);
  plan.narrow = plan.tokens < (int64_t{1} << 32);
  // K = 4 chunks a lane (64 bytes of 16-bit input in flight) when a warp holds the token that way;
  // larger tokens of 16-bit input take K = 8 (fp32 chunks are twice the registers: K = 4 would
  // spill at 8), and the chunks beyond 32 K are read twice.
  const int k = plan.chunks_per_token <= 32 * 4 || p.in_dtype == InputDtype::kFp32 ? 4 : 8;
  const int64_t lanes = ceil_div(plan.chunks_per_token, k);
  while (plan.lanes_log2 < 5 && (int64_t{1} << plan.lanes_log2) < lanes) ++plan.lanes_log2;
  switch (p.in_dtype) {
    case InputDtype::kFp32: dispatch_scheme<InputDtype::kFp32>(p, plan, k, stream); break;
    case InputDtype::kFp16: dispatch_scheme<InputDtype::kFp16>(p, plan, k, stream); break;
    case InputDtype::kBf16: dispatch_scheme<InputDtype::kBf16>(p, plan, k, stream); break;
  }
}

}  // namespace kvq
