// Exhaustive device check of the hardware FP8 conversions (cvt ... satfinite, via cuda_fp8.h)
// against the codec's software fp8() in quant/float_formats.hpp.
#pragma once

namespace kvq {

struct Fp8CheckResult {
  // Over every finite fp32 pattern (2^32 - 2^24): fp32 -> fp8 with saturation, round to nearest even.
  unsigned long long e4m3_mismatches, e4m3_first_bits;  // first_bits: ~0 when none
  unsigned long long e5m2_mismatches, e5m2_first_bits;
  unsigned char e4m3_first_hw, e4m3_first_sw, e5m2_first_hw, e5m2_first_sw;  // codes at the first mismatch
  // Over the non-finite patterns (inf, NaN): informational, the codec never converts them.
  unsigned long long nonfinite_mismatches;
  // fp8 -> fp32 over the 256 codes of each format, NaN codes excluded.
  unsigned long long decode_mismatches;
  bool ok() const { return e4m3_mismatches == 0 && e5m2_mismatches == 0 && decode_mismatches == 0; }
};

Fp8CheckResult check_fp8_conversions();

// Fp8Coder (quant/codec.hpp) on the device against encode_fp8, the division, for one scale over every
// fp32 pattern of x (non-finite ones included: the coder must call them not sure).
struct Fp8CoderCheck {
  float scale;
  bool e5m2;
  unsigned long long mismatches;   // codes the coder called sure that differ from encode_fp8's
  unsigned long long first_bits;   // x of the first (lowest) mismatch; ~0 when none
  unsigned long long not_sure;     // elements the coder left to the division
  unsigned long long finite_not_sure;  // of them, finite x whose product x / s is finite
};

Fp8CoderCheck check_fp8_coder(float scale, bool e5m2);

}  // namespace kvq
