// The adoption gate for decode variants: each case runs the kernel on a cache quantized by the CPU
// codec and checks O and LSE against the fp64 reference on the dequantized K/V with DESIGN.md's
// tolerance rule (2 x the precision-mimic's error + the output dtype's rounding noise); the mimic's
// profile is the kernel's own (decode_precision_profile). Cases a variant does not support are
// reported as skipped with the reason.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "experiments/gate/validate_quantize.hpp"

namespace kvq {

struct ToleranceCheck {
  double max_err = 0, mean_err = 0;              // kernel vs fp64 reference
  double mimic_max = 0, mimic_mean = 0, floor = 0;  // the allowance's parts
  double lse_max_err = 0, lse_allowed = 0;
  bool ok = false;
  std::string detail;
};

// DESIGN.md rule on O (bf16) and LSE (fp32); O must be finite, and empty key sets give O = 0 and
// LSE = -inf exactly.
ToleranceCheck check_tolerance(const std::vector<float>& out, const std::vector<float>& lse,
                               const std::vector<double>& ref_o, const std::vector<double>& ref_lse,
                               const std::vector<double>& mimic_o, const std::vector<double>& mimic_lse);

std::vector<CaseResult> validate_decode_variant(const DecodeVariant& v, const ValidateOptions& options,
                                                const std::function<void(const CaseResult&)>& report);

}  // namespace kvq
