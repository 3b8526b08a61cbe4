// The +had rotation: exact small cases, the norm constant, orthogonality, round trip and Q·K within
// bounds derived from fp32 rounding, and the scheme's error for a head_dim that is not a power of two.
#include <doctest/doctest.h>

#include <cmath>

#include "quant/hadamard.hpp"
#include "quant/quantize.hpp"
#include "test_util.hpp"

using namespace kvq;

namespace {

constexpr double kU = 0x1p-24;  // fp32 unit roundoff

double norm2(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

int log2_of(int64_t d) {
  int k = 0;
  while ((int64_t{1} << k) < d) ++k;
  return k;
}

}  // namespace

TEST_CASE("hadamard: exact values for D = 1, 2, 4") {
  std::vector<float> one = {3.5f};
  hadamard_rotate(one.data(), 1);
  CHECK(one[0] == 3.5f);
  std::vector<float> two = {1.0f, 0.0f};
  hadamard_rotate(two.data(), 2);
  CHECK(two[0] == 0x1.6a09e6p-1f);  // fl(1/sqrt 2) = 0.70710677
  CHECK(two[1] == 0x1.6a09e6p-1f);
  // Strides 1 then 2: (1,2,3,4) -> (3,-1,7,-1) -> (10,-2,-4,0), times 1/2.
  std::vector<float> four = {1.0f, 2.0f, 3.0f, 4.0f};
  hadamard_rotate(four.data(), 4);
  CHECK(four == std::vector<float>{5.0f, -1.0f, -2.0f, 0.0f});
}

TEST_CASE("hadamard: the norm is 1/sqrt(D) rounded to nearest fp32") {
  for (int k = 0; k <= 24; ++k) {
    const int64_t d = int64_t{1} << k;
    CAPTURE(d);
    const double exact = 1.0 / std::sqrt(static_cast<double>(d));
    const float n = hadamard_norm(d);
    // Nearest: no fp32 neighbour is closer to the exact value.
    CHECK(std::fabs(n - exact) <= std::fabs(std::nextafter(n, 0.0f) - exact));
    CHECK(std::fabs(n - exact) <= std::fabs(std::nextafter(n, 2.0f) - exact));
  }
  CHECK(is_power_of_two(128));
  CHECK(!is_power_of_two(96));
  CHECK(!is_power_of_two(0));
}

TEST_CASE("hadamard: columns are orthonormal (unit vectors transform exactly to +-fl(1/sqrt D))") {
  for (int64_t d : {1, 2, 4, 8, 128, 256}) {
    CAPTURE(d);
    const double c = hadamard_norm(d);
    std::vector<std::vector<float>> cols;
    for (int64_t i = 0; i < d; ++i) {
      std::vector<float> e(d, 0.0f);
      e[i] = 1.0f;
      hadamard_rotate(e.data(), d);
      for (float v : e) REQUIRE(std::fabs(v) == static_cast<float>(c));  // butterflies of 0 and 1 are exact
      cols.push_back(e);
    }
    for (int64_t i = 0; i < d; i += std::max<int64_t>(1, d / 16))
      for (int64_t j = 0; j < d; ++j) {
        double dot = 0;  // exact in double: d terms of +-c^2
        for (int64_t r = 0; r < d; ++r) dot += static_cast<double>(cols[i][r]) * cols[j][r];
        if (i == j) REQUIRE(std::fabs(dot - 1.0) <= 2 * kU);  // d c^2, c within u of 1/sqrt(d)
        else REQUIRE(dot == 0.0);
      }
  }
}

// One rotation is k butterfly stages and one multiply: each stage's outputs carry one rounding
// (relative 2-norm error <= u per stage, and butterflies scale the 2-norm by exactly sqrt 2), the
// norm constant and the final multiply one each: ||fl(Hx) - Hx|| <= ((1+u)^(k+2) - 1) ||x||.
// Two rotations (round trip, or q and k separately): about 2 (k+2) u; we allow (2k+5) u.
TEST_CASE("hadamard: norm preservation, round trip H(Hx) = x and Q.K within derived bounds") {
  for (int64_t d : {1, 2, 4, 128, 256}) {
    CAPTURE(d);
    const int k = log2_of(d);
    for (uint32_t seed = 0; seed < 20; ++seed) {
      std::vector<float> x = test::random_normal(d, seed), y = test::random_normal(d, seed + 100, 3.0f);
      for (int64_t i = 0; i < d; i += 29) x[i] *= 40.0f;  // outlier channels
      std::vector<float> hx = x, hy = y;
      hadamard_rotate(hx.data(), d);
      hadamard_rotate(hy.data(), d);
      CHECK(std::fabs(norm2(hx) - norm2(x)) <= (k + 3) * kU * norm2(x));
      double qk = 0, hqk = 0;
      for (int64_t i = 0; i < d; ++i) qk += static_cast<double>(x[i]) * y[i], hqk += static_cast<double>(hx[i]) * hy[i];
      CHECK(std::fabs(hqk - qk) <= (2 * k + 5) * kU * norm2(x) * norm2(y));
      std::vector<float> back = hx;
      hadamard_rotate(back.data(), d);
      double err = 0;
      for (int64_t i = 0; i < d; ++i) err += (static_cast<double>(back[i]) - x[i]) * (static_cast<double>(back[i]) - x[i]);
      CHECK(std::sqrt(err) <= (2 * k + 5) * kU * norm2(x));
    }
  }
}

TEST_CASE("+had schemes: a head_dim that is not a power of two is an error, quantize stores the rotated tensor") {
  using test::message_of;
  CHECK(message_of<SchemeError>([] { check_scheme_fits(parse_scheme("int4-g32-asym+had"), 96); }) ==
        "int4-g32-asym+had: the Hadamard rotation (+had) needs a power-of-two head_dim, got 96");
  CHECK_NOTHROW(check_scheme_fits(parse_scheme("int4-head+had"), 8));
  // With a full-precision window over everything, dequantize returns exactly the rotated input.
  const KvShape shape{1, 2, 5, 16};
  const std::vector<float> x = test::random_normal(shape.numel(), 4);
  const std::vector<float> kept = dequantize(quantize(KvView::bnsh(x.data(), shape), parse_scheme("int8-head+had+w5"), "K"));
  for (int64_t r = 0; r < shape.rows(); ++r) {
    std::vector<float> row(x.begin() + r * 16, x.begin() + (r + 1) * 16);
    hadamard_rotate(row.data(), 16);
    CHECK(std::vector<float>(kept.begin() + r * 16, kept.begin() + (r + 1) * 16) == row);
  }
  // Rotated quantization equals quantizing the rotated tensor with the plain scheme, byte for byte.
  std::vector<float> rotated = x;
  for (int64_t r = 0; r < shape.rows(); ++r) hadamard_rotate(rotated.data() + r * 16, 16);
  const QuantizedKv a = quantize(KvView::bnsh(x.data(), shape), parse_scheme("int4-g8-asym+had"), "K");
  const QuantizedKv b = quantize(KvView::bnsh(rotated.data(), shape), parse_scheme("int4-g8-asym"), "K");
  CHECK(a.codes == b.codes);
  CHECK(a.scales == b.scales);
  CHECK(a.zeros == b.zeros);
}

TEST_CASE("golden: int8-head+had on one hand-computed row") {
  // (1, 2, 3, 4) rotates to (5, -1, -2, 0). amax 5: s = rd(5 / 127) = 1290 * 2^-15 = 0.03936767578125
  // (fp16), codes round(x / s): 127.008 -> 127, -25.40 -> -25 (0xe7), -50.80 -> -51 (0xcd), 0.
  const std::vector<float> x = {1.0f, 2.0f, 3.0f, 4.0f};
  const QuantizedKv q = quantize(KvView::bnsh(x.data(), {1, 1, 1, 4}), parse_scheme("int8-head+had"), "K");
  CHECK(q.scales == std::vector<float>{0.03936767578125f});
  CHECK(q.codes == std::vector<uint8_t>{0x7f, 0xe7, 0xcd, 0x00});
}

TEST_CASE("+had<N>: the rotation in blocks of N elements (llama.cpp rotates V in blocks of 64)") {
  const Scheme s = parse_scheme("q4_0+had64+w16");
  CHECK(s.hadamard);
  CHECK(s.hadamard_block == 64);
  CHECK(s.rotation_block(128) == 64);
  CHECK(parse_scheme("q4_0+had").rotation_block(128) == 128);
  CHECK(to_string(s) == "q4_0+had64+w16");
  CHECK(parse_scheme("int8-head+had64") != parse_scheme("int8-head+had"));  // the same only where D = 64
  using test::message_of;
  CHECK(message_of<SchemeError>([] { parse_scheme("q4_0+had48"); }).find("power of two >= 2, e.g. +had64") !=
        std::string::npos);
  CHECK(message_of<SchemeError>([] { parse_scheme("q4_0+had1"); }).find("power of two >= 2") != std::string::npos);
  CHECK(message_of<SchemeError>([] { parse_scheme("q4_0+had+had64"); }).find("repeated modifier '+had64'") !=
        std::string::npos);
  CHECK(message_of<SchemeError>([] { check_scheme_fits(parse_scheme("int8-head+had64"), 96); }) ==
        "int8-head+had64: the rotation block 64 does not divide head_dim 96");
  CHECK(message_of<SchemeError>([] { check_scheme_fits(parse_scheme("int8-head+had256"), 128); }) ==
        "int8-head+had256: the rotation block 256 does not divide head_dim 128");
  CHECK_NOTHROW(check_scheme_fits(parse_scheme("int8-head+had64"), 192));  // no power-of-two head_dim needed

  // Each block rotates on its own: the transform of a block is the whole-row transform of that block.
  const KvShape shape{1, 2, 5, 192};
  const std::vector<float> x = test::random_normal(shape.numel(), 7);
  std::vector<float> blocks = x, by_hand = x;
  hadamard_rotate(blocks.data(), 192, 64);
  for (int i = 0; i < 3; ++i) hadamard_rotate(by_hand.data() + 64 * i, 64);
  CHECK(std::equal(blocks.begin(), blocks.begin() + 192, by_hand.begin()));
  std::vector<double> back(blocks.begin(), blocks.begin() + 192);
  hadamard_rotate_back(back.data(), 192, 64);
  for (int d = 0; d < 192; ++d) CHECK(std::abs(back[d] - x[d]) < 1e-5);

  // Quantizing with +had64 equals quantizing the block-rotated tensor with the plain scheme, byte for byte.
  std::vector<float> rotated = x;
  for (int64_t r = 0; r < shape.rows(); ++r) hadamard_rotate(rotated.data() + r * 192, 192, 64);
  const QuantizedKv a = quantize(KvView::bnsh(x.data(), shape), parse_scheme("int4-g32-asym+had64"), "K");
  const QuantizedKv b = quantize(KvView::bnsh(rotated.data(), shape), parse_scheme("int4-g32-asym"), "K");
  CHECK(a.codes == b.codes);
  CHECK(a.scales == b.scales);
  CHECK(a.zeros == b.zeros);
}
