// Tile math of the tensor-core decode kernels (decode_tc_kernel.cuh) and the PTX they are built from.
//
// A warp owns steps of kStepTokens keys and streams them through its own ring of kStages shared
// memory stages (cp.async), so warps never wait for each other until the final merge. A stage holds
// the step's K codes, V codes (rows padded so that fragment reads are free of bank conflicts) and
// the scales / zero points of its rows. Everything about the layout that depends on runtime values
// (how many scale groups a row has, fp16 or fp32 parameters) is in TcStageLayout, computed the same
// way on the host (dynamic shared memory size) and on the device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/decode.hpp"
#include "quant/float_formats.hpp"
#include "quant/host_device.hpp"

// Tuning knobs for experiments (experiments/bench/tune_decode_tc.sh builds the kernels with others);
// 0 keeps the default of TcTraits.
#ifndef KVQ_TC_STEP_TOKENS
#define KVQ_TC_STEP_TOKENS 0  // keys per warp step (a multiple of 16, at most 64)
#endif
#ifndef KVQ_TC_STAGES
#define KVQ_TC_STAGES 0  // shared-memory stages per warp ring
#endif
#ifndef KVQ_TC_MIN_CTAS
#define KVQ_TC_MIN_CTAS 0  // resident CTAs per SM to budget registers for
#endif

namespace kvq::detail {

// One operand's storage: bits per element, whether codes need scales, the MMA type it is read in.
template <KvFormat F>
struct TcOperand {
  static constexpr KvFormat kFormat = F;
  static constexpr bool kFp8 = F == KvFormat::kFp8E4m3 || F == KvFormat::kFp8E5m2;
  static constexpr int kBits = F == KvFormat::kInt8 || kFp8                                                    ? 8
                               : F == KvFormat::kInt4 || F == KvFormat::kInt4Fbgemm || F == KvFormat::kLut4 ? 4
                               : F == KvFormat::kInt5                                                         ? 5
                                                                                                              : 16;
  static constexpr bool kQuantized = kBits < 16;
  static constexpr bool kBf16Mma = F == KvFormat::kBf16;  // every other storage multiplies in fp16
};

// The storage the kernels are instantiated for: FBGEMM rows differ from planar int4 only in where
// the parameters are, which is a run-time property of the operand (TcSource).
constexpr KvFormat tc_codes(KvFormat f) { return f == KvFormat::kInt4Fbgemm ? KvFormat::kInt4 : f; }

// One operand's rows in a stage. Fragment reads take 8 rows at once (K: keys g, V: keys 2c, 2c + 1,
// 2c + 8, 2c + 9): padding each row (4 words, 8 for bf16 K) puts every read in 32 different banks.
// V's padding lies between pairs of rows (8 words after every second row: rows 2c and 2c + 1 land in
// the same banks, which no read takes together), so that every row starts on a 32-byte sector: a
// 16-byte copy into the second half of a shared sector made L2 serve its global sector twice (ncu,
// bf16 seed000 B = 128: 1.25x the L2 sectors of the bytes, cuDNN's kernel 1.00x).
// 5-bit rows (5D/32 words: 10, 20, 40) need none at D = 64 and 128, 4 words at 256.
// (An XOR swizzle of 8-bit rows instead saves the padding and fits a third int8 CTA per SM; measured
// slower on the H100: int8-head seed000 B=128 119 us vs 110 us.)
template <int kRowWords, int kPad, bool kPairs = false>
struct TcRows {
  static constexpr int kWords = kRowWords;
  static constexpr int kStride = kRowWords + kPad;  // words a row takes, on average
  static KVQ_HD int word(int row, int w) {
    return kPairs ? row * kRowWords + (row >> 1) * (2 * kPad) + w : row * kStride + w;
  }
  // word(row + rows, w) - word(row, w) for an even `rows` (any row count without pairs): a constant
  // the copies add as an immediate offset instead of computing each row's word.
  static constexpr KVQ_HD int even_rows_words(int rows) { return rows * kStride; }
};

constexpr int tc_row_pad(int bits, int row_words, bool k) {
  return bits == 16 && k ? 8 : bits == 5 ? (row_words % 8 == 0 ? 4 : 0) : 4;
}

// Whether (FK, FV, D) has kernels of configuration C (DecodeParams::tc_config): long steps for bf16 or
// fp16 K and V in one format (the pairs the gate covers) at D = 64 and 128; four CTAs an SM for int4 K
// and V at D = 128 (their per-row kernel alone: tc_config_has_shape).
template <KvFormat FK, KvFormat FV, int D, TcConfig C>
inline constexpr bool kTcHasConfig =
    C == TcConfig::kStandard ||
    (C == TcConfig::kLongSteps && FK == FV && TcOperand<FK>::kBits == 16 && (D == 64 || D == 128)) ||
    (C == TcConfig::kFourCtas && FK == KvFormat::kInt4 && FV == KvFormat::kInt4 && D == 128);

// C: the configuration (TcConfig). kLongSteps: 16-bit K and V in steps of 32 keys and two stages, for
// grids of at most one CTA an SM per split: half the steps, each a latency chain, where residency buys
// nothing. kFourCtas: registers for four CTAs an SM (128, where the kernel fits them without spilling).
template <KvFormat FK, KvFormat FV, int D, TcConfig C = TcConfig::kStandard>
struct TcTraits {
  using K = TcOperand<FK>;
  using V = TcOperand<FV>;
  static constexpr bool kQuantized = K::kQuantized && V::kQuantized;  // both: the quantized tiles below
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kHeads = 8;                // query heads per CTA: the MMA's N
  static constexpr int kSlices = D / 16;          // QK k-slices = PV m-tiles
  static constexpr int kKRowWords = D * K::kBits / 32;  // codes of one row
  static constexpr int kVRowWords = D * V::kBits / 32;
  using KRows = TcRows<kKRowWords, tc_row_pad(K::kBits, kKRowWords, true)>;
  using VRows = TcRows<kVRowWords, tc_row_pad(V::kBits, kVRowWords, false), kVRowWords % 8 == 0>;
  static constexpr int kKStride = KRows::kStride, kVStride = VRows::kStride;
  // Measured on the H100 (experiments/bench/tune_decode_tc.sh): 32 keys per step for int8 and int4 (16
  // when an operand is bf16, whose rows are 4x larger); a warp consumes a step far slower than
  // memory delivers the next, so two stages suffice for the quantized formats, and the shared
  // memory saved buys a third CTA per SM at 168 registers (fewer registers spill).
  static_assert(kTcHasConfig<FK, FV, D, C>, "a configuration this pair has no kernels of (kTcHasConfig)");
  static constexpr bool kLong = C == TcConfig::kLongSteps;
  static constexpr int kStepTokens = KVQ_TC_STEP_TOKENS > 0 ? KVQ_TC_STEP_TOKENS : kQuantized || kLong ? 32 : 16;
  static constexpr int kMTiles = kStepTokens / 16;
  // A split's keys are whole rounds of steps (every warp of a CTA gets the same number of steps).
  static constexpr int kSplitRound = kWarps * kStepTokens;
  static constexpr int kCodeWords = kStepTokens * (kKStride + kVStride);
  static constexpr int kStages = KVQ_TC_STAGES > 0 ? KVQ_TC_STAGES : kQuantized || kLong ? 2 : 3;
  // The register budget __launch_bounds__ asks for: CTAs per SM, 3 (168 registers) for the
  // quantized formats up to D = 128, 4 (128) for kFourCtas, else what shared memory allows (227 KB
  // less 1 KB per CTA, parameters not counted).
  static constexpr int kMinCtas = [] {
    if (KVQ_TC_MIN_CTAS > 0) return KVQ_TC_MIN_CTAS;
    if (C == TcConfig::kFourCtas) return 4;
    if (kQuantized && D <= 128) return 3;
    const int n = 232448 / (kWarps * kStages * kCodeWords * 4 + 3000 + 1024);
    return n < 1 ? 1 : n > 4 ? 4 : n;
  }();
};

// Stages of a +wW window tail's raw steps (16 bf16 keys, decode_tc_window_tail.cuh) that a warp's
// ring of the main loop, `ring_words` words at least, holds: two where it can, else one.
template <int D>
KVQ_HD constexpr int tc_window_tail_stages(int ring_words) {
  using Tw = TcTraits<KvFormat::kBf16, KvFormat::kBf16, D>;
  return ring_words >= 2 * Tw::kCodeWords ? 2 : 1;
}
// Words of one step's span of planar per-row parameters (+1: a span that starts mid-word).
KVQ_HD constexpr int tc_span_words(int step_tokens, int groups, int param_bytes) {
  return (step_tokens * groups * param_bytes + 3) / 4 + 1;
}

// Words of shared memory one operand's parameters take per stage.
KVQ_HD int tc_param_words(const KvOperand& op, int step_tokens, int head_dim) {
  if (op.mode == ParamMode::kChannel) {  // one token group per step: D scales (and D zero points)
    const int one = head_dim * op.param_bytes() / 4;
    return op.asymmetric ? 2 * one : one;
  }
  const int groups = op.group > 0 ? head_dim / op.group : 1;
  switch (op.mode) {
    case ParamMode::kNone:
    case ParamMode::kTensor: return 0;
    case ParamMode::kInlineRow: return step_tokens * groups;  // one (scale, shift) word per group
    default: break;
  }
  const int one = tc_span_words(step_tokens, groups, op.param_bytes());
  return op.asymmetric ? 2 * one : one;
}

// int4 K read a word a lane for two k-slices (the kernels whose K scale groups hold whole pairs of
// k-slices): lane c's word tc_int4_k_word of a key row holds elements e = 16 (j & ~1) + 8c + {0..7};
// the even k-slice takes e + {0, 4, 1, 5} (nibble pairs of bytes 0 and 2), the odd one, after a shift
// by a byte, e + {2, 6, 3, 7}, at k positions {2c, 2c + 1, 2c + 8, 2c + 9}. One load and one shift
// where two 16-bit loads and two byte permutes read the same codes.
KVQ_HD constexpr int tc_int4_k_word(int j, int c) { return 2 * (j & ~1) + c; }
// Where Q's element d goes in the prologue's array, whose slice j, lane c operands lie at 16j + 4c + k.
KVQ_HD constexpr int tc_int4_k_q_slot(int d) {
  const int e = d % 8, c = d % 32 / 8, odd_slice = (e >> 1) & 1;
  return 16 * (2 * (d / 32) + odd_slice) + 4 * c + ((e & 1) << 1 | e >> 2);
}

// int4 V likewise (the kernels whose V scale groups hold whole pairs of m-tile pairs): lane g's word
// tc_int4_v_word of a key row holds elements 32 (i & ~1) + 8g + {0..7}, bytes 0, 1 for m-tile pair i
// (i even), bytes 2, 3 for i + 1. Elements of m-tile j's row g (row g + 8: the next element),
// tc_v_row_element: where the kernel stores each accumulator of O.
KVQ_HD constexpr int tc_int4_v_word(int i, int g) { return 4 * (i & ~1) + g; }
KVQ_HD constexpr int tc_v_row_element(int j, int g, bool int4_words) {
  const int i = j / 2;
  return int4_words ? 32 * (i & ~1) + 8 * g + 4 * (i & 1) + 2 * (j % 2) : 32 * i + 4 * g + 2 * (j % 2);
}

// Where element d of head h's row of a warp's O goes in the warps' merge area: rows of D floats put
// every head of a store (lanes 4g + c: heads 2c + {0, 1}, elements tc_v_row_element) in one bank, 4
// ways, 8 with the int4 word reads' elements 8g apart; the head's c flips bits 0-1 and bit 5 of d bit
// 2, so that each store, and each read of 32 aligned elements of a row by the merge, takes 32 banks.
KVQ_HD constexpr int tc_w_o_slot(int h, int d) { return d ^ ((d >> 3) & 4) ^ ((h >> 1) & 3); }

struct TcStageLayout {
  int k_params = 0, v_params = 0;  // word offsets within a stage (the codes come first)
  int stage_words = 0;
};

template <KvFormat FK, KvFormat FV, int D, TcConfig C = TcConfig::kStandard>
KVQ_HD TcStageLayout tc_stage_layout(const DecodeParams& p) {
  using Tr = TcTraits<FK, FV, D, C>;
  TcStageLayout l;
  l.k_params = Tr::kCodeWords;
  l.v_params = l.k_params + tc_param_words(p.k, Tr::kStepTokens, D);
  l.stage_words = l.v_params + tc_param_words(p.v, Tr::kStepTokens, D);
  l.stage_words = (l.stage_words + 7) / 8 * 8;  // stages start on a 32-byte sector (TcRows)
  return l;
}

// Query heads of the CTA in shared memory before the main loop: Q as MMA operands (fp16 scaled by
// 2^e per head, or bf16), the per-head logit factor and ALiBi slope, and sum(q) per K scale group
// (the asymmetric zero point's term).
template <int D>
struct TcPrologue {
  uint16_t q[8][D];
  float factor[8], slope[8];
  float q_sum[D / 16][8];
  float pad[8];  // keeps the stages that follow 16-byte aligned
};

template <KvFormat FK, KvFormat FV, int D, TcConfig C = TcConfig::kStandard>
KVQ_HD int tc_smem_bytes(const DecodeParams& p) {
  using Tr = TcTraits<FK, FV, D, C>;
  return static_cast<int>(sizeof(TcPrologue<D>)) + Tr::kWarps * Tr::kStages * tc_stage_layout<FK, FV, D, C>(p).stage_words * 4;
}

// n / d for 0 <= n < 2^31 by a multiply-high, an add and a shift (Granlund-Montgomery), d fixed per
// launch and prepared on the host: a run-time division costs ~20 dependent instructions, and at small
// batches a CTA's whole life is a chain of them.
struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    while ((uint64_t{1} << s) < d) ++s;
    m = static_cast<uint32_t>((uint64_t{1} << 32) * ((uint64_t{1} << s) - d) / d + 1);
  }
  KVQ_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    return (__umulhi(n, m) + n) >> s;
#else
    return static_cast<uint32_t>(((static_cast<uint64_t>(n) * m >> 32) + n) >> s);
#endif
  }
};

// What one operand's copies and parameter reads need that is the same for every CTA of a launch.
struct TcOperandPlan {
  int groups = 1;        // scale groups per row (1 without per-group parameters)
  int group_shift = 0;   // K: log2(k-slices per group); V: log2(m-tile pairs per group)
  int inline_words = 0;  // FBGEMM rows: one (scale, shift) word per group before the codes
  int copy_words = 1;    // words per copy of rows that are not copied in 16-byte chunks per lane
  bool vec16 = false;    // 16-byte copies: rows without inline parameters, every row 16-byte aligned
  int param_words = 0;   // words of one step's span of scales (the zero points' as many)
  int param_row_bytes = 0;  // parameter bytes per key (kChannel: 0)
  int64_t param_bytes = 0;  // the whole scale (or zero) array
  int64_t params_per_head = 0;  // parameters of one (b, KV head): its first is (b * Hkv + h) times this
  uint32_t units_magic = 0;     // 2^24 / (copies per row) + 1: copy index -> row by a multiply
  // Paged caches: bytes from page 0's rows (parameters) to page id's are id times page_bytes
  // (param_page_bytes); token i of a page lies i times page_row_bytes after its first, its
  // parameters (i >> param_in_page_shift) times param_unit_bytes (chan-tN: whole token groups). Each
  // below 2^31 (paged_unsupported_reason): one 32 x 32 -> 64-bit multiply per page, 32-bit within it.
  int page_bytes = 0, page_row_bytes = 0, param_page_bytes = 0, param_unit_bytes = 0, param_in_page_shift = 0;
};

// A launch's uniform numbers, computed once on the host (tc_plan) instead of by every thread.
struct TcPlan {
  int k_params = 0, v_params = 0, stage_words = 0;  // the stage layout (tc_stage_layout)
  TcOperandPlan k, v;
  int group_size = 1;         // query heads per KV head
  int head_blocks = 1;        // blocks of 8 query heads per KV head
  int q_lanes_per_group = 1;  // lanes holding one K scale group of a Q row (the prologue's sums)
  FastDiv by_head_blocks, by_splits, by_kv_heads;
  int page_shift = 0;         // paged caches: log2(tokens per page)
  TcOperandPlan k_tail, v_tail;  // the +wW windows' raw K and V (DecodeParams::window_tail)
};

#if defined(__CUDACC__)
// The CTA's sequence b, KV head hk, split and block of query heads hb, from blockIdx.x = ((b * Hkv +
// hk) * splits + split) * head_blocks + hb, taken apart without dividing.
struct TcCta {
  int64_t b, hk, hb;
  int split;
};
__device__ __forceinline__ TcCta tc_cta(const DecodeParams& p, const TcPlan& plan) {
  const uint32_t cta = blockIdx.x, bh_split = plan.by_head_blocks.div(cta), bh = plan.by_splits.div(bh_split);
  const uint32_t b32 = plan.by_kv_heads.div(bh);
  return {b32, bh - b32 * static_cast<uint32_t>(p.kv_heads), cta - bh_split * static_cast<uint32_t>(plan.head_blocks),
          static_cast<int>(bh_split - bh * static_cast<uint32_t>(p.splits))};
}


// ---- PTX ------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Copies `bytes` (16, 8 or 4) or, when !valid, zero-fills them (src-size 0 reads nothing).
// L2::128B: L2 fetches the whole line. A paged cache's 64-byte head rows (D = 64 int8, NHD pages) share
// lines with the next head's, which another CTA reads soon after (paged SmolLM2 B = 64: 1.15 -> 1.02x).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 8 : 0));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
// Copies the first `src_bytes` (0..4) of a 4-byte word and zero-fills the rest.
__device__ __forceinline__ void cp_async4_partial(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// D (16x8 fp32) += A (16x16) * B (16x8); fp16 or bf16 operands.
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBf16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Transposes an 8x8 matrix of 16-bit values held as one register per lane (row lane/4, columns
// 2(lane%4), +1): the QK result (keys x heads) becomes the PV operand (heads x keys).
__device__ __forceinline__ uint32_t transpose_8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Two fp32 values rounded (RNE) into one register, `lo` in the low half.
template <bool kBf16>
__device__ __forceinline__ uint32_t pack_rounded(float lo, float hi) {
  uint32_t r;
  if constexpr (kBf16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Bits of x where mask is set, xor c; c elsewhere (LOP3 table 0x6a: mask ? x ^ c : c).
__device__ __forceinline__ uint32_t select_xor(uint32_t x, uint32_t mask, uint32_t c) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0x6a;\n" : "=r"(r) : "r"(x), "r"(mask), "r"(c));
  return r;
}

// x - c and x * m + c on fp16 pairs (exact for the code conversions below).
__device__ __forceinline__ uint32_t hsub2(uint32_t x, uint32_t c) {
  uint32_t r;
  asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(x), "r"(c));
  return r;
}
__device__ __forceinline__ uint32_t hmul2(uint32_t x, uint32_t m) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(x), "r"(m));
  return r;
}
__device__ __forceinline__ uint32_t hfma2(uint32_t x, uint32_t m, uint32_t c) {
  uint32_t r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(x), "r"(m), "r"(c));
  return r;
}
#endif

}  // namespace kvq::detail
