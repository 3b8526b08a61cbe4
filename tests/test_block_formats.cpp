// The block formats (llama.cpp's q8_0 ... iq4_nl, mxfp4, nvfp4): names, hand-computed blocks that pin
// each reference rounding, the helpers against brute force, the ggml block layout byte for byte, and
// what quantize() does with windows, rotation and overflow. Bit-exactness against the gguf
// package's quantizers is tests/python/test_ggml_formats.py.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "quant/block_formats.hpp"
#include "quant/ggml_layout.hpp"
#include "quant/hadamard.hpp"
#include "quant/quantize.hpp"
#include "reference/metrics.hpp"
#include "test_util.hpp"

using namespace kvq;

namespace {

struct Block {
  BlockParams p;
  std::vector<int> codes;
  std::vector<float> values;
};

// One block through the codec; x is padded with zeros to the block size.
Block code_block(CodeFormat f, std::vector<float> x, float tensor_scale = 0.0f) {
  x.resize(static_cast<size_t>(block_elements(f)), 0.0f);
  Block b{block_params(f, x.data(), tensor_scale), {}, {}};
  for (float v : x) {
    b.codes.push_back(block_encode(f, v, b.p));
    // decoded as stored: the code's low byte (q8_0 as int8), as quantize() keeps it
    const int low = b.codes.back() & 0xff, stored = f == CodeFormat::kQ8_0 ? static_cast<int8_t>(low) : low;
    b.values.push_back(block_decode(f, stored, b.p.scale, b.p.min, tensor_scale));
  }
  return b;
}

uint32_t bits_of(float x) { return float_bits(x); }

QuantizedKv quantize_bnsh(const std::vector<float>& x, KvShape shape, const char* scheme,
                          const int32_t* seq_lens = nullptr) {
  return quantize(KvView::bnsh(x.data(), shape), parse_scheme(scheme), "K", seq_lens);
}

const char* kBlockNames[] = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4", "nvfp4"};

}  // namespace

TEST_CASE("block format names parse, print and describe their storage") {
  for (const char* name : kBlockNames) {
    CAPTURE(name);
    const Scheme s = parse_scheme(name);
    CHECK(to_string(s) == name);
    CHECK(s.block_format());
    CHECK(!s.fp8());
    CHECK(s.granularity == Granularity::kGroup);
    CHECK(s.group == (std::string(name) == "nvfp4" ? 16 : 32));
    CHECK(to_string(parse_scheme(std::string(name) + "+w64+had")) == std::string(name) + "+had+w64");
  }
  CHECK(parse_scheme("q5_1").bits == 5);
  CHECK(parse_scheme("q5_1").asymmetric);  // the min is kvq's zero point
  CHECK(!parse_scheme("q4_0").asymmetric);
  CHECK(parse_scheme("q8_0").signed_codes());
  CHECK(!parse_scheme("q4_0").signed_codes());  // ggml's unsigned nibble, value (q - 8) d
  CHECK(parse_scheme("mxfp4").scale_dtype == ScaleDtype::kE8M0);
  CHECK(parse_scheme("nvfp4").scale_dtype == ScaleDtype::kE4M3);
  CHECK(parse_scheme("nvfp4").scale_bytes() == 1);
  CHECK(format_name(parse_scheme("iq4_nl+had+w8")) == "iq4_nl");
  CHECK(format_name(parse_scheme("fp8-e5m2-head")) == "fp8-e5m2");
  CHECK(std::string(scale_dtype_name(parse_scheme("mxfp4").scale_dtype)) == "e8m0");
  using test::message_of;
  CHECK(message_of<SchemeError>([] { parse_scheme("q4_0-asym"); }).find("takes no suffixes") != std::string::npos);
  CHECK(message_of<SchemeError>([] { parse_scheme("q4_2"); }).find("q8_0, q4_0, q4_1") != std::string::npos);
  CHECK(message_of<SchemeError>([] { check_scheme_fits(parse_scheme("q4_0"), 48); }) ==
        "q4_0: block size 32 does not divide head_dim 48");
  CHECK_NOTHROW(check_scheme_fits(parse_scheme("nvfp4"), 48));
  CHECK(message_of<SchemeError>([] { check_scheme_fits(parse_scheme("q8_0+had"), 96); }).find("power-of-two") !=
        std::string::npos);
}

TEST_CASE("bits per element: scales amortized over the block, nvfp4's tensor scale over the tensor") {
  const KvShape shape{1, 4, 100, 128};
  const double expected[] = {8.5, 4.5, 5.0, 5.5, 6.0, 4.5, 4.25};
  for (int i = 0; i < 7; ++i) {
    CAPTURE(kBlockNames[i]);
    CHECK(bits_per_element(parse_scheme(kBlockNames[i]), shape) == expected[i]);
  }
  CHECK(bytes_per_token_per_head(parse_scheme("nvfp4"), shape) == doctest::Approx(64 + 8 + 4.0 / 400));
}

TEST_CASE("golden blocks: each format's own rounding") {
  SUBCASE("q8_0: roundf, half away from zero (kvq's int8 rounds half to even)") {
    const Block b = code_block(CodeFormat::kQ8_0, {127.0f, 2.5f, -2.5f, 0.5f, -126.5f});
    CHECK(b.p.scale == 1.0f);
    CHECK(std::vector<int>(b.codes.begin(), b.codes.begin() + 5) == std::vector<int>{127, 3, -3, 1, -127});
  }
  SUBCASE("q4_0: d = max / -8 and +8.5 truncation; the largest magnitude's sign maps to -8, its mirror clips at 7") {
    const Block b = code_block(CodeFormat::kQ4_0, {8.0f, -8.0f, 0.0f, 1.5f, 2.5f, -0.5f});
    CHECK(b.p.scale == -1.0f);
    CHECK(std::vector<int>(b.codes.begin(), b.codes.begin() + 6) == std::vector<int>{0, 15, 8, 7, 6, 9});
    CHECK(std::vector<float>(b.values.begin(), b.values.begin() + 6) ==
          std::vector<float>{8.0f, -7.0f, -0.0f, 1.0f, 2.0f, -1.0f});
  }
  SUBCASE("q4_1: +0.5 truncation (half up) from the fp32 min") {
    const Block b = code_block(CodeFormat::kQ4_1, {0.0f, 15.0f, 7.5f, 7.49f, 0.5f});
    CHECK(b.p.scale == 1.0f);
    CHECK(b.p.min == 0.0f);
    CHECK(std::vector<int>(b.codes.begin(), b.codes.begin() + 5) == std::vector<int>{0, 15, 8, 7, 1});
  }
  SUBCASE("q5_0 and q5_1: 32 levels") {
    const Block b0 = code_block(CodeFormat::kQ5_0, {16.0f, -16.0f, 3.5f});
    CHECK(b0.p.scale == -1.0f);
    CHECK(std::vector<int>(b0.codes.begin(), b0.codes.begin() + 3) == std::vector<int>{0, 31, 13});
    const Block b1 = code_block(CodeFormat::kQ5_1, {-1.0f, 30.0f, 15.5f});
    CHECK(b1.p.scale == 1.0f);
    CHECK(b1.p.min == -1.0f);
    CHECK(std::vector<int>(b1.codes.begin(), b1.codes.begin() + 3) == std::vector<int>{0, 31, 17});
    CHECK(b1.values[2] == 16.0f);
  }
  SUBCASE("iq4_nl: codes from max / -127, the stored scale a weighted least-squares refit") {
    std::vector<float> x(32);
    for (int j = 0; j < 32; ++j) x[j] = 0.5f * static_cast<float>(iq4nl_value(j % 16));  // on the grid
    const Block b = code_block(CodeFormat::kIq4Nl, x);
    CHECK(b.p.scale == 0.5f);  // sum(w q x) is half of sum(w q^2), exactly
    for (int j = 0; j < 32; ++j) CHECK(b.codes[j] == j % 16);
    CHECK(b.values == x);
    // Off the grid the refit moves the scale: 1..32 has max 32, d0 = -32/127.
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j + 1);
    const Block c = code_block(CodeFormat::kIq4Nl, x);
    CHECK(c.p.scale < 0.0f);
    CHECK(c.p.scale != round_to_fp16(-32.0f / 127.0f));
    CHECK(c.codes[31] == 0);  // 32 -> -127 * d0
  }
  SUBCASE("mxfp4: e = floor(log2 amax) - 2 + 127; ties go to the first (smaller) value, not to even") {
    const Block b = code_block(CodeFormat::kMxfp4, {6.0f, -1.5f, 0.25f, 0.75f, 2.5f, 5.0f, -0.75f, -0.25f, 1.25f});
    CHECK(b.p.scale == 1.0f);  // e = 127
    CHECK(std::vector<int>(b.codes.begin(), b.codes.begin() + 9) == std::vector<int>{7, 11, 0, 1, 4, 6, 9, 0, 2});
    CHECK(bits_of(b.values[7]) == 0u);  // -0.25 -> index 0: +0
  }
  SUBCASE("nvfp4: e2m1 round to nearest even under s_b * s_t") {
    const float st = nvfp4_tensor_scale(2688.0f);  // 1
    CHECK(st == 1.0f);
    const Block b = code_block(CodeFormat::kNvfp4, {6.0f, 0.75f, -5.0f, 5.5f, 0.25f, -0.1f, 2.5f, 3.5f}, st);
    CHECK(b.p.scale == 1.0f);
    CHECK(std::vector<int>(b.codes.begin(), b.codes.begin() + 8) == std::vector<int>{7, 2, 14, 7, 0, 8, 4, 6});
    CHECK(bits_of(b.values[5]) == 0u);  // code 8 ("-0") decodes to +0, as NVIDIA's table
    const Block tiny = code_block(CodeFormat::kNvfp4, {1e-30f}, st);
    CHECK(tiny.p.scale == 0x1p-9f);  // clamped to e4m3's smallest subnormal
    const Block zero = code_block(CodeFormat::kNvfp4, {0.0f}, st);
    CHECK(zero.p.scale == 1.0f);  // a zero pre-scale becomes 1
    const Block none = code_block(CodeFormat::kNvfp4, {1.0f}, 0.0f);  // all-zero tensor elsewhere
    CHECK(none.codes[0] == 0);
  }
}

TEST_CASE("special blocks: zeros, constants, one huge value, subnormal fp16 scales") {
  SUBCASE("zero blocks store ggml's signed zeros") {
    const Block q40 = code_block(CodeFormat::kQ4_0, {});
    CHECK(fp32_to_fp16_bits(q40.p.scale) == 0x8000);  // +0 / -8 = -0
    CHECK(q40.codes[0] == 8);
    // ggml's C keeps the initial +0 as vmax when every |x| is 0 (gguf's numpy port takes x[0] = -0: d = +0)
    CHECK(fp32_to_fp16_bits(code_block(CodeFormat::kQ4_0, {-0.0f}).p.scale) == 0x8000);
    const Block iq = code_block(CodeFormat::kIq4Nl, {});
    CHECK(fp32_to_fp16_bits(iq.p.scale) == 0x0000);
    CHECK(bits_of(iq.values[0]) == 0x80000000u);  // 0 * -127
    for (CodeFormat f : {CodeFormat::kQ8_0, CodeFormat::kQ4_1, CodeFormat::kQ5_1, CodeFormat::kMxfp4}) {
      const Block b = code_block(f, {});
      for (float v : b.values) CHECK(v == 0.0f);
    }
  }
  SUBCASE("constant blocks come back exactly when the scale is exact") {
    for (CodeFormat f : {CodeFormat::kQ4_0, CodeFormat::kQ5_0, CodeFormat::kQ4_1, CodeFormat::kQ5_1}) {
      const Block b = code_block(f, std::vector<float>(32, -3.0f));
      for (float v : b.values) CHECK(v == -3.0f);
    }
  }
  SUBCASE("one huge value: the other elements round to zero or the smallest level") {
    std::vector<float> x(32, 1.0f);
    x[17] = 60000.0f;
    const Block b = code_block(CodeFormat::kQ8_0, x);
    CHECK(b.values[17] == doctest::Approx(60000.0f).epsilon(1e-3));
    CHECK(b.codes[0] == 0);
  }
  SUBCASE("an fp16-subnormal d is stored rounded, the codes come from the fp32 d") {
    const Block b = code_block(CodeFormat::kQ8_0, {1e-5f, 3e-6f});
    CHECK(b.p.scale < kFp16MinNormal);
    CHECK(b.p.scale == round_to_fp16(1e-5f / 127.0f));
    CHECK(b.codes[0] == 127);
    CHECK(b.codes[1] == 38);  // 3e-6 * 127 / 1e-5 = 38.1
  }
  SUBCASE("a block so small that 1/d overflows: x * id is inf or NaN, cast as x86 casts it, code 0") {
    // C leaves the cast undefined (CUDA's cvt would saturate); the codec defines it for both
    std::vector<float> x(32);
    for (int j = 0; j < 32; ++j) x[j] = 1e-39f * static_cast<float>(j - 16);
    for (CodeFormat f : {CodeFormat::kQ8_0, CodeFormat::kQ4_0, CodeFormat::kQ4_1, CodeFormat::kQ5_0, CodeFormat::kQ5_1}) {
      const Block b = code_block(f, x);
      CHECK(std::isinf(b.p.encode_scale));
      for (int c : b.codes) CHECK((c & 0xff) == 0);
    }
    CHECK(truncate_to_int(NAN) == INT32_MIN);
    CHECK(truncate_to_int(INFINITY) == INT32_MIN);
    CHECK(truncate_to_int(2147483648.0f) == INT32_MIN);
    CHECK(truncate_to_int(-2147483648.0f) == INT32_MIN);  // in range: the cast itself
    CHECK(truncate_to_int(2147483520.0f) == 2147483520);
    CHECK(truncate_to_int(-7.9f) == -7);
    CHECK(mxfp4_exponent(INFINITY) == 0);
  }
  SUBCASE("the first of two opposite largest magnitudes decides the sign of d (q4_0, q5_0)") {
    CHECK(code_block(CodeFormat::kQ4_0, {-2.0f, 2.0f}).p.scale == 0.25f);
    CHECK(code_block(CodeFormat::kQ4_0, {2.0f, -2.0f}).p.scale == -0.25f);
  }
}

TEST_CASE("mxfp4's exponent is floor of the correctly rounded log2f, clamped at 0") {
  // Near a power of two the fp32 rounding of log2 can reach the next integer: compare with the
  // C library's log2f over every float within 2^12 below and 2^6 above each power of two, and a
  // stride of the rest.
  int checked = 0, lifted = 0;
  for (int e = -124; e <= 127; ++e) {
    const uint32_t p = float_bits(std::ldexp(1.0f, e));
    for (uint32_t b = p - 4096; b < p + 64; ++b) {
      const float x = bits_float(b);
      const int want = static_cast<int>(std::floor(log2f(x))) - 2 + 127;
      REQUIRE(mxfp4_exponent(x) == want);
      lifted += want != std::ilogb(x) - 2 + 127;
      ++checked;
    }
  }
  for (uint32_t b = 0x04000000u; b < 0x7f000000u; b += 4099) {
    const float x = bits_float(b);
    REQUIRE(mxfp4_exponent(x) == static_cast<int>(std::floor(log2f(x))) - 2 + 127);
  }
  MESSAGE(checked, " floats near powers of two, ", lifted, " where the rounded log2 lifts the exponent");
  CHECK(lifted > 0);
  CHECK(mxfp4_exponent(0x1p-125f) == 0);
  CHECK(mxfp4_exponent(0x1p-126f) == 0);  // ggml: (uint8_t)(-1), undefined; kvq clamps
  CHECK(mxfp4_exponent(3.4e38f) == 252);
}

TEST_CASE("e2m1 rounding and iq4_nl's index against brute force") {
  const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int i = -20000; i <= 20000; ++i) {
    const float x = static_cast<float>(i) / 2048.0f;  // every multiple of 2^-11 in [-9.8, 9.8]: ties included
    int best = 0;
    for (int m = 1; m < 8; ++m) {
      const float d = std::fabs(std::fabs(x) - e2m1[m]), db = std::fabs(std::fabs(x) - e2m1[best]);
      if (d < db || (d == db && m % 2 == 0)) best = m;  // ties to the even code
    }
    CAPTURE(x);
    REQUIRE(e2m1_code(x) == (best | (x < 0 ? 8 : 0)));
  }
  // the branch-free count against NVIDIA's chain of compares as written, on every float whose low 12
  // bits are 0, each midpoint and its neighbours, infinities and NaNs
  auto chain = [](float v) {
    const float a = std::fabs(v);
    const int m = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3
                : a <= 2.5f  ? 4 : a < 3.5f  ? 5 : a <= 5.0f  ? 6 : 7;
    return m | (v < 0.0f ? 8 : 0);
  };
  for (uint64_t b = 0; b <= 0xffffffffu; b += 0x1000) REQUIRE(e2m1_code(bits_float(uint32_t(b))) == chain(bits_float(uint32_t(b))));
  for (float mid : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, INFINITY, NAN})
    for (float v : {mid, -mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), -std::nextafter(mid, 0.0f)})
      REQUIRE(e2m1_code(v) == chain(v));
  // iq4_nl's table, read from packed words: ggml's kvalues_iq4nl, and an index's low 4 bits only
  const int kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  for (int i = 0; i < 32; ++i) REQUIRE(iq4nl_value(i) == kvalues_iq4nl[i % 16]);
  const int kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  for (int i = 0; i < 32; ++i) REQUIRE(e2m1_doubled(i) == kvalues_mxfp4[i % 16]);
  static_assert(iq4nl_value(0) == -127 && iq4nl_value(15) == 113, "usable in constant expressions (decode's tables)");
  for (int i = -140000; i <= 140000; ++i) {
    const float x = static_cast<float>(i) / 1024.0f;
    int best = 0;
    for (int k = 1; k < 16; ++k) {
      const float d = std::fabs(x - static_cast<float>(iq4nl_value(k)));
      const float db = std::fabs(x - static_cast<float>(iq4nl_value(best)));
      if (d <= db) best = k;  // ties to the larger level
    }
    CAPTURE(x);
    REQUIRE(iq4nl_best_index(x) == best);
  }
}

// ggml's mxfp4 rule as written: every doubled e2m1 value tried, the first smallest rounded error.
int mxfp4_code_by_search(float x, float id) {
  int best = 0;
  float best_err = std::fabs(static_cast<float>(e2m1_doubled(0)) * id - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(static_cast<float>(e2m1_doubled(i)) * id - x);
    if (err < best_err) best = i, best_err = err;
  }
  return best;
}

TEST_CASE("mxfp4's code from its neighbours equals ggml's search of all 16 values") {
  // every scale exponent; x on and between the values, at the midpoints and one ulp either side, far
  // beyond the largest (errors that round alike), tiny, signed zeros, and values whose v id overflows
  std::vector<float> xs = {0.0f, -0.0f, 3.4e38f, -3.4e38f, 1e-45f, -1e-45f};
  const float halves[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f,
                          6.0f, 7.0f, 8.0f, 10.0f, 12.0f, 14.0f, 15.0f, 16.0f, 100.0f, 1e6f};
  for (int e = 0; e < 255; ++e) {
    const float id = e8m0_half(e);
    for (float h : halves)
      for (float sign : {1.0f, -1.0f}) {
        const float x = sign * h * id;
        for (float v : {x, std::nextafter(x, INFINITY), std::nextafter(x, -INFINITY)}) {
          CAPTURE(e);
          CAPTURE(v);
          REQUIRE(mxfp4_encode(v, id) == mxfp4_code_by_search(v, id));
        }
      }
    for (float x : xs) REQUIRE(mxfp4_encode(x, id) == mxfp4_code_by_search(x, id));
  }
  const std::vector<float> random = test::random_normal(200000, 31);
  for (size_t i = 0; i < random.size(); ++i) {
    const float id = e8m0_half(static_cast<int>(i % 255)), x = random[i] * std::ldexp(1.0f, static_cast<int>(i % 255) - 128);
    REQUIRE(mxfp4_encode(x, id) == mxfp4_code_by_search(x, id));
  }
}

TEST_CASE("ggml block layout: byte for byte both ways") {
  const KvShape shape{2, 3, 5, 128};
  const std::vector<float> x = test::random_normal(static_cast<size_t>(shape.numel()), 23);
  const int64_t block_bytes[] = {34, 18, 20, 22, 24, 18, 17, 36};
  for (int i = 0; i < 8; ++i) {
    CAPTURE(kBlockNames[i]);
    const QuantizedKv q = quantize_bnsh(x, shape, kBlockNames[i]);
    const GgmlRows rows = to_ggml(q);
    CHECK(ggml_block_bytes(q.scheme) == block_bytes[i]);
    CHECK(rows.row_bytes == 128 / ggml_block_elements(q.scheme) * block_bytes[i]);
    CHECK(static_cast<int64_t>(rows.bytes.size()) == shape.rows() * rows.row_bytes);
    const QuantizedKv back = from_ggml(rows);
    CHECK(back.codes == q.codes);
    CHECK(back.scales == q.scales);
    CHECK(back.zeros == q.zeros);
    CHECK(back.tensor_scale == q.tensor_scale);
    CHECK(to_ggml(back).bytes == rows.bytes);
  }
  SUBCASE("block_q4_0 by hand: fp16 d little-endian, element j low and j + 16 high") {
    std::vector<float> v(32);
    for (int j = 0; j < 32; ++j) v[j] = static_cast<float>(j % 16) - 8.0f;  // max -8: d = 1, code = value + 8
    const GgmlRows rows = to_ggml(quantize_bnsh(v, {1, 1, 1, 32}, "q4_0"));
    REQUIRE(rows.bytes.size() == 18);
    CHECK(rows.bytes[0] == 0x00);
    CHECK(rows.bytes[1] == 0x3c);  // fp16 1.0
    for (int j = 0; j < 16; ++j) CHECK(rows.bytes[2 + j] == (j | (j << 4)));
  }
  SUBCASE("block_q5_1: the fifth bits in a little-endian uint32") {
    std::vector<float> v(32, 0.0f);
    v[1] = 31.0f;  // d = 1, min 0: code 31 at element 1
    v[20] = 16.0f;
    const GgmlRows rows = to_ggml(quantize_bnsh(v, {1, 1, 1, 32}, "q5_1"));
    REQUIRE(rows.bytes.size() == 24);
    CHECK(rows.bytes[4] == 0x02);  // qh bit 1
    CHECK(rows.bytes[6] == 0x10);  // qh bit 20 = byte 2, bit 4
    CHECK(rows.bytes[8 + 1] == 0x0f);
    CHECK(rows.bytes[8 + 4] == 0x00);  // element 20: low nibble 0, in byte 4's high nibble
  }
  SUBCASE("errors name what has no ggml blocks") {
    using test::message_of;
    CHECK(message_of<SchemeError>([&] { to_ggml(quantize_bnsh(x, shape, "int4-g32")); }).find("block formats only") !=
          std::string::npos);
    const int32_t lens[2] = {5, 5};
    CHECK(message_of<SchemeError>([&] { to_ggml(quantize_bnsh(x, shape, "q8_0+w2", lens)); }).find("window") !=
          std::string::npos);
    const std::vector<float> x48(static_cast<size_t>(2 * 48), 1.0f);
    CHECK(message_of<SchemeError>([&] { to_ggml(quantize_bnsh(x48, {1, 1, 2, 48}, "nvfp4")); }) ==
          "nvfp4: ggml's block holds 64 elements, which does not divide head_dim 48");
    GgmlRows rows = to_ggml(quantize_bnsh(x, shape, "mxfp4"));
    rows.bytes.pop_back();
    CHECK(message_of<InputError>([&] { from_ggml(rows); }).find("are 2040 bytes") != std::string::npos);
    rows.bytes.push_back(0);
    rows.bytes[17] = 0xff;  // the second block's e8m0: NaN
    CHECK(message_of<InputError>([&] { from_ggml(rows); }) ==
          "mxfp4: ggml block 1 of row [b 0, t 0, h 0]: scale byte 0xff is not a finite e8m0 scale");
  }
}

TEST_CASE("quantize() with block formats: windows, rotation, overflow, given tensor scales") {
  const KvShape shape{1, 2, 20, 64};
  const std::vector<float> x = test::random_normal(static_cast<size_t>(shape.numel()), 5);
  SUBCASE("+wW keeps the last W tokens raw and quantizes the rest as the plain format does") {
    const QuantizedKv w = quantize_bnsh(x, shape, "q4_1+w8"), plain = quantize_bnsh(x, shape, "q4_1");
    const std::vector<float> xw = dequantize(w), xp = dequantize(plain);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t t = 0; t < 20; ++t)
        for (int64_t d = 0; d < 64; ++d) {
          const int64_t i = (h * 20 + t) * 64 + d;
          CHECK(xw[i] == (t < 12 ? xp[i] : x[i]));
        }
  }
  SUBCASE("+had quantizes the rotated rows") {
    std::vector<float> rotated = x;
    for (int64_t r = 0; r < shape.rows(); ++r) hadamard_rotate(rotated.data() + r * 64, 64);
    CHECK(quantize_bnsh(x, shape, "mxfp4+had").codes == quantize_bnsh(rotated, shape, "mxfp4").codes);
  }
  SUBCASE("nvfp4: the tensor scale from the quantized tokens, or as given") {
    const QuantizedKv q = quantize_bnsh(x, shape, "nvfp4");
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    CHECK(q.tensor_scale == amax / 2688.0f);
    const QuantizedKv given = quantize(KvView::bnsh(x.data(), shape), parse_scheme("nvfp4"), "K", nullptr, 0.25f);
    CHECK(given.tensor_scale == 0.25f);
    using test::message_of;
    CHECK(message_of<InputError>([&] {
            quantize(KvView::bnsh(x.data(), shape), parse_scheme("q8_0"), "K", nullptr, 0.25f);
          }) == "q8_0: a tensor scale is given, but only nvfp4 and the symmetric per-tensor schemes (int8-tensor, "
               "fp8-e4m3-tensor, ...) take one");
  }
  SUBCASE("an fp16 scale beyond 65504 is an input error naming the block") {
    std::vector<float> big = x;
    big[3 * 64 + 40] = 1e7f;  // q8_0: d = 1e7 / 127 > 65504
    const std::string msg = test::message_of<InputError>([&] { quantize_bnsh(big, shape, "q8_0"); });
    CHECK(msg.find("K: q8_0 group 7 starting at [0, 0, 3, 32]") == 0);
    CHECK(msg.find("stores fp16") != std::string::npos);
  }
}
