// GPU decode attention (Tq = 1) over a K/V cache stored raw (bf16 / fp16) or quantized (int8 /
// int4 planar, int4 FBGEMM rows, FP8), dequantized inside the kernel.
// One kernel template covers every format; split-K partials merge by LSE in a second kernel.
// DESIGN.md "Attention" is the definition; reference/attention.hpp is the fp64 truth.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "quant/block_formats.hpp"
#include "quant/host_device.hpp"
#include "quant/scheme.hpp"

namespace kvq {

// How one of K or V is stored. The CUDA-core kernels need K and V in one format (and read no FP8);
// the tensor-core kernels read each operand in its own. The block formats (quant/block_formats.hpp)
// read as: q8_0 int8, q4_0 / q4_1 int4, q5_0 / q5_1 kInt5 (planar nibbles, then the fifth bits),
// iq4_nl / mxfp4 / nvfp4 kLut4 (nibbles indexing a 16-entry int8 table).
enum class KvFormat { kBf16, kFp16, kInt8, kInt4, kInt4Fbgemm, kFp8E4m3, kFp8E5m2, kInt5, kLut4 };
const char* to_string(KvFormat f);
bool is_quantized(KvFormat f);
// The format that stores codes of `s` (planar, or FBGEMM rows).
KvFormat quantized_format(const Scheme& s, bool fbgemm_rows);
// One operand of a storage as tools spell it: "bf16" or "fp16" (raw: no scheme) or a scheme name
// (throws SchemeError for a bad one); `format` receives its KvFormat.
std::optional<Scheme> parse_storage_operand(const std::string& name, bool fbgemm_rows, KvFormat& format);

// The kernel family: CUDA-core FMAs (decode_kernel.cuh, every storage and D = 8) or tensor-core MMAs
// (decode_tc_kernel.cuh: QK and PV as mma.sync m16n8k16, 16 keys x 8 query heads per tile).
enum class DecodeFamily { kCudaCore, kTensorCore };

// Where one chunk's scale (and zero point) lives.
// kChannel: chan-tN, one (scale, zero) per (b, h, t / N, d); K only, tensor cores only.
enum class ParamMode : int { kNone, kTensor, kToken, kHead, kGroup, kInlineRow, kChannel };

// kLut4's 16-entry table: iq4_nl's values, or e2m1's doubled (mxfp4, nvfp4: the scale carries the 1/2);
// the codec's own (quant/block_formats.hpp iq4nl_value, e2m1_doubled).
enum class LutTable : uint8_t { kNone, kIq4Nl, kE2m1Doubled };
// Word w of table t as the kernels' byte permutes read it: entries 4w .. 4w+3 as int8, the first lowest.
KVQ_HD constexpr uint32_t lut_word(LutTable t, int w) {
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const int value = t == LutTable::kIq4Nl ? iq4nl_value(4 * w + i) : e2m1_doubled(4 * w + i);
    r |= static_cast<uint32_t>(static_cast<uint8_t>(value)) << (8 * i);
  }
  return r;
}

// One of K or V on the device. Row (b, h, t) starts at data + b*stride_b + h*stride_h + t*stride_t
// (bytes), so BNSH, BSNH and FBGEMM's [B, T, H] rows are all strides. In a paged cache
// (DecodeParams::block_table) it starts at data + page*stride_page + h*stride_h + (t % P)*stride_t,
// page = table[b][t / P] (stride_b unused): vLLM's and FlashInfer's NHD pages, HND pages, K and V
// pages interleaved in one pool are all strides too; per-row parameters (token, head and group
// modes) follow their codes' pages (param_stride_page, param_stride_h below).
struct KvOperand {
  const uint8_t* data = nullptr;
  int64_t stride_b = 0, stride_h = 0, stride_t = 0;  // bytes
  const void* scales = nullptr;  // planar params in group order (quant/groups.hpp)
  const void* zeros = nullptr;   // asymmetric only
  ParamMode mode = ParamMode::kNone;
  bool asymmetric = false;
  ScaleDtype scale_dtype = ScaleDtype::kFp16;  // fp16 / fp32; the block formats' e8m0 (mxfp4) or e4m3 (nvfp4)
  // Block formats (in what was padding: the launch's parameters stay small). q4_0 / q5_0: unsigned
  // codes u of value (u + code_offset) * scale, no zero points stored (-8, -16).
  int8_t code_offset = 0;
  LutTable lut = LutTable::kNone;
  int group = 0;             // elements per group along D (kGroup, kInlineRow); tokens per group (kChannel)
  int inline_bytes = 0;      // kInlineRow: 4 x groups per row, before the codes
  bool hadamard = false;     // +had: stored in the rotated basis (K: the kernel rotates Q alike)
  int hadamard_block = 0;    // +had<N>: rotated in blocks of N elements along D (0: the whole row)
  const float* tensor_scale = nullptr;  // nvfp4: the fp32 s_t on the device
  // (last: the kernels' code for contiguous caches keeps its parameter offsets)
  int64_t stride_page = 0;  // bytes; paged caches only
  // Paged caches: parameter (b, h, t, group) is element page*param_stride_page + h*param_stride_h +
  // (t % P)*groups + group of scales (and zeros): a head's parameters of one page lie together.
  int64_t param_stride_page = 0, param_stride_h = 0;
  KVQ_HD bool fp32_params() const { return scale_dtype == ScaleDtype::kFp32; }
  KVQ_HD int param_bytes() const {
    return scale_dtype == ScaleDtype::kFp32 ? 4 : scale_dtype == ScaleDtype::kFp16 ? 2 : 1;
  }
  // A term added per group beside the scaled product: stored zero points or the code offset.
  KVQ_HD bool has_zero() const { return asymmetric || code_offset != 0; }
  // Codes read as two's complement (int8 / int4 symmetric; kLut4's table values are signed too).
  KVQ_HD bool signed_codes() const { return !asymmetric && code_offset == 0; }
};

// +wW: the last tokens of each sequence kept in the input precision. Tokens t >= window_start of
// an operand are read from `raw` (bf16 / fp16, laid out as raw_operand) instead of its codes.
struct KvWindow {
  int64_t tokens = -1;  // W; -1: no window
  int round_to = 1;     // the quantized prefix is a multiple of this many tokens (chan-tN: N)
  KvFormat format = KvFormat::kBf16;
  KvOperand raw;
  KVQ_HD bool present() const { return tokens >= 0; }
};
// The first token of a sequence of `len` tokens that `w` keeps raw (quant/groups.hpp quantized_length).
KVQ_HD int64_t window_start(const KvWindow& w, int64_t len) {
  if (!w.present()) return len;
  int64_t lq = len - w.tokens > 0 ? len - w.tokens : 0;
  return lq - lq % w.round_to;
}

// With windows the keys of a sequence fall into regions by which operands are still quantized;
// each region is one launch over [lo, hi) (decode_regions), its partials merged with the others'.
enum class KeyRegion : int { kAll, kBothQuantized, kKRaw, kVRaw, kBothRaw };
// [lo, hi) of region r for a sequence of `len` tokens; empty regions have lo >= hi.
KVQ_HD void key_region_bounds(KeyRegion r, const KvWindow& kw, const KvWindow& vw, int64_t len, int64_t& lo,
                              int64_t& hi) {
  const int64_t k = window_start(kw, len), v = window_start(vw, len);
  const int64_t first = k < v ? k : v, last = k < v ? v : k;
  switch (r) {
    case KeyRegion::kAll: lo = 0, hi = len; return;
    case KeyRegion::kBothQuantized: lo = 0, hi = first; return;
    case KeyRegion::kKRaw: lo = k, hi = v; return;  // K raw from k, V still quantized until v
    case KeyRegion::kVRaw: lo = v, hi = k; return;
    case KeyRegion::kBothRaw: lo = last, hi = len; return;
  }
}

inline constexpr int kMaxSplits = 128;
inline constexpr int kDecodeChunk = 8;  // elements of one row a lane dequantizes at once

// Where a split decode's partials merge (tensor cores, one key region). kAuto: in a CTA cluster where
// the clusters fit, else in the last split where that measured faster than the merge kernel, else the
// merge kernel. The others force one way (the gate checks that all give the same bits; A/Bs); the
// last split copies partial_o 16 bytes at a time, so a less aligned buffer gets the merge kernel.
enum class SplitMerge { kAuto, kMergeKernel, kLastSplit };

// The tensor-core kernels beside the standard ones, each for a kind of grid (plan_decode picks; the
// gate runs a case with every one its pair has). kLongSteps: bf16 or fp16 K and V, 32-key steps in two
// stages instead of 16-key steps in three (half the steps, fewer CTAs an SM), where a split's CTAs fit
// on the SMs, which then run one CTA each. kFourCtas: int4 K and V, one scale group per row, D = 128,
// registers for four CTAs an SM instead of three (more instructions a key), where the grid fills the
// SMs with long splits.
enum class TcConfig : uint8_t { kStandard, kLongSteps, kFourCtas };

const char* to_string(TcConfig c);

struct DecodeParams {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, tokens = 0;  // B, Hq, Hkv, T (cache capacity)
  int head_dim = 0;                                         // D in {8, 64, 128, 256}
  KvFormat k_format = KvFormat::kBf16, v_format = KvFormat::kBf16;
  DecodeFamily family = DecodeFamily::kCudaCore;
  KvOperand k, v;
  const uint16_t* q = nullptr;        // bf16 [B, Hq, D]
  const int32_t* seq_lens = nullptr;  // [B] in [0, T]; nullptr: all T
  const float* alibi_slopes = nullptr;  // [Hq]; nullptr: no ALiBi
  float softmax_scale = 0.0f;
  uint16_t* out = nullptr;  // bf16 [B, Hq, D]
  float* lse = nullptr;     // [B, Hq], natural log; -inf for an empty key set
  // Launch shape: filled by plan_decode() unless forced.
  KvWindow k_window, v_window;  // +wW (tensor-core family only)
  KeyRegion region = KeyRegion::kAll;  // set per launch by decode_regions
  int split_base = 0;                  // the region's first partial slot
  int region_count = 1;                // launches of this decode: with one and one split, O is written directly
  int splits = 0;         // key splits per (b, KV head); 1 = single pass
  // The splits of each (b, KV head) run as one CTA cluster and merge through distributed shared
  // memory, without the merge kernel (launch_decode sets it for small grids on sm_90).
  bool cluster_merge = false;
  // Tensor cores: the kernels' configuration, set by plan_decode. A pair without kernels of it
  // (tc_configs) runs the standard ones.
  TcConfig tc_config = TcConfig::kStandard;
  // Set by plan_decode where window_tail_fits and it pays: the +wW windows' raw keys are read by the
  // quantized region's last split after its own, in one launch (no window region, no merge kernel).
  bool window_tail = false;
  int heads_per_cta = 0;  // query heads sharing one CTA's K/V reads: 1, 2, 4 or 8
  float* partial_o = nullptr;    // [splits, B, Hq, D] when splits > 1
  float* partial_lse = nullptr;  // [splits, B, Hq]
  // Tensor cores, one key region: the last split of each (b, KV head, head block) to finish merges the
  // splits (a counter each, zero before and after the launch), so no merge kernel runs. launch_decode
  // sets it from a set of counters per (device, stream) where split_merge asks for it.
  unsigned* split_counters = nullptr;
  SplitMerge split_merge = SplitMerge::kAuto;
  // A paged cache (tensor-core family): sequence b's tokens [i*P, (i+1)*P) lie in page
  // block_table[b * table_stride + i]; P = page_tokens, a power of two >= 16. T is the longest
  // sequence the table can hold (table_stride >= ceil(T / P)). nullptr: contiguous K and V.
  // (Last: the contiguous kernels' parameter offsets stay as they were.)
  const int32_t* block_table = nullptr;
  int64_t table_stride = 0;
  int page_tokens = 0;
  // Paged +wW windows: the windows' raw tokens (k_window.raw, v_window.raw: paged_operand's layout)
  // lie in pages of this table (the same stride), so that only the window's pages need be held in
  // full precision; entries of pages with no window token are not read.
  const int32_t* window_block_table = nullptr;
  // Set per launch by decode_regions: V's table where it is not block_table (a region that reads one
  // operand from its window's pages and the other from the cache's).
  const int32_t* v_block_table = nullptr;
};

// The operand of a quantized tensor in the layouts gpu/quantize.hpp writes: planar codes BNSH
// [B, H, T, D*bits/8] with params in group order, or FBGEMM rows [B, T, H, D/2 + 4n].
// Throws SchemeError for schemes the decode kernels do not read (groups not a multiple of 8
// elements). Scale-free FP8 has mode kNone (scale 1); chan-tN kChannel (tensor-core K only).
// nvfp4 needs `tensor_scale`, the device's fp32 s_t (kvq's GPU quantizer writes it beside the scales).
KvOperand quantized_operand(const Scheme& s, int64_t batch, int64_t heads, int64_t tokens, int head_dim,
                            bool fbgemm_rows, const uint8_t* codes, const void* scales, const void* zeros,
                            const float* tensor_scale = nullptr);
// The window of a +wW scheme over `raw` (bf16 / fp16 values of every token, as raw_operand lays
// them out; only the window's tokens are read); no window for other schemes.
KvWindow scheme_window(const Scheme& s, const KvOperand& raw, KvFormat raw_format);
// Raw bf16/fp16 K or V, BNSH or BSNH.
KvOperand raw_operand(const void* data, int64_t heads, int64_t tokens, int head_dim, bool bsnh);
// `op` (from quantized_operand or raw_operand) as a paged cache in kvq's paged layout: codes
// [pages, P, H, row] (NHD), per-row parameters [pages, H, P, groups] (kToken: [pages, P]; chan-tN:
// [pages, H, P / N, D]); data,
// scales and zeros point at page 0. The decode's DecodeParams carries the block table.
KvOperand paged_operand(KvOperand op, int64_t heads, int page_tokens, int head_dim, int64_t row_bytes);
// Why `p`'s paging cannot be read (P not a power of two >= 16, windows without their pages' table, a
// raw operand beside the other's window, chan-tN groups that pages cut, parameter spans
// not word-aligned, pages of 2^31 bytes), or "" (also for a contiguous cache). A table too short
// for T is malformed input: check_decode_params throws for it.
std::string paged_unsupported_reason(const DecodeParams& p);
// D = 8 (small test models such as the bundled one), 64, 128, 256.
bool decode_head_dim_supported(int head_dim);
// Why `s` cannot be read by a decode kernel, or "" when it can.
std::string decode_unsupported_reason(const Scheme& s, int head_dim, bool fbgemm_rows);

// Why the CUDA-core family cannot run `p` (head_dim, K and V in different formats, FP8), or "".
std::string cuda_core_unsupported_reason(const DecodeParams& p);
// Why the tensor-core family cannot run `p` (head_dim, scale groups, alignment), or "" when it can.
std::string tensor_core_unsupported_reason(const DecodeParams& p);

// The precision-mimic profile (reference/attention.hpp) that describes the arithmetic of the
// kernel `p` runs: the gate derives its tolerance from it.
const char* decode_precision_profile(const DecodeParams& p);

// The configurations (DecodeParams::tc_config) of which p's tensor-core kernels exist in this build,
// kStandard first: kLongSteps for bf16 or fp16 K and V in one format at D = 64 or 128, kFourCtas for
// int4 K and V with one scale group per row at D = 128.
std::vector<TcConfig> tc_configs(const DecodeParams& p);

// Chooses heads_per_cta (the power of two >= Hq/Hkv, at most `max_heads_per_cta`; 8 for tensor
// cores) and, when p.splits == 0, the split count: CUDA-core, enough CTAs for `waves` full waves of
// the device, each split at least 256 keys; tensor cores, tensor_core_splits, and tc_config. Returns
// p with them set.
DecodeParams plan_decode(DecodeParams p, int sm_count, int max_heads_per_cta = 8, double waves = 2.0);

// Key splits of a tensor-core launch with `base_ctas` CTAs per split on a device of `sm_count` SMs
// holding `resident_ctas` at once: the fewest (each at least 128 keys) whose last wave is >= 85%
// full; for tiny grids (<= 16 CTAs per split) whose splits stay <= 1024 keys, one CTA per SM. The
// kernel gives each split a multiple of `round` keys (default 1): counts are those that leave no
// split empty, and waves are counted with them. `raw_operands` (how many of K and V are bf16 / fp16):
// with one or two, where one split's CTAs fit on the SMs, one wave of one CTA an SM instead; with two,
// where they exceed the SMs, one split.
int tensor_core_splits(int64_t base_ctas, int64_t resident_ctas, int64_t tokens, int64_t sm_count, int64_t round = 1,
                       int raw_operands = 0);

// The splits that hold keys when `tokens` keys are cut into `splits` splits of a multiple of `round`.
int nonempty_splits(int64_t tokens, int64_t splits, int64_t round);

// The launches of a planned `p`: one (region kAll) without windows; with windows one per region an
// operand pair can have (no K-only / V-only region where both windows start alike in every
// sequence), p.splits divided over them by their expected share of the keys (at least one each),
// partial slots consecutive. Their splits sum to total_splits(p). With p.window_tail (and
// window_tail_fits(p)), one launch of the quantized region with all of p.splits.
std::vector<DecodeParams> decode_regions(const DecodeParams& p);
// Whether p's +wW windows are read at the end of its quantized region's last split (one launch): the
// tensor-core family, a contiguous cache, K and V quantized (chan-tN K aside) with windows of the same
// length and rounding, both bf16. Other windowed decodes run a launch per region, and so do these
// where plan_decode finds the tail slower (a one-stage tail over few splits in a grid of waves).
bool window_tail_fits(const DecodeParams& p);
int total_splits(const DecodeParams& p);

// Floats of partial_o and partial_lse needed for p's launches.
int64_t partial_o_floats(const DecodeParams& p);
int64_t partial_lse_floats(const DecodeParams& p);

// Throws InputError for a malformed problem (dims, D, Hq % Hkv, missing buffers).
void check_decode_params(const DecodeParams& p);

namespace detail {
// nvfp4 V: blocks of 16, which split an m-tile pair (the tensor-core kernel's scales multiply its V
// fragments instead; TcGroupShape::kVBlocks16).
inline bool tc_v_blocks16(const DecodeParams& p) {
  return p.v_format == KvFormat::kLut4 && p.v.scale_dtype == ScaleDtype::kE4M3 && p.v.group == 16;
}
}  // namespace detail

// Enqueues the decode kernel (and the split merge when splits > 1). p must be planned.
void launch_decode(const DecodeParams& p, cudaStream_t stream);

// Bytes the kernel must read and write: K/V codes and params of the live tokens, Q, O and LSE.
int64_t decode_bytes_moved(const DecodeParams& p, const Scheme* k_scheme, const Scheme* v_scheme,
                           const int32_t* host_seq_lens);

}  // namespace kvq
