// Every GPU kernel variant by name, with what it supports and how to launch it. Tools select
// variants by regex (kvq variants, kvq validate --variant, the benchmarks); a new variant is one
// entry here plus its kernel file.
#pragma once

#include <string>
#include <vector>

#include "gpu/decode.hpp"
#include "gpu/quantize.hpp"

namespace kvq {

struct QuantizeVariant {
  std::string name;      // e.g. quantize-rowwarp
  std::string summary;   // one line: how it works
  std::string supports;  // one line: schemes, head dims, layouts, dtypes
  bool incumbent = false;  // the variant the others are checked and timed against
  bool (*accepts)(const Scheme&, int64_t head_dim, CodeLayout, InputDtype) = nullptr;
  void (*launch)(const QuantizeParams&, cudaStream_t) = nullptr;
};

const std::vector<QuantizeVariant>& quantize_variants();
const QuantizeVariant& incumbent_quantize_variant();
// Variants whose name matches `regex` (std::regex_search); throws InputError for a bad regex.
std::vector<const QuantizeVariant*> find_quantize_variants(const std::string& regex);

// A decode attention variant: one kernel template (gpu/decode_kernel.cuh) with a launch policy.
struct DecodeVariant {
  std::string name;
  std::string summary;
  std::string supports;
  bool incumbent = false;
  bool split_k = false;        // false: one pass, one CTA per (b, KV head, head block)
  int max_heads_per_cta = 8;   // query heads sharing a CTA's K/V reads
  DecodeFamily family = DecodeFamily::kCudaCore;
  // Why this variant cannot run `p` (a storage or head_dim its kernels do not read), or "".
  std::string unsupported_reason(const DecodeParams& p) const;
  // The launch shape for `p` on a device with `sm_count` SMs; forced_splits > 0 overrides the
  // heuristic (split-K variants only).
  DecodeParams plan(const DecodeParams& p, int sm_count, int forced_splits = 0) const;
};

const std::vector<DecodeVariant>& decode_variants();
const DecodeVariant& incumbent_decode_variant();
// The adopted variants in order of preference (kvq sweep times the first that runs a storage):
// decode-tc, faster on every storage it reads, then decode-splitk for the rest (D = 8, G = 8).
std::vector<const DecodeVariant*> adopted_decode_variants();
// The first adopted variant that supports `p`.
const DecodeVariant& default_decode_variant(const DecodeParams& p);
std::vector<const DecodeVariant*> find_decode_variants(const std::string& regex);

}  // namespace kvq
