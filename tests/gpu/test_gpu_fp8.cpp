// The hardware FP8 conversions against the codec's software fp8(), over every finite fp32 pattern; Fp8Coder
// against the division over every fp32 pattern of x.
#include <doctest/doctest.h>

#include <ios>
#include <utility>

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

TEST_CASE("Fp8Coder on the device: every code it calls sure is encode_fp8's, over every fp32 pattern of x") {
  // Scales: the unit scale of scale-free FP8, an fp16-rounded per-group one, a tiny given one (most
  // products overflow: not sure), a zero scale (codes 0), and an e5m2 group's.
  const std::pair<float, bool> cases[] = {{1.0f, false}, {0.00826263f, false}, {3.0e-38f, false}, {0.0f, false},
                                          {6.4492e-5f, true}};
  for (const auto& [scale, e5m2] : cases) {
    CAPTURE(scale);
    CAPTURE(e5m2);
    const Fp8CoderCheck r = check_fp8_coder(scale, e5m2);
    CHECK_MESSAGE(r.mismatches == 0, r.mismatches << " sure codes differ; first x bits 0x" << std::hex << r.first_bits);
    // Finite quotients near a rounding boundary (within about 2^-20 relative) only: a few in a million.
    CHECK(r.finite_not_sure < (1ull << 32) / 100000);
    MESSAGE("scale " << scale << (e5m2 ? " e5m2" : " e4m3") << ": " << r.not_sure << " of 2^32 not sure, "
                     << r.finite_not_sure << " with a finite quotient");
  }
}
