// Every GPU kernel variant by name, with what it supports and how to launch it. Tools select
// variants by regex (kvq variants, kvq validate --variant, the benchmarks); a new variant is one
// entry here plus its kernel file.
#pragma once

#include <string>
#include <vector>

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

}  // namespace kvq
