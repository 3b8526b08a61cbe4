// Host side of the decode kernels: operands for each storage, the launch plan (heads per CTA,
// split count), the split-K merge kernel and the dispatch to the per-format instantiations.
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
#include "quant/fbgemm_layout.hpp"
#include "quant/groups.hpp"

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

bool decode_head_dim_supported(int head_dim) {
  return head_dim == 8 || head_dim == 64 || head_dim == 128 || head_dim == 256;
}

const char* to_string(KvFormat f) {
  switch (f) {
    case KvFormat::kBf16: return "bf16";
    case KvFormat::kFp16: return "fp16";
    case KvFormat::kInt8: return "int8";
    case KvFormat::kInt4: return "int4";
    case KvFormat::kInt4Fbgemm: return "int4-fbgemm";
    case KvFormat::kFp8E4m3: return "fp8-e4m3";
    case KvFormat::kFp8E5m2: return "fp8-e5m2";
    case KvFormat::kInt5: return "int5";
    case KvFormat::kLut4: return "lut4";
  }
  return "?";
}

const char* to_string(TcConfig c) {
  switch (c) {
    case TcConfig::kStandard: return "standard";
    case TcConfig::kLongSteps: return "long-step";
    case TcConfig::kFourCtas: return "four-CTA";
  }
  return "?";
}

bool is_quantized(KvFormat f) { return f != KvFormat::kBf16 && f != KvFormat::kFp16; }

KvFormat quantized_format(const Scheme& s, bool fbgemm_rows) {
  if (s.fp8()) return s.format == CodeFormat::kFp8E4M3 ? KvFormat::kFp8E4m3 : KvFormat::kFp8E5m2;
  switch (s.format) {  // the block formats: codes as ggml stores them, planar
    case CodeFormat::kQ5_0:
    case CodeFormat::kQ5_1: return KvFormat::kInt5;
    case CodeFormat::kIq4Nl:
    case CodeFormat::kMxfp4:
    case CodeFormat::kNvfp4: return KvFormat::kLut4;
    default: break;  // q8_0 int8, q4_0 / q4_1 int4
  }
  if (s.bits == 8) return KvFormat::kInt8;
  return fbgemm_rows ? KvFormat::kInt4Fbgemm : KvFormat::kInt4;
}

std::string cuda_core_unsupported_reason(const DecodeParams& p) {
  if (!decode_head_dim_supported(p.head_dim)) return fmt::format("head_dim {}", p.head_dim);
  if (p.k_format != p.v_format)
    return fmt::format("K {} / V {}: CUDA-core kernels read K and V in one format (decode-tc reads mixed pairs)",
                       to_string(p.k_format), to_string(p.v_format));
  if (p.k_format == KvFormat::kFp8E4m3 || p.k_format == KvFormat::kFp8E5m2)
    return fmt::format("{}: CUDA-core kernels read no FP8 (decode-tc does)", to_string(p.k_format));
  // K and V are in one format here; q4_0 (a code offset) shares int4's
  if (p.k_format == KvFormat::kInt5 || p.k_format == KvFormat::kLut4 || p.k.code_offset != 0 || p.v.code_offset != 0)
    return "q4_0, q5_0, q5_1, iq4_nl, mxfp4, nvfp4: CUDA-core kernels read no block format but q8_0 and q4_1 (decode-tc reads them all)";
  if (p.k_window.present() || p.v_window.present())
    return "full-precision windows (+wW): CUDA-core kernels read one storage per operand (decode-tc reads windows)";
  if (p.k.mode == ParamMode::kChannel || p.v.mode == ParamMode::kChannel)
    return "chan-tN: per-channel groups change along the keys; CUDA-core kernels do not read them (decode-tc reads K)";
  if (p.k.hadamard || p.v.hadamard) return "+had: CUDA-core kernels rotate neither Q nor O (decode-tc does)";
  if (p.block_table) return "paged caches: CUDA-core kernels read contiguous caches (decode-tc reads pages)";
  return "";
}

std::string decode_unsupported_reason(const Scheme& s, int head_dim, bool fbgemm_rows) {
  if (s.block_format() && fbgemm_rows)
    return fmt::format("{}: block formats are stored planar (or as ggml's blocks), not as FBGEMM rows", to_string(s));
  if (!decode_head_dim_supported(head_dim))
    return fmt::format("head_dim {} (decode kernels take 8, 64, 128 or 256)", head_dim);
  if (s.granularity == Granularity::kGroup && s.group % kDecodeChunk != 0)
    return fmt::format("{}: groups of {} elements (decode kernels need a multiple of {})", to_string(s), s.group,
                       kDecodeChunk);
  if (fbgemm_rows) {
    try {
      fbgemm_groups_per_row(s, head_dim);
    } catch (const SchemeError& e) {
      return e.what();
    }
  }
  return "";
}

std::string tensor_core_unsupported_reason(const DecodeParams& p) {
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256)
    return fmt::format("head_dim {}: tensor-core kernels take 64, 128 or 256 (the CUDA-core variants take 8)", p.head_dim);
  if (p.v.mode == ParamMode::kChannel)
    return "V chan-tN: tensor-core kernels read per-channel groups for K only";
  if (p.v.hadamard && p.v_window.present())
    return "V +had with a +wW window: tensor-core kernels do not read a rotated window";
  if (p.k.hadamard && p.k_window.present())
    return "K +had with a +wW window: tensor-core kernels do not read a rotated window";
  if (p.k.mode == ParamMode::kChannel) {
    const bool pair = (p.k_format == KvFormat::kInt8 || p.k_format == KvFormat::kInt4) &&
                      (p.v_format == KvFormat::kInt8 || p.v_format == KvFormat::kInt4 || !is_quantized(p.v_format));
    if (!pair)
      return fmt::format("K chan-tN with V {}: tensor-core kernels read it with int8, int4 planar or raw V",
                         to_string(p.v_format));
    if (p.k.group % 32 != 0)
      return fmt::format("K chan-t{}: tensor-core kernels need token groups of a multiple of 32 (whole key steps)", p.k.group);
    if (p.k.fp32_params())
      return "K chan-tN with fp32 parameters: tensor-core kernels dequantize K with fp16 ones";
  } else if (is_quantized(p.k_format) && p.k.group % 16 != 0)
    return fmt::format("K scale groups of {} elements: tensor-core kernels need a multiple of 16 (whole k-slices)", p.k.group);
  if (is_quantized(p.v_format) && p.v.group % 32 != 0 && !detail::tc_v_blocks16(p))
    return fmt::format("V scale groups of {} elements: tensor-core kernels need a multiple of 32 (whole m-tile pairs)",
                       p.v.group);
  for (const auto& [name, op] : {std::pair{"K", &p.k}, std::pair{"V", &p.v}})
    if (op->scale_dtype == ScaleDtype::kE4M3 && !op->tensor_scale)
      return fmt::format("{} nvfp4: its per-tensor scale (an fp32 on the device) is missing", name);
  if (const std::string why = paged_unsupported_reason(p); !why.empty()) return why;
  for (const auto& [name, w] : {std::pair{"K", &p.k_window}, std::pair{"V", &p.v_window}})
    if (w->present() && (is_quantized(w->format) || w->round_to < 1))
      return fmt::format("{} window: expected raw bf16 / fp16 values and round_to >= 1, got {} / {}", name,
                         to_string(w->format), w->round_to);
  for (const auto& [name, op] : {std::pair{"K", &p.k}, std::pair{"V", &p.v}, std::pair{"K window", &p.k_window.raw},
                                 std::pair{"V window", &p.v_window.raw}}) {
    const bool aligned = reinterpret_cast<uintptr_t>(op->data) % 4 == 0 && op->stride_b % 4 == 0 &&
                         op->stride_h % 4 == 0 && op->stride_t % 4 == 0 &&
                         reinterpret_cast<uintptr_t>(op->scales) % 4 == 0 && reinterpret_cast<uintptr_t>(op->zeros) % 4 == 0;
    if (!aligned) return fmt::format("{} rows or parameters are not 4-byte aligned (tensor-core kernels copy words)", name);
  }
  return "";
}

const char* decode_precision_profile(const DecodeParams& p) {
  if (p.family == DecodeFamily::kCudaCore) return "fp32-obf16";  // fp32 throughout, O rounded to bf16
  // Q·K in bf16 (bf16 K: Q exact) or fp16 (Q scaled by 2^e and rounded); P·V in bf16 (bf16 V) or
  // fp16, P (P' = p s 2^Ev for quantized V) rounded to that type.
  // chan-tN K: dequantized to fp16 (kfp16), then multiplied as raw fp16 K.
  if (p.k.mode == ParamMode::kChannel) return "fp32-qfp16-kfp16-pfp16-obf16";
  const bool bf16_qk = p.k_format == KvFormat::kBf16, bf16_pv = p.v_format == KvFormat::kBf16;
  if (bf16_qk) return bf16_pv ? "fp32-pbf16-obf16" : "fp32-pfp16-obf16";
  return bf16_pv ? "fp32-qfp16-pbf16-obf16" : "fp32-qfp16-pfp16-obf16";
}

KvOperand quantized_operand(const Scheme& s, int64_t batch, int64_t heads, int64_t tokens, int head_dim,
                            bool fbgemm_rows, const uint8_t* codes, const void* scales, const void* zeros,
                            const float* tensor_scale) {
  const std::string why = decode_unsupported_reason(s, head_dim, fbgemm_rows);
  if (!why.empty()) throw SchemeError(why);
  KvOperand op;
  op.data = codes;
  op.asymmetric = s.asymmetric;
  op.scale_dtype = s.scale_dtype;
  op.hadamard = s.hadamard;
  op.hadamard_block = s.hadamard_block;
  op.group = s.granularity == Granularity::kGroup ? s.group : head_dim;
  if (s.scale_free) {  // FP8 without a scale: codes are the values
    op.stride_t = code_bytes_per_row(s, head_dim), op.stride_h = tokens * op.stride_t, op.stride_b = heads * op.stride_h;
    op.mode = ParamMode::kNone;
    return op;
  }
  if (fbgemm_rows) {
    const int64_t row = fbgemm_row_bytes(s, head_dim);
    op.mode = ParamMode::kInlineRow;
    op.inline_bytes = 4 * fbgemm_groups_per_row(s, head_dim);
    op.stride_t = heads * row, op.stride_h = row, op.stride_b = tokens * heads * row;
    return op;
  }
  const int64_t row = code_bytes_per_row(s, head_dim);
  op.stride_t = row, op.stride_h = tokens * row, op.stride_b = heads * tokens * row;
  op.scales = scales;
  op.zeros = zeros;
  // Block formats (quant/block_formats.hpp block_decode): the codec's values, as the kernels read them.
  if (s.format == CodeFormat::kQ4_0 || s.format == CodeFormat::kQ5_0)
    op.code_offset = static_cast<int8_t>(s.format == CodeFormat::kQ4_0 ? -8 : -16);
  if (s.format == CodeFormat::kIq4Nl) op.lut = LutTable::kIq4Nl;
  if (s.format == CodeFormat::kMxfp4 || s.format == CodeFormat::kNvfp4) op.lut = LutTable::kE2m1Doubled;
  op.tensor_scale = s.format == CodeFormat::kNvfp4 ? tensor_scale : nullptr;
  switch (s.granularity) {
    case Granularity::kTensor: op.mode = ParamMode::kTensor; break;
    case Granularity::kToken: op.mode = ParamMode::kToken; break;
    case Granularity::kHead: op.mode = ParamMode::kHead; break;
    case Granularity::kGroup: op.mode = ParamMode::kGroup; break;
    case Granularity::kChannel: op.mode = ParamMode::kChannel, op.group = s.group; break;
  }
  (void)batch;
  return op;
}

std::optional<Scheme> parse_storage_operand(const std::string& name, bool fbgemm_rows, KvFormat& format) {
  if (name == "bf16" || name == "fp16") {
    format = name == "bf16" ? KvFormat::kBf16 : KvFormat::kFp16;
    return std::nullopt;
  }
  const Scheme s = parse_scheme(name);
  format = quantized_format(s, fbgemm_rows);
  return s;
}

KvWindow scheme_window(const Scheme& s, const KvOperand& raw, KvFormat raw_format) {
  KvWindow w;
  if (!s.has_window()) return w;
  w.tokens = s.window;
  w.round_to = s.granularity == Granularity::kChannel ? s.group : 1;
  w.format = raw_format;
  w.raw = raw;
  w.raw.hadamard = s.hadamard;
  w.raw.hadamard_block = s.hadamard_block;
  return w;
}

KvOperand raw_operand(const void* data, int64_t heads, int64_t tokens, int head_dim, bool bsnh) {
  KvOperand op;
  op.data = static_cast<const uint8_t*>(data);
  const int64_t row = 2 * head_dim;
  if (bsnh) op.stride_t = heads * row, op.stride_h = row;
  else op.stride_t = row, op.stride_h = tokens * row;
  op.stride_b = heads * tokens * row;
  return op;
}

KvOperand paged_operand(KvOperand op, int64_t heads, int page_tokens, int head_dim, int64_t row_bytes) {
  op.stride_t = heads * row_bytes, op.stride_h = row_bytes, op.stride_b = 0;
  op.stride_page = page_tokens * op.stride_t;
  const int64_t groups = op.mode == ParamMode::kGroup ? head_dim / op.group : 1;
  switch (op.mode) {
    case ParamMode::kToken: op.param_stride_page = page_tokens, op.param_stride_h = 0; break;
    case ParamMode::kChannel:  // [pages, H, P / N, D]: a page's whole token groups (N divides P)
      op.param_stride_h = page_tokens / std::max(op.group, 1) * head_dim, op.param_stride_page = heads * op.param_stride_h;
      break;
    case ParamMode::kHead:
    case ParamMode::kGroup: op.param_stride_h = page_tokens * groups, op.param_stride_page = heads * op.param_stride_h; break;
    default: break;
  }
  return op;
}

std::string paged_unsupported_reason(const DecodeParams& p) {
  if (!p.block_table) return "";
  const int P = p.page_tokens;
  if (P < 16 || (P & (P - 1)) != 0)
    return fmt::format("pages of {} tokens: paged caches take a power of two >= 16 tokens per page", P);
  const bool windows = p.k_window.present() || p.v_window.present();
  if (windows && !p.window_block_table)
    return "paged caches with +wW windows: the windows' raw tokens need pages and a table of their own (window_block_table)";
  // A region reading one operand from its window's pages and the other from the cache's: the kernels
  // that carry two tables pair a raw operand with a quantized one.
  if ((p.k_window.present() && !p.v_window.present() && !is_quantized(p.v_format)) ||
      (p.v_window.present() && !p.k_window.present() && !is_quantized(p.k_format)))
    return "paged caches: a raw (bf16 / fp16) K or V beside a +wW window on the other operand is not read (give both "
           "windows or neither)";
  if (p.batch * p.table_stride >= (int64_t{1} << 31))  // the kernels index entries in 32 bits
    return fmt::format("block tables of 2^31 entries or more (B = {}, {} entries a sequence)", p.batch, p.table_stride);
  if (p.k.mode == ParamMode::kChannel && (p.k.group <= 0 || P % p.k.group != 0))
    return fmt::format("K chan-t{} in pages of {} tokens: a token group must lie in one page (N dividing P)", p.k.group, P);
  std::vector<std::pair<const char*, const KvOperand*>> operands = {{"K", &p.k}, {"V", &p.v}};
  if (p.k_window.present()) operands.push_back({"K window", &p.k_window.raw});
  if (p.v_window.present()) operands.push_back({"V window", &p.v_window.raw});
  for (const auto& [name, op] : operands) {
    const int64_t pb = op->param_bytes();
    const bool per_row = op->mode == ParamMode::kToken || op->mode == ParamMode::kHead || op->mode == ParamMode::kGroup ||
                         op->mode == ParamMode::kChannel;
    const auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 4 != 0; };
    if (op->stride_page % 4 != 0 || (per_row && ((op->param_stride_page * pb) % 4 != 0 || (op->param_stride_h * pb) % 4 != 0 ||
                                                 misaligned(op->scales) || misaligned(op->zeros))))
      return fmt::format("{} pages or their parameters are not 4-byte aligned (tensor-core kernels copy words)", name);
    constexpr int64_t kMax = int64_t{1} << 31;  // the kernels' page arithmetic is 32 x 32 -> 64 bits
    if (op->stride_page >= kMax || P * op->stride_t >= kMax || op->param_stride_page * pb >= kMax)
      return fmt::format("{}: pages of 2^31 bytes or more (stride {} bytes)", name, op->stride_page);
  }
  return "";
}

void check_decode_params(const DecodeParams& p) {
  if (p.batch < 0 || p.q_heads <= 0 || p.kv_heads <= 0 || p.tokens < 0)
    throw InputError(fmt::format("decode: B={} Hq={} Hkv={} T={}: need B >= 0, T >= 0, heads > 0", p.batch, p.q_heads,
                                 p.kv_heads, p.tokens));
  if (p.q_heads % p.kv_heads != 0)
    throw InputError(fmt::format("decode: Hq={} is not a multiple of Hkv={}", p.q_heads, p.kv_heads));
  if (!decode_head_dim_supported(p.head_dim))
    throw InputError(fmt::format("decode: head_dim {} (expected 8, 64, 128 or 256)", p.head_dim));
  if (p.heads_per_cta > p.head_dim / kDecodeChunk)
    throw InputError(fmt::format("decode: heads_per_cta {} exceeds the {} lanes of a head_dim {} row",
                                 p.heads_per_cta, p.head_dim / kDecodeChunk, p.head_dim));
  if (p.splits < 1 || p.splits > kMaxSplits)
    throw InputError(fmt::format("decode: {} splits (expected 1..{})", p.splits, kMaxSplits));
  if (p.heads_per_cta != 1 && p.heads_per_cta != 2 && p.heads_per_cta != 4 && p.heads_per_cta != 8)
    throw InputError(fmt::format("decode: heads_per_cta {} (expected 1, 2, 4 or 8)", p.heads_per_cta));
  if (p.batch > 0 && (!p.q || !p.out || !p.lse || (p.tokens > 0 && (!p.k.data || !p.v.data))))
    throw InputError("decode: Q, K, V, O and LSE buffers are required");
  for (const auto& [name, w] : {std::pair{"K", &p.k_window}, std::pair{"V", &p.v_window}})
    if (p.batch > 0 && p.tokens > 0 && w->present() && !w->raw.data)
      throw InputError(fmt::format("decode: the {} window (+w{}) needs its raw values", name, w->tokens));
  // An empty batch has no partials to hold (their sizes are 0), whatever the regions' splits.
  if (p.batch > 0 && total_splits(p) > 1 && (!p.partial_o || !p.partial_lse))
    throw InputError("decode: split-K needs partial buffers");
  if (p.block_table && (p.page_tokens <= 0 || p.table_stride < (p.tokens + p.page_tokens - 1) / std::max(p.page_tokens, 1)))
    throw InputError(fmt::format("decode: a block table needs page_tokens > 0 and >= ceil(T / P) entries per sequence "
                                 "(T = {}, P = {}, {} entries)", p.tokens, p.page_tokens, p.table_stride));
}

int nonempty_splits(int64_t tokens, int64_t splits, int64_t round) {
  if (tokens <= 0 || splits <= 1) return 1;
  round = std::max<int64_t>(round, 1);
  const int64_t per_split = ((tokens + splits - 1) / splits + round - 1) / round * round;
  return static_cast<int>((tokens + per_split - 1) / per_split);
}

int tensor_core_splits(int64_t base_ctas, int64_t resident_ctas, int64_t tokens, int64_t sm_count, int64_t round,
                       int raw_operands) {
  // Each split re-reads Q and pays a prologue and a merge: at least 128 keys (one step per warp)
  // per split. Among the counts allowed, the first whose last wave is at least 85% full; else the
  // fullest. Waves are counted with the splits that hold keys (H100, SmolLM2 B = 8 T = 8K int8:
  // 15 asked, 13 held keys, 0.79 of a wave; 16 fill it: 21.0 -> 20.1 us, int4-g32 22.5 -> 20.0).
  const int64_t most = std::clamp<int64_t>(tokens / 128, 1, kMaxSplits);
  // One CTA an SM (at least one split), as the kernel holds it: the count the two rules below may take.
  const bool grid = base_ctas > 0 && sm_count > 0;
  const int one_per_sm = grid ? nonempty_splits(tokens, std::clamp<int64_t>(sm_count / base_ctas, 1, most), round) : 1;
  // A raw bf16 / fp16 operand's CTA (3 stages of 16 keys: 1.5x a quantized CTA's bytes in flight)
  // keeps an SM's memory busy alone: where one split's CTAs fit on the SMs, one wave of one CTA an SM
  // (H100 sweeps, decode-split-counts/, this count against the resident slots': SmolLM2 B = 8 T = 8K
  // 5 splits 25.3 us / 15 27.6, T = 1K 4 10.6 / 8 11.4; llama8b B = 8 T = 1K 2 18.4 / 3 19.4, T = 8K
  // 2 95.7 / 4 99.5; seed000 B = 64 2 97.7 / 4 101.0; one loss, seed000 B = 32 4 58.8 / 8 55.3).
  if (raw_operands > 0 && grid && base_ctas <= sm_count) return one_per_sm;
  // bf16 / fp16 K and V whose split's CTAs exceed the SMs: one split. The CTAs already cover every SM,
  // and each added split only re-reads Q and adds partials to merge (H200 sweeps,
  // decode-four-ctas/split-counts/, bf16 one split against the fill rule's two: SmolLM2 B = 64 T = 1K
  // 17.6 / 18.4 us, T = 8K 94.8 / 96.1; llama8b B = 64 and seed000 B = 256 / 512 planned one already).
  // Quantized CTAs want the resident slots' warps there (int4-g32 seed000 B = 256: 1 split 204 us, 3 183).
  if (raw_operands == 2 && grid) return 1;
  int best = 1;
  double best_fill = 0;
  for (int64_t s = 1; s <= most && base_ctas > 0 && resident_ctas > 0; ++s) {
    const int n = nonempty_splits(tokens, s, round);
    const double waves = static_cast<double>(base_ctas * n) / static_cast<double>(resident_ctas);
    const double fill = waves / std::ceil(waves);  // useful fraction of the waves the grid occupies
    if (fill > best_fill + 1e-9) best_fill = fill, best = n;
    if (fill >= 0.85) break;
  }
  // A tiny grid (B = 1 or 2: at most 16 CTAs per split) whose splits stay short (<= 1024 keys) is a
  // latency chain, not a bandwidth problem: one CTA per SM beats filling every resident slot, whose
  // CTAs only slow each other (H100, llama8b B=1 T=8K: 16 splits 17.0 us vs 29 splits 19.3 us for
  // int8-head; at T=32K the resident slots win again for INT4).
  if (grid && base_ctas <= 16 && one_per_sm < best && tokens / one_per_sm <= 1024) best = one_per_sm;
  return best;
}

std::vector<TcConfig> tc_configs(const DecodeParams& p) {
  if (p.family != DecodeFamily::kTensorCore) return {TcConfig::kStandard};
  const detail::TcEntry e = detail::tc_entry_of(p);  // the kernels this build has (no CUDA call)
  std::vector<TcConfig> out = {TcConfig::kStandard};
  for (TcConfig c : {TcConfig::kLongSteps, TcConfig::kFourCtas})
    if (e.has_config && e.has_config(p, c)) out.push_back(c);
  return out;
}

namespace {
// The key splits of p's tensor-core launch (p.splits == 0) with `base` CTAs per split.
int tc_planned_splits(const DecodeParams& p, int64_t base, int sm_count) {
  // A windowed decode shares its splits among key regions of other lengths: counted as asked (one
  // read at the end of the last split is planned as its plain scheme).
  const bool windowed = (p.k_window.present() || p.v_window.present()) && !p.window_tail;
  const int round = windowed ? 1 : detail::tc_split_round(p);
  const int raw_operands = (is_quantized(p.k_format) ? 0 : 1) + (is_quantized(p.v_format) ? 0 : 1);
  int splits = tensor_core_splits(base, sm_count * detail::ctas_per_sm(p), p.tokens, sm_count, round, raw_operands);
  // Short splits are a latency chain, and merging them in clusters saves the merge kernel's launch
  // (~2.5 us at B = 1): where the count's clusters do not all fit at once, the largest count up to
  // it whose clusters do, if its splits stay within 512 keys (H100, llama8b B = 8 T = 1K: 2-3
  // splits in clusters instead of 4-6 merged by the kernel, 0.91-1.00x; with 1024-key splits at
  // T = 8K int4-g32 and int8 were up to 1.22x slower).
  if (!windowed && p.batch > 0 && splits > 1) {
    DecodeParams q = p;
    q.splits = splits;
    if (!detail::tc_cluster_merge_fits(q))
      for (q.splits = std::min(splits, detail::kMaxClusterSplits); q.splits >= 2 && p.tokens / q.splits <= 512; --q.splits)
        if (detail::tc_cluster_merge_fits(q)) {
          splits = q.splits;
          break;
        }
  }
  // The kernel rounds a split's keys up to whole rounds of steps: the count that leaves no split
  // empty (H100, SmolLM2 B = 1 T = 8K: 44 splits of 256 keys, 12 of them empty CTAs and partials).
  return nonempty_splits(p.tokens, splits, round);
}
// The tensor-core launch of p with `base` CTAs a split: configuration and (unless forced) splits.
DecodeParams plan_tensor_core(DecodeParams p, int64_t base, int sm_count) {
  // 16-bit K and V whose split's CTAs fit on the SMs (one CTA an SM, below): 32-key steps, half the
  // latency chains (H200, bf16 against 16-key steps: llama8b B = 1 T = 1K 0.94, SmolLM2 B = 1 / 8
  // T = 8K 0.89 / 0.86; where CTAs share SMs, llama8b B = 64 T = 1K 1.08 and SmolLM2 B = 64 1.06-1.36).
  const std::vector<TcConfig> configs = tc_configs(p);
  auto has = [&](TcConfig c) { return std::find(configs.begin(), configs.end(), c) != configs.end(); };
  p.tc_config = base <= sm_count && has(TcConfig::kLongSteps) ? TcConfig::kLongSteps : TcConfig::kStandard;
  const bool planned = p.splits == 0;
  if (planned) p.splits = tc_planned_splits(p, base, sm_count);
  // int4 K and V by the row at D = 128: four CTAs an SM where they share SMs over splits of at least
  // 512 keys; the 128-register cap costs instructions on every key, which short splits (latency
  // chains) and grids of one CTA an SM pay for nothing (H200, against three: seed000 B = 128-512
  // T = 8K 0.90-0.97, llama8b B = 64 T = 1K 0.79 at one split each; llama8b B = 8 T = 1K, 256-key
  // splits, 1.05).
  if (has(TcConfig::kFourCtas)) {
    DecodeParams four = p;
    four.tc_config = TcConfig::kFourCtas;
    if (planned) four.splits = tc_planned_splits(four, base, sm_count);
    if (four.tokens >= 512LL * four.splits && base * four.splits > sm_count) p = four;
  }
  return p;
}

// Whether reading the windows at the end of the last split beats their launch of their own and the
// merge kernel after it. A tail whose raw steps take one stage of the warps' rings (int4's, int5's) is
// two latency chains added to each last-split CTA: where the splits are few (a third of the CTAs or
// more carry it) and the grid runs in waves, each wave waits for it (H200, seed000 T = 8K, tail /
// regions: int4-g32-asym B = 128 / 256 / 512, 3 / 3 / 2 splits, 1.065 / 1.123 / 1.080; int4-head-asym
// B = 256, 2 splits, 1.080, B = 512, 1, 1.005). In one wave or over 4 splits or more it pays (SmolLM2
// B = 64, 2 splits: 0.74-0.76; 4-16 splits 0.69-0.99), and two stages (int8-head) everywhere (0.64-0.95).
bool window_tail_pays(const DecodeParams& p, int64_t base, int sm_count) {
  const detail::TcEntry e = detail::tc_entry_of(p);
  if (!e.window_tail_stages || e.window_tail_stages(p) >= 2 || p.splits > 3) return true;
  return base * p.splits <= static_cast<int64_t>(sm_count) * detail::ctas_per_sm(p);
}
}  // namespace

DecodeParams plan_decode(DecodeParams p, int sm_count, int max_heads_per_cta, double waves) {
  const int64_t group = p.q_heads / std::max<int64_t>(p.kv_heads, 1);
  int hpc = 1;  // a row's lanes reduce-scatter one head each: at most D/8 heads
  while (hpc < group && hpc < max_heads_per_cta && hpc < p.head_dim / kDecodeChunk) hpc *= 2;
  if (p.family == DecodeFamily::kTensorCore) hpc = 8;  // the MMA's N: padded heads cost nothing that matters
  p.heads_per_cta = hpc;
  const int64_t base = p.batch * p.kv_heads * ((group + hpc - 1) / hpc);  // CTAs per split
  if (p.family == DecodeFamily::kTensorCore) {
    // +wW windows on K and V: read at the end of the last split where that pays, planned as such
    p.window_tail = window_tail_fits(p);
    DecodeParams planned = plan_tensor_core(p, base, sm_count);
    if (planned.window_tail && !window_tail_pays(planned, base, sm_count)) {
      p.window_tail = false;
      planned = plan_tensor_core(p, base, sm_count);
    }
    p = planned;
  } else if (p.splits == 0) {
    const int per_sm = detail::ctas_per_sm(p);
    const double wanted = waves * sm_count * per_sm;
    int64_t splits = base > 0 ? static_cast<int64_t>(std::ceil(wanted / static_cast<double>(base))) : 1;
    splits = std::min<int64_t>(splits, std::max<int64_t>(1, p.tokens / 256));
    p.splits = static_cast<int>(std::clamp<int64_t>(splits, 1, kMaxSplits));
  }
  return p;
}

bool window_tail_fits(const DecodeParams& p) {
  const KvWindow &kw = p.k_window, &vw = p.v_window;
  return p.family == DecodeFamily::kTensorCore && !p.block_table && kw.present() && vw.present() &&
         kw.tokens == vw.tokens && kw.round_to == vw.round_to && kw.format == KvFormat::kBf16 &&
         vw.format == KvFormat::kBf16 && is_quantized(p.k_format) &&
         is_quantized(p.v_format) && p.k.mode != ParamMode::kChannel && !p.k.hadamard && !p.v.hadamard;
}

std::vector<DecodeParams> decode_regions(const DecodeParams& p) {
  DecodeParams all = p;
  all.region = KeyRegion::kAll, all.split_base = 0;
  if (!p.k_window.present() && !p.v_window.present()) return {all};
  if (p.window_tail && window_tail_fits(p)) {
    DecodeParams one = p;
    one.region = KeyRegion::kBothQuantized, one.split_base = 0, one.region_count = 1, one.window_tail = true;
    return {one};
  }
  std::vector<KeyRegion> regions = {KeyRegion::kBothQuantized};
  // Windows of the same length and rounding start at the same key in every sequence: no key has one
  // operand raw and the other quantized, whatever the lengths on the device (`+wW` on K and V alike).
  const bool same_windows = p.k_window.present() && p.v_window.present() && p.k_window.tokens == p.v_window.tokens &&
                            p.k_window.round_to == p.v_window.round_to;
  if (p.k_window.present() && !same_windows) regions.push_back(KeyRegion::kKRaw);
  if (p.v_window.present() && !same_windows) regions.push_back(KeyRegion::kVRaw);
  if (p.k_window.present() && p.v_window.present()) regions.push_back(KeyRegion::kBothRaw);
  std::vector<DecodeParams> out;
  int base = 0;
  for (KeyRegion r : regions) {
    int64_t lo = 0, hi = 0;  // the region's keys in a full-length sequence: its share of the splits
    key_region_bounds(r, p.k_window, p.v_window, p.tokens, lo, hi);
    // Every sequence T tokens long: a region empty at T is empty everywhere (one launch is kept).
    if (!p.seq_lens && hi <= lo && !(r == regions.back() && out.empty())) continue;
    DecodeParams q = p;
    q.region = r, q.split_base = base;
    const bool k_raw = r == KeyRegion::kKRaw || r == KeyRegion::kBothRaw, v_raw = r == KeyRegion::kVRaw || r == KeyRegion::kBothRaw;
    if (k_raw) q.k = p.k_window.raw, q.k_format = p.k_window.format;
    if (v_raw) q.v = p.v_window.raw, q.v_format = p.v_window.format;
    if (p.block_table) {  // each operand through its pages' table
      const int32_t* k_table = k_raw ? p.window_block_table : p.block_table;
      const int32_t* v_table = v_raw ? p.window_block_table : p.block_table;
      q.block_table = k_table, q.v_block_table = v_table != k_table ? v_table : nullptr;
    }
    const double share = p.tokens > 0 ? static_cast<double>(std::max<int64_t>(hi - lo, 0)) / static_cast<double>(p.tokens) : 0;
    q.splits = std::max(1, static_cast<int>(std::lround(share * p.splits)));
    base += q.splits;
    out.push_back(q);
  }
  for (DecodeParams& q : out) q.region_count = static_cast<int>(out.size());
  return out;
}

int total_splits(const DecodeParams& p) {
  int total = 0;
  for (const DecodeParams& r : decode_regions(p)) total += r.splits;
  return total;
}

int64_t partial_o_floats(const DecodeParams& p) {
  const int64_t n = total_splits(p);
  return n > 1 ? n * p.batch * p.q_heads * p.head_dim : 0;
}
int64_t partial_lse_floats(const DecodeParams& p) {
  const int64_t n = total_splits(p);
  return n > 1 ? n * p.batch * p.q_heads : 0;
}

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

int64_t decode_bytes_moved(const DecodeParams& p, const Scheme* k_scheme, const Scheme* v_scheme,
                           const int32_t* host_seq_lens) {
  int64_t live = 0;
  for (int64_t b = 0; b < p.batch; ++b) live += host_seq_lens ? host_seq_lens[b] : p.tokens;
  auto quantized_live = [&](const Scheme* s) {  // +wW: the tokens read as codes, the rest raw
    int64_t n = 0;
    for (int64_t b = 0; b < p.batch; ++b) n += quantized_length(*s, host_seq_lens ? host_seq_lens[b] : p.tokens, p.tokens);
    return std::min(n, live);
  };
  auto per_token_head = [&](const Scheme* s) -> double {  // bytes per (token, KV head)
    if (!s) return 2.0 * p.head_dim;
    const double param_bytes = s->param_bytes();
    double groups = 0;
    switch (s->granularity) {
      case Granularity::kTensor: groups = 0; break;
      case Granularity::kToken: groups = 1.0 / static_cast<double>(p.kv_heads); break;
      case Granularity::kHead: groups = 1; break;
      case Granularity::kGroup: groups = static_cast<double>(p.head_dim / s->group); break;
      case Granularity::kChannel: groups = 0; break;
    }
    return static_cast<double>(code_bytes_per_row(*s, p.head_dim)) + groups * param_bytes;
  };
  auto operand = [&](const Scheme* s) {
    if (!s || !s->has_window()) return static_cast<double>(live * p.kv_heads) * per_token_head(s);
    const int64_t q = quantized_live(s);
    return static_cast<double>(p.kv_heads) * (static_cast<double>(q) * per_token_head(s) +
                                              static_cast<double>(live - q) * per_token_head(nullptr));
  };
  const double kv = operand(k_scheme) + operand(v_scheme);
  const int64_t q_o = 2 * 2 * p.batch * p.q_heads * p.head_dim + 4 * p.batch * p.q_heads;
  return static_cast<int64_t>(kv) + q_o;
}

}  // namespace kvq
