// FP8 e4m3 / e5m2: the software conversion against a brute-force nearest-value search, every code,
// ties, saturation, subnormals, hand-computed groups of each FP8 scheme, and Fp8Coder (two multiplies)
// against the division.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "quant/quantize.hpp"
#include "test_util.hpp"

using namespace kvq;

namespace {

bool is_nan_code(uint8_t c, const Fp8Format& f) {
  return f.mantissa_bits == 3 ? (c & 0x7f) == 0x7f : (c & 0x7c) == 0x7c;  // e5m2: inf and NaN
}

// Independent definition: the finite code nearest to x (ties: the even code, i.e. even mantissa),
// saturating; by search over all codes in double.
uint8_t nearest_code(float x, const Fp8Format& f) {
  const double v = x;
  uint8_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 128; ++c) {
    if (is_nan_code(static_cast<uint8_t>(c), f)) continue;
    const double err = std::fabs(std::fabs(v) - fp8_bits_to_fp32(static_cast<uint8_t>(c), f));
    if (err < best_err || (err == best_err && c % 2 == 0)) best = static_cast<uint8_t>(c), best_err = err;
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

const Fp8Format kFormats[] = {fp8_e4m3(), fp8_e5m2()};

}  // namespace

TEST_CASE("fp8: every finite code round-trips through decode and encode") {
  for (const Fp8Format& f : kFormats) {
    CAPTURE(f.mantissa_bits);
    int finite = 0;
    for (int c = 0; c < 256; ++c) {
      const uint8_t code = static_cast<uint8_t>(c);
      const float x = fp8_bits_to_fp32(code, f);
      if (is_nan_code(code, f)) {
        CHECK((std::isnan(x) || std::isinf(x)));
        continue;
      }
      ++finite;
      CAPTURE(c);
      CHECK(std::isfinite(x));
      CHECK(fp32_to_fp8_bits(x, f) == code);
      CHECK(nearest_code(x, f) == code);
    }
    CHECK(finite == (f.mantissa_bits == 3 ? 254 : 248));
  }
  CHECK(fp8_bits_to_fp32(0x7e, fp8_e4m3()) == 448.0f);
  CHECK(fp8_bits_to_fp32(0x7b, fp8_e5m2()) == 57344.0f);
  CHECK(fp8_bits_to_fp32(0x01, fp8_e4m3()) == std::ldexp(1.0f, -9));   // smallest subnormal
  CHECK(fp8_bits_to_fp32(0x08, fp8_e4m3()) == std::ldexp(1.0f, -6));   // smallest normal
  CHECK(fp8_bits_to_fp32(0x01, fp8_e5m2()) == std::ldexp(1.0f, -16));
  CHECK(fp8_bits_to_fp32(0x04, fp8_e5m2()) == std::ldexp(1.0f, -14));
  CHECK(std::isinf(fp8_bits_to_fp32(0xfc, fp8_e5m2())));
  CHECK(std::isnan(fp8_bits_to_fp32(0x7f, fp8_e4m3())));
}

TEST_CASE("fp8: midpoints between neighbouring codes round to the even code, their neighbours to the nearer") {
  for (const Fp8Format& f : kFormats) {
    const uint8_t max_code = static_cast<uint8_t>(f.max_bits);
    for (uint8_t c = 0; c < max_code; ++c) {
      CAPTURE(f.mantissa_bits);
      CAPTURE(int(c));
      const float lo = fp8_bits_to_fp32(c, f), hi = fp8_bits_to_fp32(static_cast<uint8_t>(c + 1), f);
      const float mid = (lo + hi) / 2;  // exact: fp8 values have few significant bits
      REQUIRE(static_cast<double>(mid) == (static_cast<double>(lo) + hi) / 2);
      const uint8_t even = c % 2 == 0 ? c : static_cast<uint8_t>(c + 1);
      CHECK(fp32_to_fp8_bits(mid, f) == even);
      CHECK(fp32_to_fp8_bits(-mid, f) == (even | 0x80));
      CHECK(fp32_to_fp8_bits(std::nextafter(mid, 0.0f), f) == c);
      CHECK(fp32_to_fp8_bits(std::nextafter(mid, 1e30f), f) == c + 1);
    }
  }
}

TEST_CASE("fp8: saturation at +-448 and +-57344, NaN stays NaN, zeros keep their sign") {
  const Fp8Format e4 = fp8_e4m3(), e5 = fp8_e5m2();
  for (float x : {448.0f, 449.0f, 464.0f, 479.0f, 480.0f, 1e6f, 3.4e38f, INFINITY}) {
    CAPTURE(x);
    CHECK(fp32_to_fp8_bits(x, e4) == 0x7e);
    CHECK(fp32_to_fp8_bits(-x, e4) == 0xfe);
  }
  for (float x : {57344.0f, 61439.0f, 61440.0f, 65536.0f, 1e10f, INFINITY}) {
    CAPTURE(x);
    CHECK(fp32_to_fp8_bits(x, e5) == 0x7b);
    CHECK(fp32_to_fp8_bits(-x, e5) == 0xfb);
  }
  CHECK(fp32_to_fp8_bits(432.0f, e4) == 0x7e);  // tie between 416 (0x7d) and 448 (0x7e): even 0x7e
  CHECK(fp32_to_fp8_bits(NAN, e4) == 0x7f);
  CHECK(fp32_to_fp8_bits(NAN, e5) == 0x7f);
  CHECK(fp32_to_fp8_bits(0.0f, e4) == 0x00);
  CHECK(fp32_to_fp8_bits(-0.0f, e4) == 0x80);
}

TEST_CASE("fp8: subnormals, the underflow tie and fp32 subnormal inputs") {
  const Fp8Format e4 = fp8_e4m3(), e5 = fp8_e5m2();
  const float s4 = std::ldexp(1.0f, -9), s5 = std::ldexp(1.0f, -16);  // smallest subnormals
  CHECK(fp32_to_fp8_bits(0.5f * s4, e4) == 0x00);   // tie with 0: even
  CHECK(fp32_to_fp8_bits(std::nextafter(0.5f * s4, 1.0f), e4) == 0x01);
  CHECK(fp32_to_fp8_bits(1.5f * s4, e4) == 0x02);   // tie between 1 and 2: even
  CHECK(fp32_to_fp8_bits(2.5f * s4, e4) == 0x02);
  CHECK(fp32_to_fp8_bits(7.5f * s4, e4) == 0x08);   // rounds up into the smallest normal
  CHECK(fp32_to_fp8_bits(-3.0f * s5, e5) == 0x83);
  CHECK(fp32_to_fp8_bits(3.5f * s5, e5) == 0x04);   // tie between 3 and 4 (the smallest normal): even
  CHECK(fp32_to_fp8_bits(1e-45f, e4) == 0x00);      // fp32 subnormal
  CHECK(fp32_to_fp8_bits(-1e-45f, e5) == 0x80);
}

TEST_CASE("fp8: the conversion equals the brute-force nearest code over random and dense fp32 inputs") {
  std::mt19937 rng(7);
  for (const Fp8Format& f : kFormats) {
    CAPTURE(f.mantissa_bits);
    int bad = 0;
    for (int i = 0; i < 200000; ++i) {
      // Exponents around the fp8 range (2^-20 .. 2^20) with random mantissa and sign.
      const uint32_t exp = 127 - 20 + rng() % 41, bits = (rng() & 0x807fffffu) | (exp << 23);
      const float x = bits_float(bits);
      if (fp32_to_fp8_bits(x, f) != nearest_code(x, f) && ++bad < 5) FAIL_CHECK("x = " << x);
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("golden: fp8-e4m3-head, a hand-computed group") {
  // amax 7: s = rd(7 / 448) = 2^-6, so x / s = 64 x:
  //   7 -> 448 = 1.75*2^8 -> 0x7e;  -3.5 -> -224 = -1.75*2^7 -> 0xf6;  1 -> 64 = 2^6 -> 0x68;
  //   0.1f -> 6.4000001 -> 1.625*2^2 = 6.5 (mantissa 4.8/8 -> 5/8) -> 0x4d;  -0.03125 -> -2 -> 0xc0;
  //   0 -> 0x00;  2^-10 -> 2^-4 -> exponent 3 -> 0x18;  5.3f -> 339.2 -> 1.375*2^8 = 352 -> 0x7b.
  const std::vector<float> x = {7.0f, -3.5f, 1.0f, 0.1f, -0.03125f, 0.0f, 0.0009765625f, 5.3f};
  const QuantizedKv q = quantize(KvView::bnsh(x.data(), {1, 1, 1, 8}), parse_scheme("fp8-e4m3-head"), "K");
  CHECK(q.scales == std::vector<float>{0.015625f});
  CHECK(q.codes == std::vector<uint8_t>{0x7e, 0xf6, 0x68, 0x4d, 0xc0, 0x00, 0x18, 0x7b});
  const std::vector<float> want = {7.0f, -3.5f, 1.0f, 0.1015625f, -0.03125f, 0.0f, 0.0009765625f, 5.5f};
  CHECK(dequantize(q) == want);
}

TEST_CASE("golden: fp8-e5m2-head, a hand-computed group with subnormal codes") {
  // amax 56: s = rd(56 / 57344) = 2^-10, so x / s = 1024 x:
  //   56 -> 57344 -> 0x7b;  -1 -> -2^10 -> exponent 25 -> 0xe4;  0.01f -> 10.24 -> 1.25*2^3 = 10 -> 0x49;
  //   1.5*2^-25 -> 3*2^-16 -> subnormal 3 -> 0x03;  2.5*2^-26 -> 2.5*2^-16 -> tie, even 2 -> 0x02;
  //   2^-27 -> 0.5*2^-16 -> tie with 0 -> 0x00;  -0.0 -> 0x80;  0.75 -> 768 = 1.5*2^9 -> 0x62.
  const std::vector<float> x = {56.0f, -1.0f, 0.01f, std::ldexp(1.5f, -25), std::ldexp(2.5f, -26),
                                std::ldexp(1.0f, -27), -0.0f, 0.75f};
  const QuantizedKv q = quantize(KvView::bnsh(x.data(), {1, 1, 1, 8}), parse_scheme("fp8-e5m2-head"), "K");
  CHECK(q.scales == std::vector<float>{0.0009765625f});
  CHECK(q.codes == std::vector<uint8_t>{0x7b, 0xe4, 0x49, 0x03, 0x02, 0x00, 0x80, 0x62});
  const std::vector<float> x_hat = dequantize(q);
  CHECK(x_hat[2] == 0.009765625f);
  CHECK(x_hat[4] == std::ldexp(1.0f, -25));
}

TEST_CASE("golden: fp8-e4m3-token and -tensor share one scale, a tiny group takes the fp16 minimum scale") {
  // Token: both heads of (b, t) share amax 14 -> s = rd(14 / 448) = 2^-5; x / s = 32 x.
  //   14 -> 448 -> 0x7e;  1 -> 32 -> 0x60;  -0.5 -> -16 -> 0xd8;  0.25 -> 8 -> 0x50.
  const std::vector<float> x = {14.0f, 1.0f, -0.5f, 0.25f};
  const QuantizedKv t = quantize(KvView::bnsh(x.data(), {1, 2, 1, 2}), parse_scheme("fp8-e4m3-token"), "K");
  CHECK(t.scales == std::vector<float>{0.03125f});
  CHECK(t.codes == std::vector<uint8_t>{0x7e, 0x60, 0xd8, 0x50});
  // amax 1e-6: 1e-6 / 448 rounds to a tiny fp16 value, raised to minpos 2^-14; 1e-6 * 2^14 =
  // 0.016384 = 1.048576 * 2^-6 -> smallest normal 0x08; 0 -> 0x00.
  const std::vector<float> tiny = {1e-6f, 0.0f};
  const QuantizedKv m = quantize(KvView::bnsh(tiny.data(), {1, 1, 1, 2}), parse_scheme("fp8-e4m3-tensor"), "K");
  CHECK(m.scales == std::vector<float>{std::ldexp(1.0f, -14)});
  CHECK(m.codes == std::vector<uint8_t>{0x08, 0x00});
  // fp32 scales: amax 1 -> s = 1/448 in fp32, stored unrounded to fp16.
  const std::vector<float> one = {1.0f, -1.0f};
  const QuantizedKv f = quantize(KvView::bnsh(one.data(), {1, 1, 1, 2}), parse_scheme("fp8-e4m3-head-fp32"), "K");
  CHECK(f.scales == std::vector<float>{1.0f / 448.0f});
  CHECK(f.codes == std::vector<uint8_t>{0x7e, 0xfe});
}

TEST_CASE("golden: scale-free fp8-e4m3 and fp8-e5m2 store codes only and saturate") {
  //  1 -> 0x38;  500 -> saturates 0x7e;  -1000 -> 0xfe;  0.001 = 0.512 * 2^-9 -> subnormal 1 -> 0x01;
  //  2^-10 = half of 2^-9 -> tie, even 0 -> 0x00;  3*2^-10 = 1.5 * 2^-9 -> tie, even 2 -> 0x02;
  //  240 = 1.875*2^7 -> 0x77;  -0.0 -> 0x80.
  const std::vector<float> x = {1.0f, 500.0f, -1000.0f, 0.001f, std::ldexp(1.0f, -10), std::ldexp(3.0f, -10), 240.0f,
                                -0.0f};
  const QuantizedKv q = quantize(KvView::bnsh(x.data(), {1, 1, 1, 8}), parse_scheme("fp8-e4m3"), "K");
  CHECK(q.scales.empty());
  CHECK(q.zeros.empty());
  CHECK(q.codes == std::vector<uint8_t>{0x38, 0x7e, 0xfe, 0x01, 0x00, 0x02, 0x77, 0x80});
  const std::vector<float> x_hat = dequantize(q);
  CHECK(x_hat[1] == 448.0f);
  CHECK(x_hat[3] == std::ldexp(1.0f, -9));
  //  60000 -> 0x7b (57344);  1 -> 2^0, exponent 15 -> 0x3c;  -3 -> -1.5*2^1 -> 0xc2;  2^-17 -> tie, even 0.
  const std::vector<float> y = {60000.0f, 1.0f, -3.0f, std::ldexp(1.0f, -17)};
  const QuantizedKv r = quantize(KvView::bnsh(y.data(), {1, 1, 1, 4}), parse_scheme("fp8-e5m2"), "K");
  CHECK(r.codes == std::vector<uint8_t>{0x7b, 0x3c, 0xc2, 0x00});
}

TEST_CASE("fp8 schemes reject non-finite input and overflowing scales like the integer schemes") {
  using test::message_of;
  const KvShape shape{1, 2, 3, 8};
  std::vector<float> x(shape.numel(), 1.0f);
  x[(1 * 3 + 2) * 8 + 4] = INFINITY;
  for (const char* name : {"int8-head", "fp8-e4m3-head", "fp8-e5m2-tensor", "fp8-e4m3"}) {
    CAPTURE(name);
    CHECK(message_of<InputError>([&] { quantize(KvView::bnsh(x.data(), shape), parse_scheme(name), "layer 0 K"); }) ==
          "layer 0 K: non-finite value inf at [0, 1, 2, 4] (quantizers accept finite input only)");
  }
  x[(1 * 3 + 2) * 8 + 4] = NAN;
  CHECK(message_of<InputError>([&] { quantize(KvView::bnsh(x.data(), shape), parse_scheme("fp8-e4m3"), "V"); })
            .find("non-finite value nan at [0, 1, 2, 4]") != std::string::npos);
  // amax 3e7 / 448 > 65504: the fp16 scale overflows; fp32 scales take it.
  std::vector<float> big(8, 3e7f);
  CHECK(message_of<InputError>([&] { quantize(KvView::bnsh(big.data(), {1, 1, 1, 8}), parse_scheme("fp8-e4m3-head"), "K"); })
            .find("fp8-e4m3-head group 0") != std::string::npos);
  CHECK_NOTHROW(quantize(KvView::bnsh(big.data(), {1, 1, 1, 8}), parse_scheme("fp8-e4m3-head-fp32"), "K"));
}

TEST_CASE("golden: fp8-e5m2-g4, two hand-computed groups (one at the fp16 minimum scale)") {
  // Group 0, amax 3: 3 / 57344 = 5.2e-5 is below fp16's smallest normal, so s = minpos = 2^-14 and
  // x / s = 16384 x:  1 -> 2^14 -> 0x74;  2 -> 2^15 -> 0x78;  -3 -> -1.5*2^15 -> 0xfa;  0.5 -> 2^13 -> 0x70.
  // Group 1, amax 448: s = 448 / 57344 = 2^-7, x / s = 128 x:  448 -> 57344 -> 0x7b;
  //   -100 -> -12800 = -1.5625*2^13 -> mantissa 2.25/4 -> 2/4: -1.5*2^13 -> 0xf2;
  //   0.001f -> 0.128 = 1.024*2^-3 -> 0x30;  7 -> 896 = 1.75*2^9 -> 0x63.
  const std::vector<float> x = {1.0f, 2.0f, -3.0f, 0.5f, 448.0f, -100.0f, 0.001f, 7.0f};
  const QuantizedKv q = quantize(KvView::bnsh(x.data(), {1, 1, 1, 8}), parse_scheme("fp8-e5m2-g4"), "K");
  CHECK(q.scales == std::vector<float>{std::ldexp(1.0f, -14), std::ldexp(1.0f, -7)});
  CHECK(q.codes == std::vector<uint8_t>{0x74, 0x78, 0xfa, 0x70, 0x7b, 0xf2, 0x30, 0x63});
  const std::vector<float> x_hat = dequantize(q);
  CHECK(x_hat[5] == -96.0f);
  CHECK(x_hat[6] == 0.0009765625f);
}

namespace {

// Fp8Coder's codes of x (one 8-element chunk, padded with zeros) against encode_fp8's; returns sure.
bool coder_agrees(const Fp8Coder& coder, const std::vector<float>& x, float scale, CodeFormat format) {
  REQUIRE(x.size() <= 8);
  float chunk[8] = {};
  std::copy(x.begin(), x.end(), chunk);
  uint32_t w[2];
  bool sure = true;
  coder.codes8(chunk, fp8_format(format), w, sure);
  if (!sure) return false;
  for (size_t e = 0; e < 8; ++e) {
    CAPTURE(chunk[e]);
    CHECK(int((w[e / 4] >> (8 * (e % 4))) & 0xff) == encode_fp8(chunk[e], scale, format));
  }
  return true;
}

}  // namespace

TEST_CASE("Fp8Coder: its codes are encode_fp8's wherever it says so (rounding boundaries included) and random values are sure") {
  std::mt19937 rng(2024);
  std::uniform_real_distribution<float> unit(1.0f, 2.0f), sign(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-60, 60);
  for (const CodeFormat format : {CodeFormat::kFp8E4M3, CodeFormat::kFp8E5M2}) {
    const Fp8Format f = fp8_format(format);
    int unsure_at_boundaries = 0, sure_random = 0, random = 0;
    for (int trial = 0; trial < 48; ++trial) {
      const float scale = trial == 0 ? 1.0f : std::ldexp(unit(rng), exponent(rng));
      CAPTURE(scale);
      const Fp8Coder coder = fp8_coder(stored_params(scale, 0.0f));
      REQUIRE(coder.usable);
      // x / s a few ulps either side of the midpoint between neighbouring codes (ties included)
      for (uint32_t c = 0; c < f.max_bits; ++c) {
        const float mid = (fp8_bits_to_fp32(uint8_t(c), f) + fp8_bits_to_fp32(uint8_t(c + 1), f)) / 2;
        float x = mid * scale;
        for (int k = 0; k < 6; ++k) x = std::nextafter(x, 0.0f);
        std::vector<float> run;
        for (int k = 0; k < 12; ++k, x = std::nextafter(x, INFINITY)) run.push_back(k % 2 ? -x : x);
        for (size_t i = 0; i < run.size(); i += 4)
          unsure_at_boundaries += !coder_agrees(coder, {run[i], run[i + 1], run[i + 2], run[i + 3]}, scale, format);
      }
      // values over the whole grid and past it
      for (int k = 0; k < 64; ++k, ++random) {
        std::vector<float> x(8);
        for (float& v : x) v = sign(rng) * std::ldexp(unit(rng), exponent(rng) / 4) * scale;
        sure_random += coder_agrees(coder, x, scale, format);
      }
    }
    CAPTURE(int(format));
    CHECK(unsure_at_boundaries > 0);           // the bracket does meet boundaries: the test reaches them
    CHECK(sure_random >= random * 99 / 100);  // and almost nothing else
  }
}

TEST_CASE("Fp8Coder: zero scales, non-finite input, overflowing products and scales without a normal reciprocal") {
  const CodeFormat e4 = CodeFormat::kFp8E4M3;
  const Fp8Coder zero = fp8_coder(stored_params(0.0f, 0.0f));
  CHECK(coder_agrees(zero, {1.0f, -2.0f, -0.0f, 3e38f, -1e-30f}, 0.0f, e4));  // all codes 0, sure
  CHECK_FALSE(coder_agrees(zero, {1.0f, NAN}, 0.0f, e4));
  const Fp8Coder unit = fp8_coder(stored_params(1.0f, 0.0f));
  CHECK(coder_agrees(unit, {448.0f, -464.0f, 1e30f, -3.4e38f, 0.0f, -0.0f, 1e-40f, -0x1p-12f}, 1.0f, e4));
  CHECK_FALSE(coder_agrees(unit, {-0x1p-10f}, 1.0f, e4));  // a tie (half the smallest subnormal) is never sure
  CHECK_FALSE(coder_agrees(unit, {1.0f, INFINITY}, 1.0f, e4));
  CHECK_FALSE(coder_agrees(unit, {-INFINITY}, 1.0f, e4));
  const Fp8Coder tiny = fp8_coder(stored_params(3e-38f, 0.0f));  // a given scale: x / s can pass fp32
  REQUIRE(tiny.usable);
  CHECK(coder_agrees(tiny, {1e-38f, -2e-38f}, 3e-38f, e4));
  CHECK_FALSE(coder_agrees(tiny, {1e10f}, 3e-38f, e4));  // the product overflows: the division saturates it
  CHECK(encode_fp8(1e10f, 3e-38f, e4) == 0x7e);
  CHECK_FALSE(fp8_coder(stored_params(1e-40f, 0.0f)).usable);  // 1 / s overflows
  CHECK_FALSE(fp8_coder(stored_params(3e38f, 0.0f)).usable);   // 1 / s is subnormal
  CHECK_FALSE(coder_agrees(fp8_coder(stored_params(3e38f, 0.0f)), {1.0f}, 3e38f, e4));
}
