// The scalar codec: golden bytes for hand-computed groups, and properties over random and special
// values.
#include <doctest/doctest.h>

#include <cmath>
#include <algorithm>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "quant/codec.hpp"
#include "test_util.hpp"

using namespace kvq;

namespace {

struct Coded {
  GroupParams p;
  std::vector<int> q;
  std::vector<float> x_hat;
};

Coded code_group(const std::vector<float>& x, const Scheme& s) {
  GroupStats st;
  for (float v : x) st.add(v);
  Coded c{group_params(st, s), {}, {}};
  for (float v : x) {
    c.q.push_back(encode(v, c.p, s));
    c.x_hat.push_back(decode(c.q.back(), c.p, s));
  }
  return c;
}

}  // namespace

TEST_CASE("golden: int4 packing of the codes 0..15") {
  // Asymmetric codes 0..15 in element order: byte i = code(2i) | code(2i+1) << 4.
  const uint8_t expected_asym[8] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe};
  for (int i = 0; i < 8; ++i) CHECK(pack_nibbles(2 * i, 2 * i + 1) == expected_asym[i]);
  for (int c = 0; c < 16; ++c) CHECK(nibble_to_code(static_cast<uint8_t>(c), true) == c);
  // Symmetric codes -8..7 as two's-complement nibbles (the codec itself only emits -7..7).
  for (int c = -8; c <= 7; ++c) {
    CAPTURE(c);
    CHECK(code_to_nibble(c) == static_cast<uint8_t>(c & 0xf));
    CHECK(nibble_to_code(code_to_nibble(c), false) == c);
  }
  CHECK(pack_nibbles(-1, -7) == 0x9f);
  CHECK(pack_nibbles(7, -4) == 0xc7);
}

TEST_CASE("golden: codes and scales of hand-computed groups") {
  SUBCASE("int8 symmetric: amax 127 gives scale 1; 0.5 ties to 0") {
    const Coded c = code_group({1.0f, -2.0f, 0.5f, 127.0f, 2.5f, -3.5f}, parse_scheme("int8-head"));
    CHECK(c.p.scale == 1.0f);
    CHECK(c.q == std::vector<int>{1, -2, 0, 127, 2, -4});
    CHECK(code_to_byte(c.q[1]) == 0xfe);
  }
  SUBCASE("int8 symmetric: amax 4 -> scale rd(4/127) = 0.031494140625") {
    const Coded c = code_group({1.0f, 2.0f, 3.0f, -4.0f}, parse_scheme("int8-head"));
    CHECK(c.p.scale == 0.031494140625f);  // fp16 0x2808
    CHECK(fp32_to_fp16_bits(c.p.scale) == 0x2808);
    CHECK(c.q == std::vector<int>{32, 64, 95, -127});
  }
  SUBCASE("int4 symmetric: amax 7 gives scale 1, ties to even") {
    const Coded c = code_group({7.0f, -3.5f, 1.5f, 2.5f, -7.0f, 0.49f}, parse_scheme("int4-g2"));
    CHECK(c.p.scale == 1.0f);
    CHECK(c.q == std::vector<int>{7, -4, 2, 2, -7, 0});
    CHECK(pack_nibbles(c.q[0], c.q[1]) == 0xc7);
    CHECK(pack_nibbles(c.q[4], c.q[5]) == 0x09);
  }
  SUBCASE("int4 asymmetric: zero point -1, scale 0.5") {
    const Coded c = code_group({-1.0f, 0.0f, 6.5f, 2.75f}, parse_scheme("int4-head-asym"));
    CHECK(c.p.zero == -1.0f);
    CHECK(c.p.scale == 0.5f);
    CHECK(c.q == std::vector<int>{0, 2, 15, 8});  // (2.75 + 1) / 0.5 = 7.5 ties to 8
    CHECK(c.x_hat == std::vector<float>{-1.0f, 0.0f, 6.5f, 3.0f});
  }
  SUBCASE("int8 asymmetric: scale rd(2.55/255) = 0.01000213623046875") {
    const Coded c = code_group({-1.0f, 0.0f, 1.55f}, parse_scheme("int8-token-asym"));
    CHECK(fp32_to_fp16_bits(c.p.scale) == 0x211f);
    CHECK(c.p.scale == 0.01000213623046875f);
    CHECK(c.q == std::vector<int>{0, 100, 255});
  }
  SUBCASE("fp32 scales are not rounded to fp16") {
    const Coded c = code_group({1.0f, 2.0f, 3.0f, -4.0f}, parse_scheme("int8-head-fp32"));
    CHECK(c.p.scale == 4.0f / 127.0f);
    CHECK(c.q == std::vector<int>{32, 64, 95, -127});
  }
}

TEST_CASE("special values") {
  SUBCASE("all-zero and signed-zero groups: scale 0, codes 0, exact round trip") {
    for (const char* name : {"int8-head", "int4-head", "int8-head-asym", "int4-head-asym"}) {
      CAPTURE(name);
      const Coded c = code_group({0.0f, -0.0f, 0.0f}, parse_scheme(name));
      CHECK(c.p.scale == 0.0f);
      for (size_t i = 0; i < c.q.size(); ++i) {
        CHECK(c.q[i] == 0);
        CHECK(c.x_hat[i] == 0.0f);
      }
    }
  }
  SUBCASE("asymmetric constant groups round-trip exactly when the value fits the scale dtype") {
    for (float v : {3.69921875f, -1000.0f, 65504.0f, 5.9604644775390625e-08f /*2^-24, fp16 subnormal*/}) {
      CAPTURE(v);
      for (const char* name : {"int8-g4-asym", "int4-g4-asym", "int4-g4-asym-fp32"}) {
        const Coded c = code_group({v, v, v, v}, parse_scheme(name));
        CHECK(c.p.scale == 0.0f);
        CHECK(c.q == std::vector<int>{0, 0, 0, 0});
        CHECK(c.x_hat == std::vector<float>{v, v, v, v});
      }
    }
    const Coded c = code_group({3.7f, 3.7f}, parse_scheme("int4-g2-asym-fp32"));  // any float with fp32
    CHECK(c.x_hat == std::vector<float>{3.7f, 3.7f});
  }
  SUBCASE("symmetric constant groups: no NaN, codes at +-Qmax") {
    const Coded c = code_group({-3.7f, -3.7f}, parse_scheme("int8-head"));
    CHECK(c.q == std::vector<int>{-127, -127});
    CHECK(std::abs(c.x_hat[0] + 3.7f) <= c.p.scale / 2);
  }
  SUBCASE("65504, the largest fp16") {
    const Coded c = code_group({65504.0f, -1.0f}, parse_scheme("int8-head"));
    CHECK(c.p.scale == 516.0f);  // rd(65504/127 = 515.78)
    CHECK(c.q[0] == 127);
    const Coded a = code_group({65504.0f, -65504.0f}, parse_scheme("int4-head-asym"));
    CHECK(a.p.zero == -65504.0f);
    CHECK(a.q == std::vector<int>{15, 0});
  }
  SUBCASE("tiny amax: scale clamped to the smallest normal") {
    const Coded c = code_group({1e-10f, -5e-11f}, parse_scheme("int8-head"));
    CHECK(c.p.scale == kFp16MinNormal);
    CHECK(c.q == std::vector<int>{0, 0});
    const Coded f = code_group({1e-40f}, parse_scheme("int8-head-fp32"));
    CHECK(f.p.scale == 1.17549435e-38f);
    const Coded a = code_group({1e-9f, 2e-9f}, parse_scheme("int4-head-asym"));
    CHECK(a.p.scale == kFp16MinNormal);
    CHECK(a.q == std::vector<int>{0, 0});
  }
  SUBCASE("scales and zero points beyond fp16 overflow") {
    CHECK(code_group({1e6f}, parse_scheme("int4-head")).p.overflow);   // 1e6 / 7 > 65504
    CHECK(!code_group({4e5f}, parse_scheme("int4-head")).p.overflow);  // 4e5 / 7 fits
    CHECK(code_group({-1e5f, 0.0f}, parse_scheme("int8-head-asym")).p.overflow);  // zero point -1e5
    CHECK(code_group({-3e38f, 3e38f}, parse_scheme("int8-head-asym-fp32")).p.overflow);  // range overflows fp32
    CHECK(!code_group({1e6f}, parse_scheme("int4-head-fp32")).p.overflow);
  }
  SUBCASE("codes are clamped, never wrapped") {
    const Scheme s = parse_scheme("int4-head");
    CHECK(encode_symmetric(1e30f, 1.0f, 1.0f, s.qmax()) == 7);
    CHECK(encode_symmetric(-1e30f, 1.0f, 1.0f, s.qmax()) == -7);
    CHECK(encode_asymmetric(-5.0f, 1.0f, 1.0f, 0.0f, 15) == 0);
    CHECK(encode_asymmetric(300.0f, 1.0f, 1.0f, 0.0f, 15) == 15);
    CHECK(encode_asymmetric(1e30f, 1.0f, 1.0f, 0.0f, 255) == 255);
  }
}

TEST_CASE("group statistics do not depend on the order of the elements, signed zeros included") {
  const std::vector<float> values = {0.0f, -0.0f, 3.0f, -0.0f, 0.0f, 1.5f};
  std::vector<size_t> order = {0, 1, 2, 3, 4, 5};
  GroupStats first;
  for (size_t i : order) first.add(values[i]);
  CHECK(float_bits(first.lo()) == float_bits(-0.0f));  // -0 counts as below +0
  CHECK(first.hi() == 3.0f);
  do {
    GroupStats st, left, right;
    for (size_t i : order) st.add(values[i]);
    for (size_t k = 0; k < order.size(); ++k) (k < 3 ? left : right).add(values[order[k]]);
    right.merge(left);  // a reduction tree's merge gives the same too
    REQUIRE(float_bits(st.lo()) == float_bits(first.lo()));
    REQUIRE(float_bits(st.hi()) == float_bits(first.hi()));
    REQUIRE(float_bits(right.lo()) == float_bits(first.lo()));
    REQUIRE(float_bits(right.hi()) == float_bits(first.hi()));
  } while (std::next_permutation(order.begin(), order.end()));
  GroupStats zeros;  // all zeros, +0 first: hi is +0, lo is -0, the zero point -0
  for (float z : {0.0f, -0.0f}) zeros.add(z);
  CHECK(float_bits(zeros.hi()) == float_bits(0.0f));
  CHECK(float_bits(asymmetric_params(zeros.lo(), zeros.hi(), parse_scheme("int4-head-asym")).zero) == float_bits(-0.0f));
}

TEST_CASE("properties over random groups: codes in range and bounded error") {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> size_dist(1, 64);
  std::uniform_real_distribution<float> log_mag(-20.0f, 15.0f);
  const char* names[] = {"int8-head", "int4-head", "int8-head-asym", "int4-head-asym",
                         "int8-head-fp32", "int4-head-fp32", "int8-head-asym-fp32", "int4-head-asym-fp32"};
  for (const char* name : names) {
    CAPTURE(name);
    const Scheme s = parse_scheme(name);
    for (int trial = 0; trial < 3000; ++trial) {
      const float magnitude = std::exp2(log_mag(rng));
      std::vector<float> x = test::random_normal(size_dist(rng), rng(), magnitude);
      if (trial % 7 == 0) x.push_back(-x[0]);  // exact opposite values
      const Coded c = code_group(x, s);
      if (c.p.overflow) continue;
      float lo = x[0];
      for (float v : x) lo = std::min(lo, v);
      for (size_t i = 0; i < x.size(); ++i) {
        const double xi = x[i], err = std::abs(xi - c.x_hat[i]), sc = c.p.scale;
        if (s.asymmetric) {
          REQUIRE(c.q[i] >= 0);
          REQUIRE(c.q[i] <= s.levels());
          // Error: half a step, plus how far the rounded zero point moved from min x, plus fp32
          // rounding of the division and the fma (derived: each at most 2^-24 relative).
          REQUIRE(err <= sc / 2 + std::abs(double(lo) - c.p.zero) + 0x1p-22 * (std::abs(xi) + sc + std::abs(c.p.zero)));
        } else {
          REQUIRE(std::abs(c.q[i]) <= s.qmax());
          // |q - x/s| <= 1/2 + |x/s| 2^-24 (fp32 division) and q*s adds |q s| 2^-24 (fp32 multiply;
          // exact for fp16 scales): err <= s/2 + 2^-23 (|x| + s).
          REQUIRE(err <= sc / 2 + 0x1p-23 * (std::abs(xi) + sc));
        }
      }
    }
  }
}

TEST_CASE("divide_and_round equals nearbyint of the IEEE quotient, ties and extremes included") {
  std::mt19937 rng(21);
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_int_distribution<int> code(-300, 300);
  int64_t checked = 0;
  for (int i = 0; i < 2'000'000; ++i) {
    // Scales as the codec makes them (fp16 values) and some fp32 ones; values on, near and away
    // from the half-steps k*s + s/2, where the reciprocal shortcut must give way to the division.
    const float s = i % 3 ? round_to_fp16(std::ldexp(1.0f + (bits(rng) % 1024) / 1024.0f, int(bits(rng) % 40) - 24))
                          : bits_float((bits(rng) % 0x7e000000u) + 0x00800000u);
    const float inv = ieee_div(1.0f, s);
    const float tie = (static_cast<float>(code(rng)) + 0.5f) * s;
    for (float v : {tie, std::nextafter(tie, INFINITY), std::nextafter(tie, -INFINITY),
                    static_cast<float>(code(rng)) * s, bits_float(bits(rng))}) {
      if (!is_finite_float(v)) continue;
      REQUIRE(float_bits(divide_and_round(v, s, inv)) == float_bits(round_half_even(ieee_div(v, s))));
      ++checked;
    }
  }
  CHECK(checked > 9'000'000);
}

namespace {
// DESIGN.md's integer code as written: the IEEE quotient rounded half to even, clamped; scale 0: 0.
int literal_code(float x, const GroupParams& p, const Scheme& s) {
  if (p.scale == 0.0f) return 0;
  const float r = round_half_even(ieee_div(s.asymmetric ? x - p.zero : x, p.scale));
  return s.asymmetric ? clamp_code(r, 0, s.levels()) : clamp_code(r, -s.qmax(), s.qmax());
}
}  // namespace

namespace {
// IntegerCoder's code of v: (biased code, sure).
template <bool kAsym>
std::pair<int, bool> coder_code(const IntegerCoder& c, float v) {
  bool sure = true;
  const float m = c.clamp ? c.biased_code<kAsym, true>(v, sure) : c.biased_code<kAsym, false>(v, sure);
  return {unbiased_code(m), sure};
}
std::pair<int, bool> coder_code(const IntegerCoder& c, float v, bool asym) {
  return asym ? coder_code<true>(c, v) : coder_code<false>(c, v);
}
}  // namespace

TEST_CASE("IntegerCoder's code is encode()'s wherever it says so, clamped or not, and says so mostly") {
  std::mt19937 rng(22);
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_int_distribution<int> code(-300, 300);
  for (const char* name : {"int8-head", "int8-head-asym", "int4-g32", "int4-g32-asym", "int8-head-fp32",
                           "int4-g32-asym-fp32"}) {
    CAPTURE(name);
    const Scheme scheme = parse_scheme(name);
    int64_t sure = 0, total = 0, clamped_groups = 0;
    for (int i = 0; i < 200'000; ++i) {
      GroupStats st;
      float x[8];
      const float s = round_to_fp16(std::ldexp(1.0f + (bits(rng) % 1024) / 1024.0f, int(bits(rng) % 30) - 20));
      for (float& v : x) {  // on, next to and between the half-steps of a scale like s
        const float tie = (static_cast<float>(code(rng)) + 0.5f) * s;
        const int kind = static_cast<int>(bits(rng) % 4);
        v = kind == 0 ? tie : kind == 1 ? std::nextafter(tie, INFINITY) : kind == 2 ? static_cast<float>(code(rng)) * s
                                                                                     : tie * 0.37f;
        st.add(v);
      }
      const GroupParams p = i % 50 == 0 ? GroupParams{} : group_params(st, scheme);  // a zero scale now and then
      // ... and on, next to and between the half-steps of the group's own scale (its ties), some of
      // them outside the group: the coder is then told a wider range and clamps
      const float zero = scheme.asymmetric ? p.zero : 0.0f;
      const float k = static_cast<float>(code(rng) & 0xff) - (scheme.asymmetric ? 0.0f : 128.0f);
      const float own = zero + (k + 0.5f) * p.scale;
      const float values[] = {x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], own, std::nextafter(own, INFINITY),
                              std::nextafter(own, -INFINITY), zero + k * p.scale};
      const bool inside = i % 2 == 0;  // the group's own range, or one that holds every value tested
      const float lo = inside ? st.lo() : *std::min_element(std::begin(values), std::end(values));
      const float hi = inside ? st.hi() : *std::max_element(std::begin(values), std::end(values));
      const IntegerCoder coder = integer_coder(p, scheme, lo, hi);
      clamped_groups += coder.clamp;
      for (float v : values) {
        if (inside && (v < lo || v > hi)) continue;
        REQUIRE(encode_integer_exact(v, p, scheme) == encode(v, p, scheme));
        const auto [q, is_sure] = coder_code(coder, v, scheme.asymmetric);
        if (is_sure) {
          REQUIRE(q == literal_code(v, p, scheme));
          REQUIRE(q == encode(v, p, scheme));
          ++sure;
        }
        ++total;
      }
    }
    CHECK(sure > total / 2);
    CHECK(clamped_groups > 500);  // both forms were tested
  }
}

TEST_CASE("IntegerCoder: saturating scales and huge quotients are clamped right, and random values are sure") {
  std::mt19937 rng(23);
  std::uniform_int_distribution<uint32_t> bits;
  for (const char* name : {"int8-tensor", "int8-tensor-asym", "int4-tensor", "int4-tensor-asym"}) {
    CAPTURE(name);
    const Scheme scheme = parse_scheme(name);
    int64_t sure = 0, total = 0;
    for (int i = 0; i < 100'000; ++i) {
      // a calibrated scale far below the values' range: most codes saturate, some quotients pass 2^22
      const GroupParams p = given_scale_params(std::ldexp(1.0f + (bits(rng) % 1024) / 1024.0f, -12), scheme);
      const IntegerCoder coder = integer_coder(p, scheme, -3e30f, 3e30f);
      REQUIRE(coder.clamp);
      REQUIRE(integer_coder(p, scheme, -INFINITY, INFINITY).clamp);  // unknown bounds (tensor2pass, given scale)
      const float v = std::ldexp(static_cast<float>(static_cast<int32_t>(bits(rng))) / 2147483648.0f,
                                 static_cast<int>(bits(rng) % 110) - 10);
      const auto [q, is_sure] = coder_code(coder, v, scheme.asymmetric);
      const float quotient = std::fabs(ieee_div(scheme.asymmetric ? v - p.zero : v, p.scale));
      if (is_sure || quotient > 256.0f) REQUIRE(q == literal_code(v, p, scheme));
      sure += is_sure;
      ++total;
    }
    CHECK(sure > total - total / 500);
  }
  // Values spread over a computed group's range: nearly all are sure (the fallback is rare).
  for (const char* name : {"int8-head", "int4-g32-asym"}) {
    CAPTURE(name);
    const Scheme scheme = parse_scheme(name);
    int64_t sure = 0, total = 0;
    for (int i = 0; i < 2'000; ++i) {
      std::vector<float> x(128);
      GroupStats st;
      for (float& v : x)
        st.add(v = std::ldexp(static_cast<float>(static_cast<int32_t>(bits(rng))) / 2147483648.0f, i % 20 - 10));
      const GroupParams p = group_params(st, scheme);
      const IntegerCoder coder = integer_coder(p, scheme, st.lo(), st.hi());
      for (float v : x) {
        const auto [q, is_sure] = coder_code(coder, v, scheme.asymmetric);
        if (is_sure) REQUIRE(q == literal_code(v, p, scheme));
        sure += is_sure;
        ++total;
      }
    }
    CHECK(sure > total - total / 500);
  }
}

namespace {
// IntegerCoder's exact_code of v: (biased code, sure).
template <bool kAsym>
std::pair<int, bool> exact_code(const IntegerCoder& c, float v) {
  float closest = INFINITY;
  const float m = c.clamp ? c.exact_code<kAsym, true>(v, closest) : c.exact_code<kAsym, false>(v, closest);
  return {unbiased_code(m), c.sure(closest)};
}
}  // namespace

TEST_CASE("IntegerCoder's exact_code: every code on and next to a half-step is the division's, sure for scales of <= 15 bits") {
  std::mt19937 rng(25);
  std::uniform_int_distribution<uint32_t> bits;
  for (const std::string name : {"int8-head", "int8-head-asym", "int4-g32", "int4-g32-asym", "int8-head-fp32",
                                 "int4-g32-asym-fp32"}) {
    CAPTURE(name);
    const Scheme scheme = parse_scheme(name);
    const bool fp32 = scheme.scale_dtype == ScaleDtype::kFp32;
    int64_t total = 0, sure = 0, ties = 0, rounded_onto_tie = 0, left_near_tie = 0;
    for (int i = 0; i < 20'000; ++i) {
      // scales of few bits (exact ties in bf16 data) and, as fp32, of many; some at the coder's limits
      const uint32_t mantissa = fp32 ? bits(rng) & 0x7fffffu : (bits(rng) & 0x3ffu) << 13;
      const int exponent = i % 97 == 0 ? -101 + int(bits(rng) % 4) : int(bits(rng) % 40) - 25;
      const float s = round_to_scale_dtype(
          std::ldexp(bits_float(0x3f800000u | (mantissa >> (i % 3 == 0 ? bits(rng) % 24 : 0))), exponent),
          scheme.scale_dtype);
      if (s == 0.0f) continue;
      const int top = scheme.asymmetric ? scheme.levels() : scheme.qmax();
      GroupParams p;
      p.scale = s, p.inv_scale = ieee_div(1.0f, s);
      const float offset = static_cast<float>(static_cast<int32_t>(bits(rng))) * 0x1p-31f * std::min(s * 40.0f, 6e4f);
      p.zero = scheme.asymmetric ? round_to_scale_dtype(offset, scheme.scale_dtype) : 0.0f;
      const bool wide = i % 2 == 0;  // a coder told a wider range clamps
      const float lo = scheme.asymmetric ? p.zero : -s * static_cast<float>(top);
      const float hi = p.zero + s * static_cast<float>(top);
      const IntegerCoder coder = integer_coder(p, scheme, wide ? lo - 4.0f * s : lo, wide ? hi + 4.0f * s : hi);
      std::uniform_int_distribution<int> code(scheme.asymmetric ? -2 : -top - 2, top + 1);
      const int k = i % 5 == 0 ? (scheme.asymmetric ? 0 : -1 + int(bits(rng) % 2)) : code(rng);  // t = -+1/2 too
      float v = (static_cast<float>(k) + 0.5f) * s;  // on the half-step where s has few bits, else next to it
      const int step = static_cast<int>(bits(rng) % 81) - 40;
      for (int j = 0; j < std::abs(step); ++j) v = std::nextafter(v, step < 0 ? -INFINITY : INFINITY);
      const float x = scheme.asymmetric ? v + p.zero : v;  // v = fl(x - zero) is what the codec divides
      if (!wide && (x < lo || x > hi)) continue;  // the coder's premise: the group's values lie in [lo, hi]
      const auto [q, is_sure] = scheme.asymmetric ? exact_code<true>(coder, x) : exact_code<false>(coder, x);
      const float quotient = ieee_div(scheme.asymmetric ? x - p.zero : x, s);
      const bool on_tie = quotient == std::floor(quotient) + 0.5f;
      const bool exactly = on_tie && std::fma(-quotient, s, scheme.asymmetric ? x - p.zero : x) == 0.0f;
      ++total;
      if (!is_sure) {
        CHECK((fp32 || !coder.exact));  // fp16 scales in the coder's range are always sure
        left_near_tie += on_tie && !exactly;
        continue;
      }
      ++sure;
      ties += exactly;
      rounded_onto_tie += on_tie && !exactly;
      REQUIRE(q == literal_code(x, p, scheme));
    }
    if (fp32) {  // fl(v / s) rounded onto a half-step from off it: left to the division, never coded
      CHECK(rounded_onto_tie == 0);
      CHECK(left_near_tie > 100);
    } else {  // only exact ties round onto a half-step, and every code is sure
      CHECK(rounded_onto_tie == 0);
      CHECK(sure > total - total / 50);
      CHECK(ties > 100);  // exactly on a half-step: the division rounds half to even
    }
  }
}

TEST_CASE("IntegerCoder's short_scale names the scales of <= 4 significant bits, whose half-steps bf16 values hit") {
  const Scheme scheme = parse_scheme("int8-head");
  int shorts = 0;
  for (uint32_t h = 0x0400; h < 0x7c00; ++h) {  // every positive normal fp16 scale
    const float s = fp16_bits_to_fp32(static_cast<uint16_t>(h));
    int significant = 11;
    for (uint32_t m = h & 0x3ffu; significant > 1 && (m & 1u) == 0; m >>= 1) --significant;
    GroupParams p;
    p.scale = s, p.inv_scale = ieee_div(1.0f, s);
    const IntegerCoder coder = integer_coder(p, scheme, -127.0f * s, 127.0f * s);
    CAPTURE(s);
    REQUIRE(coder.short_scale == (significant <= 4));
    shorts += coder.short_scale;
    // a short scale's half-steps 1/2 .. 15/2 are bf16 values (<= 8 significant bits): bf16 input hits them
    if (coder.short_scale)
      for (int k = 0; k < 8; ++k) REQUIRE(round_to_bf16((k + 0.5f) * s) == (k + 0.5f) * s);
  }
  CHECK(shorts == 30 * 8);  // 30 exponents, 8 mantissas of <= 3 stored bits each
}

TEST_CASE("packing IntegerCoder's biased codes gives the codec's bytes and nibbles") {
  std::mt19937 rng(24);
  for (int i = 0; i < 100'000; ++i) {
    int q[8];
    uint32_t m[8];
    for (int e = 0; e < 8; ++e) {
      q[e] = static_cast<int>(rng() % 256) - 128;
      m[e] = float_bits(kRoundingBias + static_cast<float>(q[e]));
      REQUIRE(unbiased_code(bits_float(m[e])) == q[e]);
    }
    const uint32_t bytes = pack_low_bytes(m[0], m[1], m[2], m[3]);
    for (int e = 0; e < 4; ++e) REQUIRE(uint8_t(bytes >> (8 * e)) == code_to_byte(q[e]));
    const uint32_t nibbles = pack_low_nibbles(m);
    for (int b = 0; b < 4; ++b) REQUIRE(uint8_t(nibbles >> (8 * b)) == pack_nibbles(q[2 * b], q[2 * b + 1]));
  }
}

TEST_CASE("group statistics expose any non-finite element") {
  for (bool asym : {false, true}) {
    CAPTURE(asym);
    GroupStats ok;
    for (float x : {1.0f, -3.0f, 65504.0f, -0.0f}) ok.add(x);
    CHECK(ok.all_finite(asym));
    for (float bad : {NAN, -NAN, INFINITY, -INFINITY}) {
      CAPTURE(bad);
      GroupStats st = ok;
      st.add(bad);
      st.add(2.0f);  // a later finite value does not hide it
      if (asym && bad == INFINITY) CHECK(!st.all_finite(true));
      CHECK(!st.all_finite(asym));
      GroupStats merged;
      merged.merge(st);
      CHECK(!merged.all_finite(asym));
    }
  }
}

TEST_CASE("non-finite values are detected by the codec's finiteness test") {
  CHECK(!is_finite_float(NAN));
  CHECK(!is_finite_float(INFINITY));
  CHECK(!is_finite_float(-INFINITY));
  CHECK(is_finite_float(3.4028235e38f));
  CHECK(is_finite_float(-0.0f));
}
