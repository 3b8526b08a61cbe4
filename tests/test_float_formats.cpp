// fp16 / bf16 conversions against independent oracles: the compiler's _Float16 (IEEE RNE) and a
// double-precision rounding model for bf16.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "quant/float_formats.hpp"

using namespace kvq;

namespace {

uint16_t oracle_fp16_bits(float x) {
  const _Float16 h = static_cast<_Float16>(x);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

// Round to 8 significant bits (bf16), ties to even, in double; overflow to inf.
float oracle_bf16(float x) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0f) return x;
  int e;
  std::frexp(static_cast<double>(x), &e);             // |x| in [2^(e-1), 2^e)
  const double ulp = std::ldexp(1.0, std::max(e - 8, -133));  // bf16 subnormals share fp32's range
  const double r = std::nearbyint(static_cast<double>(x) / ulp) * ulp;
  return static_cast<float>(r);  // exact, or inf when it rounds past the largest finite bf16
}

}  // namespace

TEST_CASE("fp16 round trip of every fp16 bit pattern") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_bits_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      CHECK(((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0));
      continue;
    }
    _Float16 ref;
    const uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&ref, &bits, 2);
    REQUIRE(f == static_cast<float>(ref));
    REQUIRE(fp32_to_fp16_bits(f) == h);
  }
}

TEST_CASE("fp32 to fp16 matches IEEE round-to-nearest-even") {
  SUBCASE("specials and boundaries") {
    const float cases[] = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e10f, INFINITY, -INFINITY,
                           6.103515625e-05f, 6.1e-05f, 2.98023224e-08f /*2^-25: tie to 0*/, 2.99e-08f,
                           5.96046448e-08f, 1.0009765625f /*tie*/, 1.00048828125f, 1.00146484375f};
    for (float x : cases) CHECK_MESSAGE(fp32_to_fp16_bits(x) == oracle_fp16_bits(x), "x = " << x);
    CHECK(fp32_to_fp16_bits(65520.0f) == 0x7c00);  // the tie above 65504 rounds to inf
    CHECK(fp32_to_fp16_bits(65519.99f) == 0x7bff);
  }
  SUBCASE("ten million random bit patterns") {
    std::mt19937 rng(7);
    for (int i = 0; i < 10'000'000; ++i) {
      const uint32_t u = rng();
      const float x = bits_float(u);
      if (std::isnan(x)) {
        REQUIRE((fp32_to_fp16_bits(x) & 0x7fff) > 0x7c00);
        continue;
      }
      REQUIRE(fp32_to_fp16_bits(x) == oracle_fp16_bits(x));
    }
  }
  SUBCASE("every value near the fp16 range, densely") {
    std::mt19937 rng(8);
    std::uniform_real_distribution<float> mag(-17.0f, 17.0f);
    for (int i = 0; i < 2'000'000; ++i) {
      const float x = std::exp2(mag(rng)) * (i % 2 ? -1.0f : 1.0f);
      REQUIRE(fp32_to_fp16_bits(x) == oracle_fp16_bits(x));
    }
  }
}

TEST_CASE("fp32 to bf16 matches round-to-nearest-even") {
  CHECK(fp32_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(round_to_bf16(1.00390625f) == 1.0f);        // tie: 1 + 2^-8 -> 1 (even)
  CHECK(round_to_bf16(1.01171875f) == 1.015625f);   // tie: 1 + 3*2^-8 -> 1 + 4*2^-8 (even)
  CHECK(std::isinf(round_to_bf16(3.4028235e38f)));  // rounds past the largest bf16
  CHECK(std::isnan(round_to_bf16(NAN)));
  std::mt19937 rng(9);
  for (int i = 0; i < 5'000'000; ++i) {
    const float x = bits_float(rng());
    if (std::isnan(x)) continue;
    const float got = round_to_bf16(x), want = oracle_bf16(x);
    REQUIRE_MESSAGE(float_bits(got) == float_bits(want), "x = " << x);
  }
}

TEST_CASE("fp16 operand exponent puts max abs q times 2^e between 2^14 and 2^15 and is clamped to 100") {
  CHECK(fp16_operand_exponent(1.0f) == 14);
  CHECK(fp16_operand_exponent(3.0f) == 13);
  CHECK(fp16_operand_exponent(65504.0f) == -1);
  CHECK(fp16_operand_exponent(std::ldexp(1.0f, -14)) == 28);
  CHECK(fp16_operand_exponent(0.0f) == 0);
  CHECK(fp16_operand_exponent(1e-40f) == 100);  // subnormal: clamped
  CHECK(fp16_operand_exponent(3e38f) == -100);
  for (float x : {1e-3f, 0.7f, 1.0f, 5.5f, 1234.5f, 65504.0f}) {
    const float scaled = std::ldexp(x, fp16_operand_exponent(x));
    CHECK(scaled >= 16384.0f);
    CHECK(scaled < 32768.0f);
  }
}
