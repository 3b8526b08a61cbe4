// The host side of the tensor-core decode kernels: one launch's plan (TcPlan, computed once instead
// of by every thread) and the one place that turns a launch's runtime choices (K and V storage, head
// dim, scale-group shape) into decode_tc_kernel's template arguments (TcEntry, per (K, V) pair;
// instantiated per K storage in decode_tc_k_<format>.cu).
#pragma once

#include <type_traits>
#include <vector>

#include "gpu/decode_tc_kernel.cuh"

namespace kvq::detail {
// The scale-group shapes with kernels of their own (decode_tc_kernel's template arguments). Only
// storages with K and V in one format get the specialised shapes; mixed pairs run the general one;
// chan-tN K (int8 / int4 K; int8, int4, bf16 or fp16 V) its own.
// Mixed pairs of the common shapes (K one group per row or raw with V in groups of 32, and K in groups
// of 32 with V one group per row) get theirs too (kRowG32, kG32Row; tc_kernel_for says for which).
// nvfp4 V (blocks of 16) has its own with any K (kVBlocks16).
enum class TcGroupShape { kRow, kG32, kAny, kChannelK, kRowG32, kG32Row, kVBlocks16 };
// nvfp4 V: blocks of 16, which split an m-tile pair (its scales multiply the V fragments instead)
inline bool tc_v_blocks16(const DecodeParams& p) {
  return p.v_format == KvFormat::kLut4 && p.v.scale_dtype == ScaleDtype::kE4M3 && p.v.group == 16;
}
inline TcGroupShape tc_group_shape(const DecodeParams& p) {
  if (p.k.mode == ParamMode::kChannel) return TcGroupShape::kChannelK;
  if (tc_v_blocks16(p)) return TcGroupShape::kVBlocks16;
  auto row = [&](const KvOperand& op) { return op.group <= 0 || op.group == p.head_dim; };
  const bool fp16_params = p.k.scale_dtype == ScaleDtype::kFp16 && p.v.scale_dtype == ScaleDtype::kFp16;
  if (tc_codes(p.k_format) != tc_codes(p.v_format)) {
    if (!fp16_params || p.k.mode == ParamMode::kInlineRow || p.v.mode == ParamMode::kInlineRow) return TcGroupShape::kAny;
    const bool k_quantized = is_quantized(p.k_format), v_quantized = is_quantized(p.v_format);
    const bool k_g32 = k_quantized && p.k.mode == ParamMode::kGroup && p.k.group == 32;
    const bool v_g32 = v_quantized && p.v.mode == ParamMode::kGroup && p.v.group == 32;
    if ((!k_quantized || row(p.k)) && v_g32) return TcGroupShape::kRowG32;
    if (k_g32 && v_quantized && row(p.v)) return TcGroupShape::kG32Row;
    return TcGroupShape::kAny;
  }
  if (!is_quantized(p.k_format)) return TcGroupShape::kRow;
  if (!fp16_params) return TcGroupShape::kAny;  // the specialised ones read fp16 parameters
  if (row(p.k) && row(p.v)) return TcGroupShape::kRow;
  if (p.k.group == 32 && p.v.group == 32) return TcGroupShape::kG32;
  return TcGroupShape::kAny;
}

// One operand's share of a launch's plan (what tc_source and the copies would otherwise compute per thread).
template <KvFormat FK, KvFormat FV, int D>
TcOperandPlan tc_operand_plan(const KvOperand& op, const DecodeParams& p, int row_words, bool is_k) {
  using Tr = TcTraits<FK, FV, D>;
  TcOperandPlan pl;
  pl.groups = op.group > 0 && op.mode != ParamMode::kChannel ? D / op.group : 1;
  pl.inline_words = op.inline_bytes / 4;
  // Every CTA's rows aligned to `bytes` (a stride that never moves the pointer does not count).
  auto aligned_to = [&](int64_t bytes) {
    auto moves = [&](int64_t count, int64_t stride) { return count > 1 && stride % bytes != 0; };
    return reinterpret_cast<uintptr_t>(op.data) % bytes == 0 && op.stride_t % bytes == 0 &&
           !moves(p.block_table ? 1 : p.batch, op.stride_b) && !moves(p.kv_heads, op.stride_h) &&
           (!p.block_table || op.stride_page % bytes == 0);
  };
  const bool aligned = aligned_to(16);
  // 16-byte copies whose chunks tile a warp (5-bit rows of 5 or 10 chunks copy as FBGEMM rows do)
  pl.vec16 = pl.inline_words == 0 && row_words % 4 == 0 && 32 % (row_words / 4) == 0 && aligned;
  if (!pl.vec16 && pl.inline_words % 4 == 0 && row_words % 4 == 0 && aligned) pl.copy_words = 4;
  // 5-bit rows at D = 64 (10 words): 8-byte copies (copy_step compiles them for such rows only)
  if (pl.inline_words == 0 && row_words % 4 == 2 && aligned_to(8)) pl.copy_words = 2;
  pl.units_magic = (1u << 24) / static_cast<uint32_t>((pl.inline_words + row_words) / pl.copy_words) + 1;
  const int pbytes = op.param_bytes();
  switch (op.mode) {
    case ParamMode::kToken: pl.param_bytes = p.batch * p.tokens * pbytes; break;
    case ParamMode::kHead:
    case ParamMode::kGroup: pl.params_per_head = p.tokens * pl.groups; break;
    case ParamMode::kChannel: pl.params_per_head = (p.tokens + op.group - 1) / op.group * D; break;
    default: break;
  }
  if (pl.params_per_head > 0) pl.param_bytes = p.batch * p.kv_heads * pl.params_per_head * pbytes;
  if (pl.param_bytes > 0) {
    pl.param_words = tc_param_words(op, Tr::kStepTokens, D) / (op.asymmetric ? 2 : 1);
    pl.param_row_bytes = op.mode == ParamMode::kChannel ? 0 : pl.groups * pbytes;
  }
  if (p.block_table) {
    pl.page_bytes = static_cast<int>(op.stride_page), pl.page_row_bytes = static_cast<int>(op.stride_t);
    pl.param_page_bytes = static_cast<int>(op.param_stride_page * pbytes);
    const bool channel = op.mode == ParamMode::kChannel;  // whole token groups of N | P tokens: N a power of two
    pl.param_unit_bytes = channel ? D * pbytes : pl.param_row_bytes;
    pl.param_in_page_shift = channel ? ilog2(op.group) : 0;
  }
  // Operands read without scale groups (raw, chan-tN K) count as one group per row.
  const bool grouped = is_k ? Tr::K::kQuantized && op.mode != ParamMode::kChannel : Tr::V::kQuantized;
  const int groups = grouped ? pl.groups : 1;
  const int per_group = is_k ? Tr::kSlices / groups : Tr::kSlices / 2 / groups;
  pl.group_shift = per_group > 0 ? ilog2(per_group) : 0;  // 0 pairs: nvfp4 V, whose kernel ignores it
  return pl;
}

template <KvFormat FK, KvFormat FV, int D>
TcPlan tc_plan(const DecodeParams& p) {
  using Tr = TcTraits<FK, FV, D>;
  TcPlan plan;
  const TcStageLayout lay = tc_stage_layout<FK, FV, D>(p);
  plan.k_params = lay.k_params, plan.v_params = lay.v_params, plan.stage_words = lay.stage_words;
  plan.k = tc_operand_plan<FK, FV, D>(p.k, p, Tr::kKRowWords, true);
  plan.v = tc_operand_plan<FK, FV, D>(p.v, p, Tr::kVRowWords, false);
  plan.group_size = static_cast<int>(p.q_heads / p.kv_heads);
  plan.head_blocks = (plan.group_size + Tr::kHeads - 1) / Tr::kHeads;
  const bool k_grouped = Tr::K::kQuantized && p.k.mode != ParamMode::kChannel;
  plan.q_lanes_per_group = D / (k_grouped ? plan.k.groups : 1) / (D / 32);
  if (p.block_table) plan.page_shift = ilog2(p.page_tokens);
  plan.by_head_blocks = FastDiv(static_cast<uint32_t>(plan.head_blocks));
  plan.by_splits = FastDiv(static_cast<uint32_t>(p.splits));
  plan.by_kv_heads = FastDiv(static_cast<uint32_t>(p.kv_heads));
  return plan;
}

// The kernels of one (K, V) storage pair, over D and the group shape.
struct TcEntry {
  const void* (*kernel)(const DecodeParams&) = nullptr;
  int (*smem_bytes)(const DecodeParams&) = nullptr;
  int (*split_round)(const DecodeParams&) = nullptr;  // a split's keys are a multiple of it
  TcPlan (*plan)(const DecodeParams&) = nullptr;
  // Every kernel of the pair, for the one-time shared-memory opt-in.
  std::vector<const void*> (*kernels)() = nullptr;
};

// The kernel of `shape`; paged caches (kernels of their own: kPaged) read with the same shapes, but
// mixed pairs with the general one only (compile time).
template <KvFormat FK, KvFormat FV, int D, bool kPaged>
const void* tc_kernel_for(TcGroupShape shape) {
  using Tr = TcTraits<FK, FV, D>;
  constexpr int kSlices = Tr::kSlices;
  // chan-tN K: int8 / int4 K with int8, int4 or raw V (a +wW window's region)
  constexpr bool kChanPair = (FK == KvFormat::kInt8 || FK == KvFormat::kInt4) &&
                             (FV == KvFormat::kInt8 || FV == KvFormat::kInt4 || !Tr::V::kQuantized);
#if defined(KVQ_CUDA_COMPILE_CHECK) && KVQ_CUDA_COMPILE_CHECK
  constexpr bool kChanPages = D == 128;
#else
  constexpr bool kChanPages = true;
#endif
  if (shape == TcGroupShape::kChannelK) {
    if constexpr (kChanPair && (!kPaged || kChanPages))
      return reinterpret_cast<const void*>(&decode_tc_kernel<FK, FV, D, -1, 0, kPaged>);
    else return nullptr;  // tensor_core_unsupported_reason names it
  }
  if (shape == TcGroupShape::kVBlocks16) {
    if constexpr (FV == KvFormat::kLut4) return reinterpret_cast<const void*>(&decode_tc_kernel<FK, FV, D, 0, -1, kPaged>);
    else return nullptr;
  }
  if constexpr (FK != FV) {
    // The mixed pairs the bench and the sweep's defaults use, at D = 64 and 128 (each kernel costs
    // compile time): int8 / FP8 / raw K with int4 g32 V, int4 g32 K with int8 V.
    constexpr bool kSmallD = (D == 64 || D == 128) && !kPaged;
    constexpr bool kRowG32 = kSmallD && FV == KvFormat::kInt4 &&
                             (FK == KvFormat::kInt8 || FK == KvFormat::kFp8E4m3 || FK == KvFormat::kBf16 || FK == KvFormat::kFp16);
    constexpr bool kG32Row = kSmallD && FK == KvFormat::kInt4 && FV == KvFormat::kInt8;
    if constexpr (kRowG32)
      if (shape == TcGroupShape::kRowG32) return reinterpret_cast<const void*>(&decode_tc_kernel<FK, FV, D, kSlices, 1>);
    if constexpr (kG32Row)
      if (shape == TcGroupShape::kG32Row) return reinterpret_cast<const void*>(&decode_tc_kernel<FK, FV, D, 2, kSlices / 2>);
    return reinterpret_cast<const void*>(&decode_tc_kernel<FK, FV, D, 0, 0, kPaged>);
  } else if constexpr (!Tr::kQuantized) {
    return reinterpret_cast<const void*>(&decode_tc_kernel<FK, FV, D, kSlices, kSlices / 2, kPaged>);
  } else {
    switch (shape) {
      case TcGroupShape::kRow: return reinterpret_cast<const void*>(&decode_tc_kernel<FK, FV, D, kSlices, kSlices / 2, kPaged>);
      case TcGroupShape::kG32: return reinterpret_cast<const void*>(&decode_tc_kernel<FK, FV, D, 2, 1, kPaged>);
      default: break;
    }
    return reinterpret_cast<const void*>(&decode_tc_kernel<FK, FV, D, 0, 0, kPaged>);
  }
}

template <KvFormat FK, KvFormat FV, int D>
const void* tc_kernel_for(TcGroupShape shape, bool paged) {
#if defined(KVQ_CUDA_COMPILE_CHECK) && KVQ_CUDA_COMPILE_CHECK
  // CI's compile check (a build no GPU runs) instantiates the paged kernels of int8 K only, with every
  // V format (chan-tN K's at D = 128 only): the paged code of every storage compiles there, in an
  // eighth of their compile time.
  if constexpr (FK != KvFormat::kInt8) {
    return paged ? nullptr : tc_kernel_for<FK, FV, D, false>(shape);
  } else
#endif
  {
    return paged ? tc_kernel_for<FK, FV, D, true>(shape) : tc_kernel_for<FK, FV, D, false>(shape);
  }
}

// f(std::integral_constant<int, D>{}) for the head dims with kernels (64, 128, 256); `otherwise` else.
template <class F, class R>
R with_tc_head_dim(int head_dim, F&& f, R otherwise) {
  switch (head_dim) {
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 256: return f(std::integral_constant<int, 256>{});
  }
  return otherwise;
}

template <KvFormat FK, KvFormat FV>
TcEntry tc_entry() {
  TcEntry e;
  e.kernel = [](const DecodeParams& p) {
    const TcGroupShape shape = tc_group_shape(p);
    const bool paged = p.block_table != nullptr;
    return with_tc_head_dim(
        p.head_dim, [&](auto d) { return tc_kernel_for<FK, FV, decltype(d)::value>(shape, paged); },
        static_cast<const void*>(nullptr));
  };
  e.smem_bytes = [](const DecodeParams& p) {
    return with_tc_head_dim(p.head_dim, [&](auto d) { return tc_smem_bytes<FK, FV, decltype(d)::value>(p); }, 0);
  };
  e.split_round = [](const DecodeParams& p) {
    return with_tc_head_dim(p.head_dim, [](auto d) { return TcTraits<FK, FV, decltype(d)::value>::kSplitRound; }, 1);
  };
  e.plan = [](const DecodeParams& p) {
    return with_tc_head_dim(p.head_dim, [&](auto d) { return tc_plan<FK, FV, decltype(d)::value>(p); }, TcPlan{});
  };
  e.kernels = [] {
    std::vector<const void*> all;
    for (TcGroupShape shape : {TcGroupShape::kRow, TcGroupShape::kG32, TcGroupShape::kAny, TcGroupShape::kChannelK,
                               TcGroupShape::kRowG32, TcGroupShape::kG32Row, TcGroupShape::kVBlocks16})
      for (bool paged : {false, true})
        for (const void* k : {tc_kernel_for<FK, FV, 64>(shape, paged), tc_kernel_for<FK, FV, 128>(shape, paged),
                              tc_kernel_for<FK, FV, 256>(shape, paged)})
          if (k) all.push_back(k);
    return all;
  };
  return e;
}

// The (K, V) storage pairs with kernels: every pair but the block formats' own storages (kInt5,
// kLut4) with FP8 (compile time: no engine mixes llama.cpp's cache types with FP8).
constexpr bool tc_paired(KvFormat k, KvFormat v) {
  auto block = [](KvFormat f) { return f == KvFormat::kInt5 || f == KvFormat::kLut4; };
  auto fp8 = [](KvFormat f) { return f == KvFormat::kFp8E4m3 || f == KvFormat::kFp8E5m2; };
  return !(block(k) && fp8(v)) && !(fp8(k) && block(v));
}
template <KvFormat FK, KvFormat FV>
TcEntry tc_entry_if_paired() {
  if constexpr (tc_paired(FK, FV)) return tc_entry<FK, FV>();
  else return {};
}

// The entries of K format FK with every V format (explicitly instantiated in decode_tc_<FK>.cu).
template <KvFormat FK>
TcEntry tc_entry_for_v(KvFormat v) {
  switch (tc_codes(v)) {
    case KvFormat::kBf16: return tc_entry_if_paired<FK, KvFormat::kBf16>();
    case KvFormat::kFp16: return tc_entry_if_paired<FK, KvFormat::kFp16>();
    case KvFormat::kInt8: return tc_entry_if_paired<FK, KvFormat::kInt8>();
    case KvFormat::kInt4: return tc_entry_if_paired<FK, KvFormat::kInt4>();
    case KvFormat::kFp8E4m3: return tc_entry_if_paired<FK, KvFormat::kFp8E4m3>();
    case KvFormat::kFp8E5m2: return tc_entry_if_paired<FK, KvFormat::kFp8E5m2>();
    case KvFormat::kInt5: return tc_entry_if_paired<FK, KvFormat::kInt5>();
    case KvFormat::kLut4: return tc_entry_if_paired<FK, KvFormat::kLut4>();
    case KvFormat::kInt4Fbgemm: break;  // tc_codes maps it to kInt4
  }
  return {};
}

}  // namespace kvq::detail
