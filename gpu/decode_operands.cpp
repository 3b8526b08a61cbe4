// What the decode kernels read and refuse, on the host: the storages' operands (raw, paged, windows),
// the reasons a launch is unsupported, the precision profile the gate checks a launch against, the
// parameters' checks, and the bytes a decode moves (the bench's bandwidth column).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpu/decode.hpp"
#include "quant/errors.hpp"
#include "quant/fbgemm_layout.hpp"
#include "quant/groups.hpp"

namespace kvq {

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
