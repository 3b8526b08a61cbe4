// The hardware FP8 conversions against the codec's software fp8(), over every finite fp32 pattern.
#include <doctest/doctest.h>

#include <ios>

#include "gpu/fp8_check.hpp"

using namespace kvq;

TEST_CASE("the device's satfinite fp8 conversions equal the codec's fp8() for every finite fp32 pattern") {
  const Fp8CheckResult r = check_fp8_conversions();
  CHECK_MESSAGE(r.e4m3_mismatches == 0, "e4m3: " << r.e4m3_mismatches << " finite inputs differ; first fp32 bits 0x"
                                                  << std::hex << r.e4m3_first_bits << ": hardware 0x" << int(r.e4m3_first_hw)
                                                  << ", software 0x" << int(r.e4m3_first_sw));
  CHECK_MESSAGE(r.e5m2_mismatches == 0, "e5m2: " << r.e5m2_mismatches << " finite inputs differ; first fp32 bits 0x"
                                                  << std::hex << r.e5m2_first_bits << ": hardware 0x" << int(r.e5m2_first_hw)
                                                  << ", software 0x" << int(r.e5m2_first_sw));
  CHECK_MESSAGE(r.decode_mismatches == 0, r.decode_mismatches << " fp8 codes decode differently on the device");
  MESSAGE("non-finite inputs (inf, NaN; the codec rejects them before converting) differing: " << r.nonfinite_mismatches);
}
