// Whole-tensor CPU quantization against the scalar codec, element by element, with group
// membership recomputed independently.
#include <doctest/doctest.h>

#include <cmath>
#include <map>

#include "quant/quantize.hpp"
#include "test_util.hpp"

using namespace kvq;

namespace {

const char* kAllSchemes[] = {"int8-tensor",    "int8-token",     "int8-head",     "int8-g16",      "int8-g8-asym",
                             "int8-head-asym", "int8-chan-t4",   "int4-tensor",   "int4-token-asym", "int4-head",
                             "int4-head-asym", "int4-g16-asym",  "int4-g8",       "int4-chan-t4",  "int4-chan-t3-asym",
                             "int8-head-fp32", "int4-g8-asym-fp32", "int8-token-fp32", "fp8-e4m3-tensor",
                             "fp8-e4m3-token", "fp8-e5m2-head", "fp8-e4m3-g8-fp32", "fp8-e5m2-g16"};

// Independent grouping: the group of each element by direct index arithmetic on the definitions.
int64_t naive_group(const Scheme& s, int64_t b, int64_t h, int64_t t, int64_t d) {
  switch (s.granularity) {
    case Granularity::kTensor: return 0;
    case Granularity::kToken: return b * 1000000 + t;
    case Granularity::kHead: return (b * 1000 + h) * 1000000 + t;
    case Granularity::kGroup: return ((b * 1000 + h) * 1000000 + t) * 1000 + d / s.group;
    case Granularity::kChannel: return ((b * 1000 + h) * 1000000 + t / s.group) * 1000 + d;
  }
  return -1;
}

}  // namespace

TEST_CASE("group boxes partition the tensor and invert group_of") {
  const KvShape shape{2, 3, 7, 16};
  for (const char* name : kAllSchemes) {
    CAPTURE(name);
    const Scheme s = parse_scheme(name);
    std::vector<int> hits(shape.numel(), 0);
    int64_t covered = 0;
    for (int64_t g = 0; g < num_groups(s, shape); ++g) {
      const GroupBox box = group_box(s, shape, g);
      covered += box.size();
      for (int64_t b = box.b0; b < box.b1; ++b)
        for (int64_t h = box.h0; h < box.h1; ++h)
          for (int64_t t = box.t0; t < box.t1; ++t)
            for (int64_t d = box.d0; d < box.d1; ++d) {
              REQUIRE(group_of(s, shape, b, h, t, d) == g);
              ++hits[((b * shape.heads + h) * shape.tokens + t) * shape.head_dim + d];
            }
    }
    CHECK(covered == shape.numel());
    for (int h : hits) REQUIRE(h == 1);
  }
}

TEST_CASE("tensor quantizer equals the scalar codec byte for byte for every scheme") {
  const KvShape shape{2, 3, 7, 16};
  std::vector<float> x = test::random_normal(shape.numel(), 3);
  for (size_t i = 0; i < x.size(); i += 37) x[i] *= 50.0f;  // outliers
  x[5] = 0.5f;
  for (const char* name : kAllSchemes) {
    CAPTURE(name);
    const Scheme s = parse_scheme(name);
    const QuantizedKv q = quantize(KvView::bnsh(x.data(), shape), s, "K");
    REQUIRE(q.scales.size() == static_cast<size_t>(num_groups(s, shape)));
    REQUIRE(q.zeros.size() == (s.asymmetric ? q.scales.size() : 0));
    REQUIRE(q.codes.size() == static_cast<size_t>(shape.numel() * s.bits / 8));

    // Recompute every group's parameters from the naive grouping.
    std::map<int64_t, GroupStats> stats;
    for (int64_t b = 0; b < shape.batch; ++b)
      for (int64_t h = 0; h < shape.heads; ++h)
        for (int64_t t = 0; t < shape.tokens; ++t)
          for (int64_t d = 0; d < shape.head_dim; ++d)
            stats[naive_group(s, b, h, t, d)].add(x[((b * shape.heads + h) * shape.tokens + t) * shape.head_dim + d]);
    REQUIRE(stats.size() == q.scales.size());

    const std::vector<float> x_hat = dequantize(q);
    std::vector<uint8_t> expected_codes(q.codes.size(), 0);
    for (int64_t b = 0; b < shape.batch; ++b)
      for (int64_t h = 0; h < shape.heads; ++h)
        for (int64_t t = 0; t < shape.tokens; ++t)
          for (int64_t d = 0; d < shape.head_dim; ++d) {
            const int64_t i = ((b * shape.heads + h) * shape.tokens + t) * shape.head_dim + d;
            const GroupParams p = group_params(stats[naive_group(s, b, h, t, d)], s);
            const int64_t g = group_of(s, shape, b, h, t, d);
            REQUIRE(q.scales[g] == p.scale);
            if (s.asymmetric) REQUIRE(q.zeros[g] == p.zero);
            const int code = encode(x[i], p, s);
            REQUIRE(q.code(b, h, t, d) == code);
            REQUIRE(float_bits(x_hat[i]) == float_bits(decode(code, p, s)));
            if (s.bits == 8) expected_codes[i] = code_to_byte(code);
            else expected_codes[i / 2] |= static_cast<uint8_t>(code_to_nibble(code) << (4 * (i % 2)));
          }
    CHECK(q.codes == expected_codes);
  }
}

TEST_CASE("BSNH input gives the same result as BNSH") {
  const KvShape shape{2, 4, 9, 8};
  const std::vector<float> bnsh = test::random_normal(shape.numel(), 4);
  std::vector<float> bsnh(bnsh.size());
  for (int64_t b = 0; b < shape.batch; ++b)
    for (int64_t h = 0; h < shape.heads; ++h)
      for (int64_t t = 0; t < shape.tokens; ++t)
        for (int64_t d = 0; d < shape.head_dim; ++d)
          bsnh[((b * shape.tokens + t) * shape.heads + h) * shape.head_dim + d] =
              bnsh[((b * shape.heads + h) * shape.tokens + t) * shape.head_dim + d];
  for (const char* name : {"int8-token", "int4-g4-asym", "int4-chan-t4"}) {
    CAPTURE(name);
    const QuantizedKv a = quantize(KvView::bnsh(bnsh.data(), shape), parse_scheme(name), "V");
    const QuantizedKv c = quantize(KvView::bsnh(bsnh.data(), shape), parse_scheme(name), "V");
    CHECK(a.codes == c.codes);
    CHECK(a.scales == c.scales);
    CHECK(a.zeros == c.zeros);
  }
}

TEST_CASE("per-tensor quantization of a large tensor is deterministic and uses the global max") {
  const KvShape shape{4, 2, 300, 64};
  std::vector<float> x = test::random_normal(shape.numel(), 5);
  x[shape.numel() - 3] = -40.0f;
  const QuantizedKv q1 = quantize(KvView::bnsh(x.data(), shape), parse_scheme("int8-tensor"), "K");
  const QuantizedKv q2 = quantize(KvView::bnsh(x.data(), shape), parse_scheme("int8-tensor"), "K");
  REQUIRE(q1.scales.size() == 1);
  CHECK(q1.scales[0] == round_to_fp16(40.0f / 127.0f));
  CHECK(q1.codes == q2.codes);
}

TEST_CASE("a symmetric per-tensor scheme quantizes with a given scale, stored in its dtype, codes saturating") {
  const KvShape shape{2, 3, 7, 16};
  std::vector<float> x = test::random_normal(shape.numel(), 8);
  x[5] = 900.0f, x[6] = -900.0f;  // far beyond 127 and FMAX times the scale: saturate
  const KvView view = KvView::bnsh(x.data(), shape);
  for (const char* name : {"int8-tensor", "int4-tensor", "fp8-e4m3-tensor", "fp8-e5m2-tensor-fp32"}) {
    CAPTURE(name);
    const Scheme s = parse_scheme(name);
    const float given = 0.0123f;
    const QuantizedKv q = quantize(view, s, "K", nullptr, given);
    REQUIRE(q.scales.size() == 1);
    CHECK(q.scales[0] == round_to_scale_dtype(given, s.scale_dtype));
    const GroupParams p = stored_params(q.scales[0], 0.0f);
    for (int64_t i = 0; i < shape.numel(); ++i) {
      const int64_t d = i % 16, r = i / 16;
      REQUIRE(q.code(r / (3 * 7), (r / 7) % 3, r % 7, d) == encode(x[i], p, s));
    }
    // the outliers come back as the largest magnitude the codes hold
    const float largest = s.fp8() ? fp8_format(s.format).max_value : static_cast<float>(s.qmax());
    CHECK(dequantize(q)[5] == largest * q.scales[0]);
    CHECK(dequantize(q)[6] == -largest * q.scales[0]);
    // A given scale differs from the computed one, which the whole tensor's amax sets.
    CHECK(quantize(view, s, "K").scales[0] != q.scales[0]);
  }
  using test::message_of;
  const Scheme s = parse_scheme("fp8-e4m3-tensor");
  for (float bad : {0.0f, -1.0f, NAN, INFINITY, 1e6f, 1e-30f})
    CHECK(message_of<InputError>([&] { quantize(view, s, "K", nullptr, bad); }).find("must be finite and > 0, also as "
                                                                                     "its float16") != std::string::npos);
  CHECK(message_of<InputError>([&] { quantize(view, parse_scheme("int8-tensor-asym"), "K", nullptr, 1.0f); })
            .find("int8-tensor-asym: a tensor scale is given, but only nvfp4 and the symmetric") == 0);
  CHECK(message_of<InputError>([&] { quantize(view, parse_scheme("int8-head"), "K", nullptr, 1.0f); })
            .find("but only nvfp4") != std::string::npos);
}

TEST_CASE("non-finite input is rejected naming the tensor and the first bad index") {
  const KvShape shape{2, 2, 5, 8};
  std::vector<float> x = test::random_normal(shape.numel(), 6);
  x[((1 * 2 + 0) * 5 + 3) * 8 + 6] = INFINITY;
  x[((1 * 2 + 1) * 5 + 0) * 8 + 1] = NAN;
  const std::string msg = test::message_of<InputError>(
      [&] { quantize(KvView::bnsh(x.data(), shape), parse_scheme("int8-head"), "layer 3 K"); });
  CHECK(msg == "layer 3 K: non-finite value inf at [1, 0, 3, 6] (quantizers accept finite input only)");
  x[2] = -NAN;
  CHECK(test::message_of<InputError>([&] { quantize(KvView::bnsh(x.data(), shape), parse_scheme("int4-g4"), "V"); })
            .find("V: non-finite value") == 0);
  CHECK(test::message_of<InputError>([&] { quantize(KvView::bnsh(x.data(), shape), parse_scheme("int4-g4"), "V"); })
            .find("at [0, 0, 0, 2]") != std::string::npos);
}

TEST_CASE("a scale that overflows fp16 is an error but fp32 scales take it") {
  const KvShape shape{1, 1, 2, 4};
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 1e6f};
  const std::string msg = test::message_of<InputError>(
      [&] { quantize(KvView::bnsh(x.data(), shape), parse_scheme("int4-head"), "K"); });
  CHECK(msg.find("K: int4-head group 1 starting at [0, 0, 1, 0]") == 0);
  CHECK(msg.find("use -fp32 scales") != std::string::npos);
  CHECK_NOTHROW(quantize(KvView::bnsh(x.data(), shape), parse_scheme("int4-head-fp32"), "K"));
}

TEST_CASE("a scheme that does not fit the head_dim is rejected before any work") {
  const KvShape shape{1, 1, 2, 128};
  std::vector<float> x(shape.numel(), 1.0f);
  CHECK(test::message_of<SchemeError>(
            [&] { quantize(KvView::bnsh(x.data(), shape), parse_scheme("int4-g48"), "K"); }) ==
        "int4-g48: group size 48 does not divide head_dim 128");
}

TEST_CASE("empty tensors quantize to empty results") {
  const KvShape shape{0, 2, 5, 8};
  const QuantizedKv q = quantize(KvView::bnsh(nullptr, shape), parse_scheme("int8-head"), "K");
  CHECK(q.codes.empty());
  CHECK(q.scales.empty());
  CHECK(dequantize(q).empty());
}
