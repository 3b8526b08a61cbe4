// The gate's special values for the block formats (experiments/gate/block_special_values.hpp) reach
// the corners they are named for: checked here on the CPU codec, so that the GPU gate's cases are
// known to exercise them.
#include <doctest/doctest.h>

#include <algorithm>

#include "experiments/gate/block_special_values.hpp"
#include "quant/block_formats.hpp"
#include "quant/quantize.hpp"

using namespace kvq;

namespace {

QuantizedKv quantized(const char* scheme, const KvShape& shape, const std::vector<float>& x) {
  return quantize(KvView::bnsh(x.data(), shape), parse_scheme(scheme), "K");
}

// Scale of block i (of 32; nvfp4: of 16) in row r.
float scale_of(const QuantizedKv& q, int64_t r, int64_t i) { return q.scales[r * (q.shape.head_dim / q.scheme.group) + i]; }

}  // namespace

TEST_CASE("block special values hit the rules' corners") {
  const KvShape shape{1, 1, 12, 128};
  const std::vector<float> x = block_special_values(shape);
  SUBCASE("d = 1 where the ties are meant to be") {
    CHECK(scale_of(quantized("q8_0", shape, x), 0, 0) == 1.0f);
    CHECK(scale_of(quantized("q4_0", shape, x), 1, 0) == 1.0f);
    CHECK(scale_of(quantized("q5_0", shape, x), 2, 0) == 1.0f);
    const QuantizedKv q41 = quantized("q4_1", shape, x), q51 = quantized("q5_1", shape, x);
    CHECK(scale_of(q41, 3, 0) == 1.0f);
    CHECK(q41.zeros[3 * 4] == 0.0f);
    CHECK(scale_of(q51, 3, 1) == 1.0f);
    const QuantizedKv iq = quantized("iq4_nl", shape, x);  // codes from d0 = 1: every table index appears
    std::vector<bool> seen(16, false);
    for (int64_t d = 0; d < 32; ++d) seen[static_cast<size_t>(iq.code(0, 0, 4, d))] = true;
    CHECK(std::count(seen.begin(), seen.end(), true) == 16);
  }
  SUBCASE("mxfp4: the rounded log2 lifts block 0's exponent, not block 1's; block 3 is below 2^-125") {
    const QuantizedKv q = quantized("mxfp4", shape, x);
    CHECK(scale_of(q, 5, 0) == 1.0f);  // amax 0x407fffff: floor(log2f) = 2, e = 127
    CHECK(scale_of(q, 5, 1) == 0.5f);  // amax 0x407ff000: floor 1
    CHECK(scale_of(q, 5, 3) == e8m0_value(0));
  }
  SUBCASE("nvfp4: s_t = 1 and the block pre-scales tie in e4m3 (to even: 1 and 1.25)") {
    const QuantizedKv q = quantized("nvfp4", shape, x);
    CHECK(q.tensor_scale == 1.0f);
    CHECK(scale_of(q, 6, 0) == 448.0f);
    CHECK(scale_of(q, 6, 2) == 1.0f);
    CHECK(scale_of(q, 6, 3) == 1.25f);
  }
  SUBCASE("fp16-subnormal d, and blocks whose 1/d overflows (codes 0)") {
    const QuantizedKv q = quantized("q8_0", shape, x);
    CHECK(scale_of(q, 7, 0) > 0.0f);
    CHECK(scale_of(q, 7, 0) < 6.103515625e-05f);
    for (int64_t d = 0; d < 32; ++d) CHECK(q.code(0, 0, 8, d) == 0);
  }
  CHECK_THROWS(block_special_values(KvShape{1, 1, 1, 48}));
}
