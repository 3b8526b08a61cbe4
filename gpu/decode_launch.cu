// Launching the decode kernels: the split-K merge kernel, the last-split merge's counters, the
// tensor-core kernels' entries, clusters and key regions' streams, and the dispatch to the per-format
// instantiations. The plan (splits, configuration) is decode_plan.cu's; operands and the reasons a
// launch is refused, decode_operands.cpp's.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "gpu/decode_kernel.cuh"
#include "gpu/decode_tc_launch.cuh"
#include "quant/errors.hpp"

namespace kvq {
namespace detail {

extern template struct DecodeFormatKernels<KvFormat::kBf16>;
extern template struct DecodeFormatKernels<KvFormat::kFp16>;
extern template struct DecodeFormatKernels<KvFormat::kInt8>;
extern template struct DecodeFormatKernels<KvFormat::kInt4>;
extern template struct DecodeFormatKernels<KvFormat::kInt4Fbgemm>;
KVQ_TC_EACH_PAIR(KVQ_TC_EXTERN_ENTRY)  // each compiled in its own translation unit

// One CTA per (b, query head), one thread per d: O = sum_s exp(LSE_s - LSE) O_s over the splits
// that saw keys, in split order (DESIGN.md's merge; reference/attention.cpp merge_partials).
// At small batches this kernel is a chain of dependent loads, so the split LSEs are loaded by all
// threads at once into shared memory and the weights computed once, not per split and output; the
// arithmetic and its order are unchanged (the same bits).
KVQ_HD constexpr int merge_smem_floats(int splits) { return (splits + 7) / 8 * 8; }

__global__ void merge_splits_kernel(const DecodeParams p) {
  // [padded splits]: LSE_s, then the weights exp(LSE_s - LSE); then [splits] exp(LSE_s - max). The
  // splits of a windowed decode (its regions') may exceed kMaxSplits: both arrays are sized per launch.
  extern __shared__ float split_lse[];
  float* split_exp = split_lse + merge_smem_floats(p.splits);
  __shared__ float merged_lse;
  __shared__ float warp_max[4];
  const int64_t bh = blockIdx.x;
  const int64_t stride = p.batch * p.q_heads;
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < p.splits; s += blockDim.x) {
    split_lse[s] = p.partial_lse[s * stride + bh];
    mx = fmaxf(mx, split_lse[s]);
  }
  // The max in any order is the same number; the exps in parallel, their sum serial and in split
  // order as before (the same bits), so thread 0 no longer walks the splits through exp one by one.
  for (int o = 16; o >= 1; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = mx;
  __syncthreads();
  for (int w = 0; w < static_cast<int>(blockDim.x + 31) / 32; ++w) mx = fmaxf(mx, warp_max[w]);
  if (mx != -INFINITY)
    for (int s = threadIdx.x; s < p.splits; s += blockDim.x) split_exp[s] = exp_natural(split_lse[s] - mx);
  __syncthreads();
  if (threadIdx.x == 0) {
    float lse = -INFINITY, sum = 0.0f;
    if (mx != -INFINITY) {
      for (int s = 0; s < p.splits; ++s) sum += split_exp[s];
      lse = mx + logf(sum);
    }
    merged_lse = lse;
  }
  __syncthreads();
  const float lse = merged_lse;
  // The unrolled loop below reads the weights 8 at a time: the padding up to a multiple of 8 holds zeros.
  for (int s = threadIdx.x; s < merge_smem_floats(p.splits); s += blockDim.x)
    split_lse[s] = s < p.splits ? exp_natural(split_lse[s] - lse) : 0.0f;
  __syncthreads();
  for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    float o = 0.0f;
    if (lse != -INFINITY) {
      const float* po = p.partial_o + bh * p.head_dim + d;
#pragma unroll 8
      for (int s = 0; s < p.splits; ++s) o = __fmaf_rn(split_lse[s], po[s * stride * p.head_dim], o);
    }
    p.out[bh * p.head_dim + d] = fp32_to_bf16_bits(o);
  }
  if (threadIdx.x == 0) p.lse[bh] = lse;
}

const void* kernel_of(const DecodeParams& p);

// The (b, KV head, block of 8 query heads) groups of a tensor-core launch: its CTAs per split, and the
// last-split merge's counters (the kernel's TcPlan::head_blocks, Tr::kHeads = 8).
int64_t tc_head_block_groups(const DecodeParams& p) { return p.batch * p.kv_heads * ((p.q_heads / p.kv_heads + 7) / 8); }

// Where the last split's merge measured faster than the merge kernel (H100, experiments/results/.../
// last-split-merge): many splits (the merge kernel's threads then read them in a chain of round
// trips, 8 splits each) over a head block of few rows (<= 256 values: the last CTA's one pass). SmolLM2
// B = 1 T = 8K (44 splits, 3 x 64): 0.85-0.95x; llama8b B = 1 T = 8K (16 splits, 4 x 128) 1.06-1.09x,
// T = 32K (29-43 splits, 4 x 128) 1.03-1.17x, seed000 B = 32 (8-11 splits, 8 x 128) 1.05-1.15x.
bool last_split_merge_pays(const DecodeParams& p) {
  const int64_t rows = std::min<int64_t>(p.q_heads / p.kv_heads, 8) * p.head_dim;
  return p.splits > 16 && rows <= 256;
}
// The last split copies the partial O rows 16 bytes at a time (a caller's buffer may be less aligned).
bool last_split_merge_fits(const DecodeParams& p) { return reinterpret_cast<uintptr_t>(p.partial_o) % 16 == 0; }

// Zeroed counters for the last-split merge (DecodeParams::split_counters), `count` of them, one set per
// (device, stream): every launch leaves them zero again, and stream order keeps two launches from
// sharing them at once. (A graph captured on stream S and replayed elsewhere uses S's set: replays
// concurrent with decodes on S would share it.) Sets are never freed: a captured graph holds the
// pointer. A set is allocated on first use, also while the stream captures a graph: this thread's
// capture mode relaxed for the allocation, the zeroing on a stream of its own (not in the graph).
unsigned* split_counters(cudaStream_t stream, int64_t count) {
  static std::map<std::pair<int, cudaStream_t>, std::pair<unsigned*, int64_t>> held;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  int device = 0;
  KVQ_CUDA_CHECK(cudaGetDevice(&device));
  auto& [counters, size] = held[{device, stream}];
  if (size >= count) return counters;
  int64_t n = 4096;
  while (n < count) n *= 2;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  KVQ_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  unsigned* fresh = nullptr;
  cudaStream_t side = nullptr;
  cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&fresh), n * sizeof(unsigned));
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMemsetAsync(fresh, 0, n * sizeof(unsigned), side);
  if (e == cudaSuccess) e = cudaStreamSynchronize(side);
  if (side) cudaStreamDestroy(side);
  if (e != cudaSuccess && fresh) cudaFree(fresh);
  KVQ_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  if (e != cudaSuccess) {  // out of memory, or a capture that forbids it: the merge kernel runs
    (void)cudaGetLastError();
    return nullptr;
  }
  counters = fresh, size = n;  // a smaller set stays allocated: a captured graph may use it
  return counters;
}

// The tensor-core kernels of p's K and V formats.
TcEntry tc_entry_of(const DecodeParams& p) {
  switch (tc_codes(p.k_format)) {
    case KvFormat::kBf16: return tc_entry_for_v<KvFormat::kBf16>(p.v_format);
    case KvFormat::kFp16: return tc_entry_for_v<KvFormat::kFp16>(p.v_format);
    case KvFormat::kInt8: return tc_entry_for_v<KvFormat::kInt8>(p.v_format);
    case KvFormat::kInt4: return tc_entry_for_v<KvFormat::kInt4>(p.v_format);
    case KvFormat::kFp8E4m3: return tc_entry_for_v<KvFormat::kFp8E4m3>(p.v_format);
    case KvFormat::kFp8E5m2: return tc_entry_for_v<KvFormat::kFp8E5m2>(p.v_format);
    case KvFormat::kInt5: return tc_entry_for_v<KvFormat::kInt5>(p.v_format);
    case KvFormat::kLut4: return tc_entry_for_v<KvFormat::kLut4>(p.v_format);
    case KvFormat::kInt4Fbgemm: break;
  }
  return {};
}

// The device's whole opt-in shared memory for every kernel of p's pair, once per pair.
const TcEntry& tc_prepared_entry(const DecodeParams& p) {
  static std::map<std::pair<KvFormat, KvFormat>, TcEntry> prepared;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::pair{tc_codes(p.k_format), tc_codes(p.v_format)};
  auto it = prepared.find(key);
  if (it != prepared.end()) return it->second;
  const TcEntry e = tc_entry_of(p);
  if (!e.kernel) throw CudaError(fmt::format("decode-tc: no kernels for K {} / V {} (not a pair it reads, or left out of this build "
                                               "by KVQ_TC_PAIRS)", to_string(p.k_format), to_string(p.v_format)));
  int device = 0, optin = 0;
  KVQ_CUDA_CHECK(cudaGetDevice(&device));
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  for (const void* k : e.kernels())
    KVQ_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  return prepared.emplace(key, e).first->second;
}

// The multiple of keys p's tensor-core kernel gives each split.
int tc_split_round(const DecodeParams& p) { return tc_prepared_entry(p).split_round(p); }

// Resident CTAs per SM of the kernel p runs (1 if unknown).
int ctas_per_sm(const DecodeParams& p) {
  int per_sm = 1;
  if (p.family == DecodeFamily::kTensorCore) {
    // A paged cache plans its splits by the contiguous kernel's residency: the same splits decode to
    // the same bits, and the paged kernel's fewer registers would buy splits whose waves fill worse
    // (H100, SmolLM2 B = 64 T = 8K int8-head: 5 splits at 4 CTAs / SM 1.14x the contiguous 2 at 3).
    DecodeParams contiguous = p;
    contiguous.block_table = contiguous.v_block_table = contiguous.window_block_table = nullptr;
    const TcEntry& e = tc_prepared_entry(p);
    const void* fn = e.kernel(contiguous);
    if (!fn) fn = e.kernel(p);
    if (fn)
      KVQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, 128, static_cast<size_t>(e.smem_bytes(p))));
  } else if (const void* fn = kernel_of(p)) {
    KVQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kDecodeThreads, 0));
  }
  return std::max(per_sm, 1);
}

// The launch of p's tensor-core kernel `fn`: its grid, and a cluster of p.splits CTAs when p merges in clusters.
struct TcLaunch {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute cluster = {};
  TcLaunch(const DecodeParams& p, int64_t ctas, int smem_bytes, cudaStream_t stream) {
    config.gridDim = dim3(static_cast<unsigned>(ctas));
    config.blockDim = dim3(128);
    config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    config.stream = stream;
    if (p.cluster_merge) {  // the splits of a (b, KV head) are consecutive CTAs: one cluster
      cluster.id = cudaLaunchAttributeClusterDimension;
      cluster.val.clusterDim.x = static_cast<unsigned>(p.splits), cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
      config.attrs = &cluster, config.numAttrs = 1;
    }
  }
};

// Whether p's splits merge inside CTA clusters instead of in the merge kernel: one key region of 2 to
// kMaxClusterSplits splits, one block of query heads per KV head (a cluster is consecutive CTAs: the
// splits of one (b, KV head)), an sm_90 device, and every cluster resident at once (clusters are
// placed whole within a GPC: a grid of one wave can need two as clusters). There the merge kernel's
// launch and its dependent loads are a third of a call (H100, llama8b B = 1 T = 1K: ~4 of 12.6 us).
bool tc_cluster_merge_fits(const DecodeParams& p) {
  if (p.splits < 2 || p.splits > kMaxClusterSplits || p.region_count != 1 || p.q_heads / p.kv_heads > 8) return false;
  int device = 0, major = 0;
  KVQ_CUDA_CHECK(cudaGetDevice(&device));
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 9) return false;
  const TcEntry& e = tc_prepared_entry(p);
  const void* fn = e.kernel(p);
  if (!fn) return false;
  const int smem = e.smem_bytes(p);
  static std::map<std::tuple<int, const void*, int, int>, int> resident;  // (device, kernel, smem, splits) -> clusters
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::tuple{device, fn, smem, p.splits};
  auto it = resident.find(key);
  if (it == resident.end()) {
    DecodeParams one = p;
    one.cluster_merge = true;
    TcLaunch launch(one, p.splits, smem, nullptr);
    int clusters = 0;
    KVQ_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, fn, &launch.config));
    it = resident.emplace(key, clusters).first;
  }
  return p.batch * p.kv_heads <= it->second;
}

void launch_tc(const DecodeParams& p, cudaStream_t stream) {
  const TcEntry& e = tc_prepared_entry(p);
  const void* fn = e.kernel(p);
  if (!fn) throw CudaError(fmt::format("decode-tc: no kernel for head_dim {}", p.head_dim));
  const int64_t ctas = tc_head_block_groups(p) * p.splits;
  if (ctas == 0) return;
  // The kernel takes its CTA index and key spans apart with 32-bit dividers (TcPlan's FastDiv).
  constexpr int64_t kLimit = int64_t{1} << 31;
  if (ctas >= kLimit || p.tokens + kMaxSplits >= kLimit)
    throw InputError(fmt::format("decode (tensor cores): {} CTAs for B={} Hkv={} and {} splits, T={}: expected fewer "
                                 "than 2^31 of each", ctas, p.batch, p.kv_heads, p.splits, p.tokens));
  TcPlan plan = e.plan(p);
  void* args[] = {const_cast<DecodeParams*>(&p), &plan};
  TcLaunch launch(p, ctas, e.smem_bytes(p), stream);
  KVQ_CUDA_CHECK(cudaLaunchKernelExC(&launch.config, fn, args));
}

// The launches of a windowed decode (one per key region) run side by side, forked from `stream` onto
// streams of this thread and joined back before the merge: at small batches each launch is a latency
// chain that leaves the GPU nearly idle, so serial launches cost the sum of the chains. Under stream
// capture the fork and join become parallel branches of the graph. The quantized region (the long
// one) is launched first: its CTAs take the SMs' slots as one wave and the windows' few CTAs the slots
// left; launched after the windows' CTAs, some of its CTAs waited for them (H200, int4-g32-asym+w128
// seed000 B = 32 / 128 / 512: 44.5 / 102.6 / 368.9 us -> 40.5 / 94.8 / 352.9).
void launch_regions(const std::vector<DecodeParams>& regions, cudaStream_t stream) {
  struct Side {
    cudaStream_t streams[3] = {};
    cudaEvent_t fork = nullptr, joins[3] = {};
  };
  thread_local std::map<int, Side> sides;  // per device
  if (regions.size() == 1) return launch_tc(regions.front(), stream);
  if (regions.size() > 4) throw CudaError(fmt::format("decode-tc: {} key regions (at most 4)", regions.size()));
  int device = 0;
  KVQ_CUDA_CHECK(cudaGetDevice(&device));
  Side& side = sides[device];
  if (!side.fork) {
    KVQ_CUDA_CHECK(cudaEventCreateWithFlags(&side.fork, cudaEventDisableTiming));
    for (int i = 0; i < 3; ++i) {
      KVQ_CUDA_CHECK(cudaStreamCreateWithFlags(&side.streams[i], cudaStreamNonBlocking));
      KVQ_CUDA_CHECK(cudaEventCreateWithFlags(&side.joins[i], cudaEventDisableTiming));
    }
  }
  KVQ_CUDA_CHECK(cudaEventRecord(side.fork, stream));
  launch_tc(regions.front(), stream);
  for (size_t r = 1; r < regions.size(); ++r) {
    KVQ_CUDA_CHECK(cudaStreamWaitEvent(side.streams[r - 1], side.fork, 0));
    launch_tc(regions[r], side.streams[r - 1]);
  }
  for (size_t r = 1; r < regions.size(); ++r) {
    KVQ_CUDA_CHECK(cudaEventRecord(side.joins[r - 1], side.streams[r - 1]));
    KVQ_CUDA_CHECK(cudaStreamWaitEvent(stream, side.joins[r - 1], 0));
  }
}

// The CUDA-core kernel of p's (one) format; nullptr for the formats it does not read.
const void* kernel_of(const DecodeParams& p) {
  if (p.k_format != p.v_format) return nullptr;
  switch (p.k_format) {
    case KvFormat::kBf16: return DecodeFormatKernels<KvFormat::kBf16>::kernel(p.head_dim, p.heads_per_cta);
    case KvFormat::kFp16: return DecodeFormatKernels<KvFormat::kFp16>::kernel(p.head_dim, p.heads_per_cta);
    case KvFormat::kInt8: return DecodeFormatKernels<KvFormat::kInt8>::kernel(p.head_dim, p.heads_per_cta);
    case KvFormat::kInt4: return DecodeFormatKernels<KvFormat::kInt4>::kernel(p.head_dim, p.heads_per_cta);
    case KvFormat::kInt4Fbgemm:
      return DecodeFormatKernels<KvFormat::kInt4Fbgemm>::kernel(p.head_dim, p.heads_per_cta);
    case KvFormat::kFp8E4m3:
    case KvFormat::kFp8E5m2:
    case KvFormat::kInt5:
    case KvFormat::kLut4: break;
  }
  return nullptr;
}

}  // namespace detail

void launch_decode(const DecodeParams& p, cudaStream_t stream) {
  check_decode_params(p);
  if (p.batch == 0) return;
  std::vector<DecodeParams> regions = decode_regions(p);
  int splits = 0;
  for (const DecodeParams& region : regions) splits += region.splits;
  bool merged = splits == 1;
  if (p.family == DecodeFamily::kTensorCore) {
    const std::string why = tensor_core_unsupported_reason(p);
    if (!why.empty()) throw InputError("decode (tensor cores): " + why);
    const bool auto_merge = p.split_merge == SplitMerge::kAuto;
    const bool in_clusters = auto_merge && regions.size() == 1 && detail::tc_cluster_merge_fits(regions.front());
    for (DecodeParams& region : regions) region.cluster_merge = in_clusters;
    merged = merged || in_clusters;
    if (!merged && regions.size() == 1 && detail::last_split_merge_fits(p) &&
        (p.split_merge == SplitMerge::kLastSplit || (auto_merge && detail::last_split_merge_pays(regions.front())))) {
      DecodeParams& one = regions.front();
      one.split_counters = detail::split_counters(stream, detail::tc_head_block_groups(one));
      merged = one.split_counters != nullptr;
    }
    detail::launch_regions(regions, stream);
  } else if (const std::string why = cuda_core_unsupported_reason(p); !why.empty()) {
    throw InputError("decode (CUDA cores): " + why);
  } else switch (p.k_format) {
    case KvFormat::kBf16: detail::DecodeFormatKernels<KvFormat::kBf16>::launch(p, stream); break;
    case KvFormat::kFp16: detail::DecodeFormatKernels<KvFormat::kFp16>::launch(p, stream); break;
    case KvFormat::kInt8: detail::DecodeFormatKernels<KvFormat::kInt8>::launch(p, stream); break;
    case KvFormat::kInt4: detail::DecodeFormatKernels<KvFormat::kInt4>::launch(p, stream); break;
    case KvFormat::kInt4Fbgemm: detail::DecodeFormatKernels<KvFormat::kInt4Fbgemm>::launch(p, stream); break;
    case KvFormat::kFp8E4m3:
    case KvFormat::kFp8E5m2:
    case KvFormat::kInt5:
    case KvFormat::kLut4: break;  // rejected above
  }
  KVQ_CHECK_LAUNCH();
  if (!merged) {
    DecodeParams merge = p;
    merge.splits = splits;
    const int threads = std::max(32, std::min(p.head_dim, 128));  // whole warps: the LSE max is a shuffle
    detail::merge_splits_kernel<<<static_cast<unsigned>(p.batch * p.q_heads), threads,
                                  2 * static_cast<size_t>(detail::merge_smem_floats(splits)) * sizeof(float),
                                  stream>>>(merge);
    KVQ_CHECK_LAUNCH();
  }
}

}  // namespace kvq
