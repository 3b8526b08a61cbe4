// FBGEMM inline-row int4 layout: golden rows, row sizes, lossless conversion.
#include <doctest/doctest.h>

#include "quant/fbgemm_layout.hpp"
#include "quant/quantize.hpp"
#include "test_util.hpp"

using namespace kvq;

TEST_CASE("golden: one FBGEMM row for a hand-computed input") {
  const std::vector<float> x = {-1.0f, 0.0f, 6.5f, 2.75f, 1.0f, 2.0f, 3.0f, 4.0f};
  const KvShape shape{1, 1, 1, 8};
  SUBCASE("row-wise (int4-head-asym): scale 0.5, shift -1, then codes 0 2 15 8 4 6 8 10") {
    const FbgemmRows rows = quantize_fbgemm(KvView::bnsh(x.data(), shape), parse_scheme("int4-head-asym"), "K");
    CHECK(rows.row_bytes == 8);
    CHECK(rows.bytes == std::vector<uint8_t>{0x00, 0x38, 0x00, 0xbc, 0x20, 0x8f, 0x64, 0xa8});
  }
  SUBCASE("two groups (int4-g4-asym): group 1 has scale rd(3/15) = 0x3266, shift 1") {
    const FbgemmRows rows = quantize_fbgemm(KvView::bnsh(x.data(), shape), parse_scheme("int4-g4-asym"), "K");
    CHECK(rows.row_bytes == 12);
    CHECK(rows.bytes ==
          std::vector<uint8_t>{0x00, 0x38, 0x00, 0xbc, 0x66, 0x32, 0x00, 0x3c, 0x20, 0x8f, 0x50, 0xfa});
  }
}

TEST_CASE("FBGEMM row sizes and supported schemes") {
  CHECK(fbgemm_row_bytes(parse_scheme("int4-head-asym"), 128) == 68);
  CHECK(fbgemm_row_bytes(parse_scheme("int4-g32-asym"), 128) == 80);
  CHECK(fbgemm_row_bytes(parse_scheme("int4-g64-asym"), 128) == 72);
  CHECK(fbgemm_row_bytes(parse_scheme("int4-g16-asym"), 128) == 96);
  using test::message_of;
  CHECK(message_of<SchemeError>([] { fbgemm_row_bytes(parse_scheme("int4-g8-asym"), 128); }) ==
        "int4-g8-asym: the FBGEMM inline-row layout needs 1, 2, 4 or 8 groups per row, head_dim 128 gives 16");
  CHECK(message_of<SchemeError>([] { fbgemm_row_bytes(parse_scheme("int4-head"), 128); })
            .find("int4 asymmetric codes with fp16 scales only") != std::string::npos);
  CHECK(message_of<SchemeError>([] { fbgemm_row_bytes(parse_scheme("int4-head-asym-fp32"), 128); })
            .find("fp16 scales only") != std::string::npos);
  CHECK(message_of<SchemeError>([] { fbgemm_row_bytes(parse_scheme("int4-token-asym"), 128); })
            .find("needs head or g<G> granularity") != std::string::npos);
}

TEST_CASE("planar <-> FBGEMM conversion is lossless with rows ordered B T H") {
  const KvShape shape{2, 3, 5, 64};
  const std::vector<float> x = test::random_normal(shape.numel(), 12, 3.0f);
  for (const char* name : {"int4-head-asym", "int4-g32-asym", "int4-g16-asym", "int4-g8-asym"}) {
    CAPTURE(name);
    const QuantizedKv planar = quantize(KvView::bnsh(x.data(), shape), parse_scheme(name), "K");
    const FbgemmRows rows = to_fbgemm(planar);
    CHECK(rows.bytes.size() == static_cast<size_t>(shape.rows() * rows.row_bytes));
    const QuantizedKv back = from_fbgemm(rows);
    CHECK(back.codes == planar.codes);
    CHECK(back.scales == planar.scales);
    CHECK(back.zeros == planar.zeros);
    CHECK(to_fbgemm(back).bytes == rows.bytes);
    CHECK(dequantize(rows) == dequantize(planar));

    // Row (b=1, t=4, h=2) holds planar row (b=1, h=2, t=4).
    const int n = fbgemm_groups_per_row(planar.scheme, shape.head_dim);
    const uint8_t* row = rows.bytes.data() + ((1 * shape.tokens + 4) * shape.heads + 2) * rows.row_bytes;
    const int64_t planar_row = (1 * shape.heads + 2) * shape.tokens + 4;
    CHECK(fp16_bits_to_fp32(static_cast<uint16_t>(row[0] | row[1] << 8)) == planar.scales[planar_row * n]);
    CHECK(std::equal(row + 4 * n, row + rows.row_bytes, planar.codes.begin() + planar_row * shape.head_dim / 2));
  }
}

TEST_CASE("FBGEMM rows of the wrong size are rejected") {
  const KvShape shape{1, 2, 3, 8};
  const std::vector<float> x = test::random_normal(shape.numel(), 13);
  FbgemmRows rows = quantize_fbgemm(KvView::bnsh(x.data(), shape), parse_scheme("int4-head-asym"), "K");
  rows.bytes.pop_back();
  CHECK(test::message_of<InputError>([&] { from_fbgemm(rows); })
            .find("expected 6 rows of 8 bytes, got 47 bytes") != std::string::npos);
}

TEST_CASE("FBGEMM rows refuse FP8 and full-precision windows") {
  CHECK(test::message_of<SchemeError>([] { fbgemm_groups_per_row(parse_scheme("fp8-e4m3-head"), 128); })
            .find("int4 asymmetric codes with fp16 scales only") != std::string::npos);
  CHECK(test::message_of<SchemeError>([] { fbgemm_groups_per_row(parse_scheme("int4-head-asym+w64"), 128); }) ==
        "int4-head-asym+w64: the FBGEMM inline-row layout holds no full-precision window (+w)");
  CHECK(fbgemm_groups_per_row(parse_scheme("int4-g32-asym+had"), 128) == 4);  // rotated codes: an ordinary layout
}
