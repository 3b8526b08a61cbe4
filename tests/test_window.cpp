// The +wW full-precision window: W = 0, W >= T, W not a multiple of chan-tN's N, varlen batches,
// group statistics over quantized tokens only, and the memory it costs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "quant/quantize.hpp"
#include "reference/metrics.hpp"
#include "test_util.hpp"

using namespace kvq;

namespace {

// Tokens [0, n) of every (b, h) of a BNSH tensor, as a [B, H, n, D] tensor.
std::vector<float> prefix(const std::vector<float>& x, const KvShape& s, int64_t b, int64_t n) {
  std::vector<float> out;
  for (int64_t h = 0; h < s.heads; ++h) {
    const float* row = x.data() + ((b * s.heads + h) * s.tokens) * s.head_dim;
    out.insert(out.end(), row, row + n * s.head_dim);
  }
  return out;
}

}  // namespace

TEST_CASE("window boundaries: Lq = max(0, len - W), chan-tN rounds down to whole token groups") {
  CHECK(quantized_length(parse_scheme("int8-head"), 100, 120) == 120);  // no window: every stored token
  CHECK(quantized_length(parse_scheme("int8-head+w0"), 100, 120) == 100);
  CHECK(quantized_length(parse_scheme("int8-head+w30"), 100, 120) == 70);
  CHECK(quantized_length(parse_scheme("int8-head+w300"), 100, 120) == 0);
  CHECK(quantized_length(parse_scheme("int4-chan-t32-asym+w37"), 100, 100) == 32);  // 63 -> 32
  CHECK(quantized_length(parse_scheme("int4-chan-t32-asym+w4"), 100, 100) == 96);
  CHECK(quantized_length(parse_scheme("int4-chan-t32-asym+w128"), 100, 100) == 0);
  const int32_t lens[] = {5, 200};
  CHECK(test::message_of<InputError>([&] { window_boundaries(parse_scheme("int8-head+w2"), {2, 1, 100, 8}, lens); }) ==
        "int8-head+w2: seq_lens[1] = 200 is outside [0, 100] (the tensor's tokens)");
}

TEST_CASE("W = 0 quantizes exactly like the plain scheme") {
  const KvShape shape{2, 3, 40, 16};
  const std::vector<float> x = test::random_normal(shape.numel(), 1);
  for (const char* name : {"int8-tensor", "int4-token-asym", "int4-g8", "int4-chan-t8-asym", "fp8-e4m3-head", "fp8-e4m3"}) {
    CAPTURE(name);
    const QuantizedKv plain = quantize(KvView::bnsh(x.data(), shape), parse_scheme(name), "K");
    const QuantizedKv w0 = quantize(KvView::bnsh(x.data(), shape), parse_scheme(std::string(name) + "+w0"), "K");
    CHECK(w0.codes == plain.codes);
    CHECK(w0.scales == plain.scales);
    CHECK(w0.zeros == plain.zeros);
    CHECK(dequantize(w0) == dequantize(plain));
  }
  // chan-tN: only whole token groups are quantized, so with T = 37 and N = 8 even W = 0 keeps the
  // partial group [32, 37) in full precision.
  const KvShape odd{1, 1, 37, 16};
  const QuantizedKv c = quantize(KvView::bnsh(x.data(), odd), parse_scheme("int4-chan-t8-asym+w0"), "K");
  CHECK(c.quantized_tokens == std::vector<int32_t>{32});
  CHECK(std::equal(x.begin() + 32 * 16, x.begin() + 37 * 16, dequantize(c).begin() + 32 * 16));
}

TEST_CASE("W >= T keeps every value: codes 0, no group statistics, exact reconstruction") {
  const KvShape shape{2, 2, 9, 8};
  const std::vector<float> x = test::random_normal(shape.numel(), 2);
  for (const char* name : {"int8-tensor+w9", "int4-head-asym+w100", "int4-chan-t4-asym+w9", "fp8-e5m2-token+w50"}) {
    CAPTURE(name);
    const QuantizedKv q = quantize(KvView::bnsh(x.data(), shape), parse_scheme(name), "K");
    CHECK(std::all_of(q.codes.begin(), q.codes.end(), [](uint8_t c) { return c == 0; }));
    CHECK(std::all_of(q.scales.begin(), q.scales.end(), [](float s) { return s == 0.0f; }));
    CHECK(std::all_of(q.zeros.begin(), q.zeros.end(), [](float z) { return z == 0.0f; }));
    CHECK(dequantize(q) == x);
    CHECK(bits_per_element(parse_scheme(name), shape) == 16.0);  // all kept, no group stores parameters
  }
}

TEST_CASE("W not a multiple of N: chan-tN quantizes whole token groups, statistics from them only") {
  const KvShape shape{1, 2, 100, 8};
  std::vector<float> x = test::random_normal(shape.numel(), 3);
  for (int64_t h = 0; h < 2; ++h) x[((h * 100) + 90) * 8 + 3] = 1000.0f;  // an outlier in the window only
  const QuantizedKv q = quantize(KvView::bnsh(x.data(), shape), parse_scheme("int4-chan-t32-asym+w37"), "K");
  REQUIRE(q.quantized_tokens == std::vector<int32_t>{32});
  // The quantized part equals quantizing tokens [0, 32) alone; the window's outlier does not show.
  const std::vector<float> head = prefix(x, shape, 0, 32);
  const QuantizedKv p = quantize(KvView::bnsh(head.data(), {1, 2, 32, 8}), parse_scheme("int4-chan-t32-asym"), "K");
  const std::vector<float> x_hat = dequantize(q), p_hat = dequantize(p);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t = 0; t < 100; ++t)
      for (int64_t d = 0; d < 8; ++d) {
        const int64_t i = (h * 100 + t) * 8 + d;
        if (t < 32) REQUIRE(x_hat[i] == p_hat[(h * 32 + t) * 8 + d]);
        else REQUIRE(x_hat[i] == x[i]);
      }
  // Scales: groups of token block 0 as in p, blocks 1..3 all-window (0).
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t tg = 0; tg < 4; ++tg)
      for (int64_t d = 0; d < 8; ++d) {
        const float s = q.scales[(h * 4 + tg) * 8 + d];
        CHECK(s == (tg == 0 ? p.scales[h * 8 + d] : 0.0f));
      }
}

TEST_CASE("varlen: each sequence keeps its own last W tokens, per-tensor statistics cover quantized tokens only") {
  const KvShape shape{3, 2, 40, 8};
  std::vector<float> x = test::random_normal(shape.numel(), 5);
  const int32_t lens[] = {40, 25, 0};
  // Padding (t >= len) holds garbage that must not reach any statistic: it is in the window.
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t = 25; t < 40; ++t) x[((1 * 2 + h) * 40 + t) * 8] = 5000.0f;
  for (const char* name : {"int8-token+w10", "int4-g4-asym+w10", "int8-tensor+w10"}) {
    CAPTURE(name);
    const Scheme s = parse_scheme(name);
    const QuantizedKv q = quantize(KvView::bnsh(x.data(), shape), s, "K", lens);
    REQUIRE(q.quantized_tokens == std::vector<int32_t>{30, 15, 0});
    const std::vector<float> x_hat = dequantize(q);
    double amax = 0, err_max = 0;
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t t = 0; t < 40; ++t)
          for (int64_t d = 0; d < 8; ++d) {
            const int64_t i = ((b * 2 + h) * 40 + t) * 8 + d;
            if (t >= q.quantized_tokens[b]) {
              REQUIRE(x_hat[i] == x[i]);
            } else {
              amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
              err_max = std::max(err_max, std::fabs(static_cast<double>(x_hat[i]) - x[i]));
            }
          }
    if (s.granularity == Granularity::kTensor) {  // the one scale comes from quantized tokens only
      CHECK(q.scales[0] == symmetric_params(static_cast<float>(amax), s).scale);
      CHECK(err_max <= q.scales[0] / 2 * (1 + 1e-6));
    }
    if (s.granularity == Granularity::kToken) {  // b = 1 prefix equals quantizing those tokens alone
      const std::vector<float> p1 = prefix(x, shape, 1, 15);
      const QuantizedKv p = quantize(KvView::bnsh(p1.data(), {1, 2, 15, 8}), parse_scheme("int8-token"), "K");
      for (int64_t t = 0; t < 15; ++t) CHECK(q.scales[1 * 40 + t] == p.scales[t]);
      for (int64_t t = 15; t < 40; ++t) CHECK(q.scales[1 * 40 + t] == 0.0f);
    }
  }
}

TEST_CASE("memory of a window: quantized tokens cost their codes and scales, window tokens 16 bits") {
  const KvShape shape{1, 2, 100, 8};
  // int8-head+w20: 80 tokens x (8 code bytes + 2 scale bytes), 20 tokens x 16 bytes, per head.
  CHECK(bytes_per_token_per_head(parse_scheme("int8-head+w20"), shape) == doctest::Approx((80 * 10 + 20 * 16) / 100.0));
  CHECK(bytes_per_token_per_head(parse_scheme("int8-head"), shape) == doctest::Approx(10.0));
  // Varlen: lens 100 and 10 with W = 20 -> 80 and 0 quantized tokens of each head's 100.
  const KvShape two{2, 1, 100, 8};
  const int32_t lens[] = {100, 10};
  CHECK(bytes_per_token_per_head(parse_scheme("int8-head+w20"), two, lens) ==
        doctest::Approx((80 * 10 + 120 * 16) / 200.0));
  // chan-t32 + w37 over 100 tokens: 32 quantized tokens x 4 bytes, one token group of 8 channels
  // with scale and zero point (4 bytes each group) per head.
  CHECK(bytes_per_token_per_head(parse_scheme("int4-chan-t32-asym+w37"), shape) ==
        doctest::Approx((32 * 4 + 68 * 16 + 8 * 4) / 100.0));
}

TEST_CASE("golden: int4-token-asym+w1 on two hand-computed tokens") {
  // T = 2, W = 1: token 0 quantized (lo 0, hi 3: z = 0, s = rd(3 / 15) = fp16(0.2) = 0.199951171875,
  // codes 0 and round(15.004) = 15 -> byte 0xf0), token 1 kept (code byte 0, its group's scale and
  // zero point 0, values exact).
  const std::vector<float> x = {0.0f, 3.0f, 100.0f, -100.0f};
  const QuantizedKv q = quantize(KvView::bnsh(x.data(), {1, 1, 2, 2}), parse_scheme("int4-token-asym+w1"), "K");
  CHECK(q.scales == std::vector<float>{0.199951171875f, 0.0f});
  CHECK(q.zeros == std::vector<float>{0.0f, 0.0f});
  CHECK(q.codes == std::vector<uint8_t>{0xf0, 0x00});
  CHECK(dequantize(q) == std::vector<float>{0.0f, 2.999267578125f, 100.0f, -100.0f});
}
