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

bool generic_accepts(const Scheme& s, int64_t head_dim, CodeLayout layout, InputDtype) {
  try {
    check_scheme_fits(s, static_cast<int>(head_dim));
  } catch (const SchemeError&) {
    return false;
  }
  return layout == CodeLayout::kPlanar || fbgemm_ok(s, head_dim);
}

bool groupthread_accepts(const Scheme& s, int64_t head_dim, CodeLayout layout, InputDtype dtype) {
  return groupthread_supports(s, head_dim) && generic_accepts(s, head_dim, layout, dtype);
}

bool rowwarp_accepts(const Scheme& s, int64_t head_dim, CodeLayout layout, InputDtype dtype) {
  return rowwarp_supports(s, head_dim) && generic_accepts(s, head_dim, layout, dtype);
}

}  // namespace

const std::vector<QuantizeVariant>& quantize_variants() {
  static const std::vector<QuantizeVariant> variants = {
      {"quantize-generic",
       "stats pass (thread per group; per-tensor: two-pass block reduction), params pass, encode pass (thread per "
       "code byte); FBGEMM rows assembled from planar bytes",
       "every scheme; any even D; any strides; planar and FBGEMM layouts; fp32/fp16/bf16 input", true,
       generic_accepts, launch_quantize_generic},
      {"quantize-rowwarp",
       "fused single pass: one warp per (b,h,t) row, one vector load per lane, groups reduced with xor-shuffles, "
       "two rows in flight per warp",
       "head and gG granularities; D in {64,128,256}; planar and FBGEMM layouts; fp32/fp16/bf16 input", false,
       rowwarp_accepts, launch_quantize_rowwarp},
      {"quantize-groupthread",
       "one thread per scale group or 32-element segment of one (larger groups merge 2-8 lanes by xor-shuffle), "
       "16-byte loads in 8-element chunks, two passes over the segment (the second from L1)",
       "head and gG granularities with G a multiple of 8 (above 32: 32 x a power of two); any D that G divides; "
       "planar and FBGEMM layouts; fp32/fp16/bf16 input", false, groupthread_accepts, launch_quantize_groupthread},
  };
  return variants;
}

const QuantizeVariant& incumbent_quantize_variant() {
  for (const QuantizeVariant& v : quantize_variants())
    if (v.incumbent) return v;
  throw Error("no incumbent quantize variant is registered");
}

std::vector<const QuantizeVariant*> find_quantize_variants(const std::string& regex) {
  std::regex re;
  try {
    re = std::regex(regex);
  } catch (const std::regex_error& e) {
    throw InputError(fmt::format("--variant '{}': not a valid regular expression ({})", regex, e.what()));
  }
  std::vector<const QuantizeVariant*> out;
  for (const QuantizeVariant& v : quantize_variants())
    if (std::regex_search(v.name, re)) out.push_back(&v);
  return out;
}

}  // namespace kvq
