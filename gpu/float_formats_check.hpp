// Exhaustive device check of the fp16 conversions against their integer definitions.
#pragma once

namespace kvq {

struct Fp16CheckResult {
  unsigned long long to_fp16_mismatches, first_fp32_bits;  // over all 2^32 fp32 patterns
  unsigned long long to_fp32_mismatches, first_fp16_bits;  // over all 2^16 fp16 patterns
  bool ok() const { return to_fp16_mismatches == 0 && to_fp32_mismatches == 0; }
};

Fp16CheckResult check_fp16_conversions();

}  // namespace kvq
