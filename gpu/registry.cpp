#include "gpu/registry.hpp"

#include <fmt/format.h>

#include <regex>

#include "quant/fbgemm_layout.hpp"

namespace kvq {
namespace {

bool fbgemm_ok(const Scheme& s, int64_t head_dim) {
  try {
    fbgemm_groups_per_row(s, head_dim);
    return true;
  } catch (const SchemeError&) {
    return false;
  }
}

// Only quantize-generic rotates (+had) or keeps a window (+wW).
bool plain(const Scheme& s) { return !s.hadamard && !s.has_window(); }

bool generic_accepts(const Scheme& s, int64_t head_dim, CodeLayout layout, InputDtype) {
  try {
    check_scheme_fits(s, static_cast<int>(head_dim));
  } catch (const SchemeError&) {
    return false;
  }
  if (s.block_format()) return layout == CodeLayout::kPlanar;  // q8_0 ... nvfp4: gpu/quantize_blocks.cu
  return layout == CodeLayout::kPlanar || fbgemm_ok(s, head_dim);
}

bool groupthread_accepts(const Scheme& s, int64_t head_dim, CodeLayout layout, InputDtype dtype) {
  return (!s.fp8() || layout == CodeLayout::kPlanar) && plain(s) && groupthread_supports(s, head_dim) &&
         generic_accepts(s, head_dim, layout, dtype);
}

bool rowwarp_accepts(const Scheme& s, int64_t head_dim, CodeLayout layout, InputDtype dtype) {
  return !s.fp8() && plain(s) && rowwarp_supports(s, head_dim) && generic_accepts(s, head_dim, layout, dtype);
}

bool tokenteam_accepts(const Scheme& s, int64_t head_dim, CodeLayout layout, InputDtype dtype) {
  return plain(s) && tokenteam_supports(s, head_dim) && layout == CodeLayout::kPlanar &&
         generic_accepts(s, head_dim, layout, dtype);
}

bool tensor2pass_accepts(const Scheme& s, int64_t head_dim, CodeLayout layout, InputDtype dtype) {
  return plain(s) && tensor2pass_supports(s, head_dim) && layout == CodeLayout::kPlanar &&
         generic_accepts(s, head_dim, layout, dtype);
}

}  // namespace

const std::vector<QuantizeVariant>& quantize_variants() {
  static const std::vector<QuantizeVariant> variants = {
      {"quantize-generic",
       "(+had: rotation pass, thread per row) stats pass (thread per group; per-tensor: two-pass block reduction), "
       "params pass, encode pass (thread per code byte; +wW window tokens: code 0); FBGEMM rows assembled from planar "
       "bytes; the block formats: one thread per block, the codec's block rules on registers (nvfp4: a deterministic "
       "amax pass for the tensor scale first)",
       "every scheme (FP8, +had and +wW included; llama.cpp's q8_0 ... iq4_nl and mxfp4 / nvfp4, planar); any even D "
       "(the block formats: a multiple of the block); any strides; planar and FBGEMM layouts; fp32/fp16/bf16 input",
       true,
       generic_accepts, launch_quantize_generic},
      {"quantize-rowwarp",
       "fused single pass: one warp per (b,h,t) row, one vector load per lane, groups reduced with xor-shuffles, "
       "two rows in flight per warp",
       "head and gG granularities; D in {64,128,256}; planar and FBGEMM layouts; fp32/fp16/bf16 input", false,
       rowwarp_accepts, launch_quantize_rowwarp},
      {"quantize-groupthread",
       "one thread per scale group or 32-element segment of one (larger groups merge 2-8 lanes by xor-shuffle), "
       "16-byte loads in 8-element chunks; int8 and FP8: the segment held in registers from its loads to its codes, "
       "integer codes by one fma; int4: two passes over the segment (the second from L1)",
       "head and gG granularities with G a multiple of 8 (above 32: 32 x a power of two); any D that G divides; "
       "planar and FBGEMM layouts (FP8: planar); fp32/fp16/bf16 input", false, groupthread_accepts,
       launch_quantize_groupthread},
      {"quantize-tokenteam",
       "one pass: a team of 1-32 lanes of a warp per (b,t) token (the smallest that leaves <= 4 chunks a lane; 8 for "
       "16-bit tokens above 1024 elements, larger ones re-read the rest), 8-element chunks read once into registers "
       "with 16-byte loads, xor-shuffle reduction inside the team, codes encoded from the registers",
       "token granularity; any D that is a multiple of 8; any Hkv and strides; planar layout; fp32/fp16/bf16 input",
       false, tokenteam_accepts, launch_quantize_tokenteam},
      {"quantize-tensor2pass",
       "deterministic two-pass: partial min/max/amax per block of one resident wave (4 16-byte loads in flight per "
       "thread), then an encode pass whose blocks each merge the partials and run the codec, walking the tensor "
       "backwards to reuse what pass 1 left in L2; with a given (calibrated) scale the encode pass alone",
       "tensor granularity; any D that is a multiple of 8; any strides; planar layout; fp32/fp16/bf16 input", false,
       tensor2pass_accepts, launch_quantize_tensor2pass},
  };
  return variants;
}

const QuantizeVariant& incumbent_quantize_variant() {
  for (const QuantizeVariant& v : quantize_variants())
    if (v.incumbent) return v;
  throw Error("no incumbent quantize variant is registered");
}

namespace {

template <typename Variant>
std::vector<const Variant*> find_variants(const std::vector<Variant>& all, const std::string& regex) {
  std::regex re;
  try {
    re = std::regex(regex);
  } catch (const std::regex_error& e) {
    throw InputError(fmt::format("--variant '{}': not a valid regular expression ({})", regex, e.what()));
  }
  std::vector<const Variant*> out;
  for (const Variant& v : all)
    if (std::regex_search(v.name, re)) out.push_back(&v);
  return out;
}

const char* kDecodeSupports =
    "Tq=1; MHA/GQA/MQA; ALiBi; per-sequence lengths; D in {8,64,128,256}; K and V in one format: bf16 or fp16 (BNSH or "
    "BSNH), int8 (tensor/token/head/gG, sym/asym, fp16/fp32 scales), int4 planar (same) and FBGEMM rows; G a multiple "
    "of 8 (no FP8, chan-tN or +wW: decode-tc)";

}  // namespace

std::vector<const QuantizeVariant*> find_quantize_variants(const std::string& regex) {
  return find_variants(quantize_variants(), regex);
}

DecodeParams DecodeVariant::plan(const DecodeParams& p, int sm_count, int forced_splits) const {
  DecodeParams q = p;
  q.family = family;
  q.splits = split_k ? forced_splits : 1;
  return plan_decode(q, sm_count, max_heads_per_cta);
}

std::string DecodeVariant::unsupported_reason(const DecodeParams& p) const {
  if (family == DecodeFamily::kTensorCore) return tensor_core_unsupported_reason(p);
  return cuda_core_unsupported_reason(p);
}

const std::vector<DecodeVariant>& decode_variants() {
  static const std::vector<DecodeVariant> variants = {
      {"decode-cudacore",
       "one pass: CTA per (b, KV head, block of <= 8 query heads sharing its K/V reads), 4 warps taking row steps in "
       "turn; keys in chunks: QK (8 elements per lane dequantized by the codec, reduce-scatter over the row's lanes), "
       "softmax statistics in shared memory, PV; warps summed in shared memory",
       kDecodeSupports, true, false, 8},
      {"decode-splitk",
       "decode-cudacore with the keys split so the grid fills the device (splits from B, Hkv, T and the SM count); "
       "fp32 partials merged by LSE in a second kernel",
       kDecodeSupports, false, true, 8},
      {"decode-splitk-h4",
       "decode-splitk with at most 4 query heads per CTA (larger groups re-read K/V from L2): fewer registers, more CTAs",
       kDecodeSupports, false, true, 4},
      {"decode-splitk-h1",
       "decode-splitk with one query head per CTA, as in the INT8 split-K design (every head reads its K/V; L2 serves "
       "the repeats)",
       kDecodeSupports, false, true, 1},
      {"decode-tc",
       "tensor cores: mma.sync m16n8k16 with 16 keys x the 8 query heads of a KV head per tile (QK and PV); codes "
       "converted exactly to fp16 in registers (bf16 storage: bf16 MMA; chan-tN K dequantized to fp16), scales applied "
       "after QK and folded into P for PV; each warp streams its own key steps through a 2-3 stage cp.async ring; keys "
       "split so the grid fills the device (+wW: one launch per region of quantized / raw keys), warps then splits "
       "merged by LSE",
       "Tq=1; MHA/GQA/MQA; ALiBi; per-sequence lengths; D in {64,128,256} (D=8: the CUDA-core variants); K and V each "
       "bf16 or fp16 (BNSH or BSNH), int8, int4 or FP8 e4m3/e5m2 planar (tensor/token/head/gG, sym/asym, fp16/fp32 "
       "scales; FP8 also scale-free), int4 FBGEMM rows (both); K groups a multiple of 16, V groups a multiple of 32; "
       "chan-tN K (N a multiple of 32, fp16 params) with int8/int4/raw V; +wW windows read raw; +had K (Q rotated in the "
       "kernel)",
       false, true, 8, DecodeFamily::kTensorCore},
  };
  return variants;
}

const DecodeVariant& incumbent_decode_variant() {
  for (const DecodeVariant& v : decode_variants())
    if (v.incumbent) return v;
  throw Error("no incumbent decode variant is registered");
}

std::vector<const DecodeVariant*> adopted_decode_variants() {
  std::vector<const DecodeVariant*> out;
  for (const char* name : {"decode-tc", "decode-splitk"})
    for (const DecodeVariant& v : decode_variants())
      if (v.name == name) out.push_back(&v);
  return out;
}

const DecodeVariant& default_decode_variant(const DecodeParams& p) {
  const std::vector<const DecodeVariant*> adopted = adopted_decode_variants();
  for (const DecodeVariant* v : adopted)
    if (v->unsupported_reason(v->plan(p, 1, 1)).empty()) return *v;
  return *adopted.back();
}

std::vector<const DecodeVariant*> find_decode_variants(const std::string& regex) {
  return find_variants(decode_variants(), regex);
}

}  // namespace kvq
