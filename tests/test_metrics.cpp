#include <doctest/doctest.h>

#include <cmath>

#include "quant/scheme.hpp"
#include "reference/metrics.hpp"
#include "test_util.hpp"

using namespace kvq;

TEST_CASE("SQNR and max abs on hand-computed values") {
  const std::vector<float> x = {3, 4}, x_hat = {3, 3.5f};
  CHECK(sqnr_db(x, x_hat) == doctest::Approx(10 * std::log10(25 / 0.25)));  // 20 dB
  CHECK(std::isinf(sqnr_db(x, x)));
  CHECK(max_abs_difference(x, x_hat) == 0.5);
  CHECK(std::isnan(max_abs_difference(x, std::vector<float>{std::nanf(""), 3.5f})));  // not dropped by std::max
  CHECK(test::message_of<InputError>([] { sqnr_db({1, 2}, {1}); }) == "sqnr_db: inputs differ in size (2 vs 1)");
}

TEST_CASE("output error: rel-L2 and cosine per head with mean and max") {
  // Two heads of two values: head 0 exact, head 1 off by (0, 1) from (3, 4).
  const std::vector<double> ref = {1, 0, 3, 4}, test = {1, 0, 3, 5};
  const OutputError e = output_error(test, ref, 2);
  CHECK(e.rel_l2_max == doctest::Approx(1.0 / 5));
  CHECK(e.rel_l2_mean == doctest::Approx(0.1));
  CHECK(e.max_abs == 1.0);
  CHECK(e.cosine_min == doctest::Approx((9.0 + 20) / (5 * std::sqrt(34.0))));
  CHECK(e.cosine_mean == doctest::Approx((1 + (9.0 + 20) / (5 * std::sqrt(34.0))) / 2));
  // An all-zero reference head (empty key set) is skipped.
  CHECK(output_error({0, 0, 3, 5}, {0, 0, 3, 4}, 2).rel_l2_mean == doctest::Approx(0.2));
  // ... unless the output is not zero there: an error over nothing, not a perfect head
  const OutputError off = output_error({1, 0, 3, 4}, {0, 0, 3, 4}, 2);
  CHECK(std::isinf(off.rel_l2_max));
  CHECK(off.cosine_min == 0.0);
  CHECK(off.max_abs == 1.0);
  // A NaN output shows in every summary (std::max would drop it: max_abs 0, rel-L2 max -inf)
  const OutputError nan = output_error({std::nan(""), 0, 3, 4}, {1, 0, 3, 4}, 2);
  CHECK(std::isnan(nan.max_abs));
  CHECK(std::isnan(nan.rel_l2_max));
  CHECK(std::isnan(nan.rel_l2_mean));
  CHECK(std::isnan(nan.cosine_min));
}

TEST_CASE("probability error: KL and top-k overlap") {
  const std::vector<double> ref = {0.5, 0.25, 0.25, 0.0}, test = {0.25, 0.5, 0.25, 0.0};
  const ProbabilityError e = probability_error(test, ref, 4, 1);
  CHECK(e.kl_mean == doctest::Approx(0.5 * std::log(2.0) + 0.25 * std::log(0.5)));
  CHECK(e.topk_overlap_mean == 0.0);  // top-1 differs
  CHECK(probability_error(test, ref, 4, 3).topk_overlap_mean == 1.0);  // k capped at the support, 3
  CHECK(probability_error(ref, ref, 4, 2).kl_max == 0.0);
  const ProbabilityError nan = probability_error({0.5, std::nan(""), 0.25, 0.0}, ref, 4, 2);
  CHECK(std::isnan(nan.kl_max));
  CHECK(std::isnan(nan.topk_overlap_min));
}

TEST_CASE("memory per token and head includes amortized scales") {
  const KvShape shape{2, 8, 1024, 128};
  CHECK(bytes_per_token_per_head(parse_scheme("int8-head"), shape) == 130.0);
  CHECK(bytes_per_token_per_head(parse_scheme("int4-g32-asym"), shape) == 64.0 + 4 * 4);
  CHECK(bytes_per_token_per_head(parse_scheme("int8-token"), shape) == 128.0 + 2.0 / 8);
  CHECK(bytes_per_token_per_head(parse_scheme("int4-chan-t32"), shape) == 64.0 + 128 * 2.0 / 32);
  CHECK(bytes_per_token_per_head(parse_scheme("int8-tensor-fp32"), shape) == doctest::Approx(128.0 + 4.0 / (2 * 8 * 1024)));
  CHECK(bits_per_element(parse_scheme("int4-head-asym"), shape) == doctest::Approx(4.25));
}
