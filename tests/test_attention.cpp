// The fp64 reference against the naive loops; split-K; ALiBi; precision mimic; bad input.
#include <doctest/doctest.h>

#include <cmath>

#include "naive_attention.hpp"
#include "reference/attention.hpp"
#include "test_util.hpp"

using namespace kvq;

namespace {

struct Case {
  test::NaiveShape s;
  std::vector<float> q, k, v;
  std::vector<int32_t> seq_lens;
  bool alibi = false;
  double scale = 0.0;

  AttentionProblem problem() const {
    AttentionProblem p;
    p.batch = s.B, p.q_heads = s.Hq, p.kv_heads = s.Hkv, p.q_len = s.Tq, p.head_dim = s.D;
    p.q = q.data();
    p.k = KvView::bnsh(k.data(), {s.B, s.Hkv, s.T, s.D});
    p.v = KvView::bnsh(v.data(), {s.B, s.Hkv, s.T, s.D});
    p.seq_lens = seq_lens.data();
    p.alibi = alibi;
    p.softmax_scale = scale;
    return p;
  }
};

Case make_case(test::NaiveShape s, uint32_t seed, bool alibi) {
  Case c{s, test::random_normal(s.B * s.Hq * s.Tq * s.D, seed), test::random_normal(s.B * s.Hkv * s.T * s.D, seed + 1),
         test::random_normal(s.B * s.Hkv * s.T * s.D, seed + 2), {}, alibi};
  for (int64_t b = 0; b < s.B; ++b)  // mixed lengths: full, empty, and in between
    c.seq_lens.push_back(static_cast<int32_t>(b == 0 ? s.T : b == 1 ? 0 : (s.T * (seed % 5 + 1)) / 6));
  return c;
}

// max |a - b| / max |b| (norm-wise), with -inf LSEs required to match exactly.
template <typename A, typename B>
double relative_difference(const std::vector<A>& a, const std::vector<B>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, mag = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (std::isinf(y)) {
      REQUIRE(x == y);
      continue;
    }
    REQUIRE(std::isfinite(x));
    diff = std::max(diff, std::abs(x - y));
    mag = std::max(mag, std::abs(y));
  }
  return mag > 0 ? diff / mag : diff;
}

}  // namespace

TEST_CASE("fp64 reference agrees with the naive loops to 1e-12 (decode)") {
  uint32_t seed = 100;
  for (int64_t T : {0, 1, 2, 7, 64, 65, 1000})
    for (int64_t ratio : {1, 2, 4, 8})
      for (int64_t D : {8, 64, 128})
        for (bool alibi : {false, true}) {
          const int64_t hkv = 1 + seed % 2;
          const Case c = make_case({3, hkv * ratio, hkv, 1, T, D}, seed++, alibi);
          CAPTURE(T);
          CAPTURE(ratio);
          CAPTURE(D);
          CAPTURE(alibi);
          CAPTURE(hkv);
          const AttentionOutput got = attention(c.problem());
          const test::NaiveOutput want = test::naive_attention(c.s, c.q, c.k, c.v, c.seq_lens, c.problem().scale(), alibi);
          CHECK(relative_difference(got.o, want.o) <= 1e-12);
          CHECK(relative_difference(got.lse, want.lse) <= 1e-12);
        }
}

TEST_CASE("fp64 reference agrees with the naive loops for Tq > 1 (causal) and a custom scale") {
  for (int64_t tq : {2, 5})
    for (bool alibi : {false, true}) {
      Case c = make_case({3, 8, 2, tq, 65, 64}, static_cast<uint32_t>(7 * tq + alibi), alibi);
      c.seq_lens[1] = 3;  // shorter than Tq: the first query rows see no keys
      c.scale = 0.3;
      CAPTURE(tq);
      CAPTURE(alibi);
      const AttentionOutput got = attention(c.problem());
      const test::NaiveOutput want = test::naive_attention(c.s, c.q, c.k, c.v, c.seq_lens, 0.3L, alibi);
      CHECK(relative_difference(got.o, want.o) <= 1e-12);
      CHECK(relative_difference(got.lse, want.lse) <= 1e-12);
    }
}

TEST_CASE("empty key sets give O = 0 and LSE = -inf and NaN in padding is ignored") {
  Case c = make_case({2, 4, 2, 1, 16, 8}, 9, true);
  c.seq_lens = {0, 10};
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t = 10; t < 16; ++t)
      for (int64_t d = 0; d < 8; ++d) {
        c.k[((1 * 2 + h) * 16 + t) * 8 + d] = NAN;
        c.v[((1 * 2 + h) * 16 + t) * 8 + d] = -INFINITY;
      }
  const AttentionOutput out = attention(c.problem());
  for (int64_t i = 0; i < 4 * 8; ++i) CHECK(out.o[i] == 0.0);
  for (int64_t h = 0; h < 4; ++h) CHECK(out.lse[h] == -INFINITY);
  for (double x : out.o) REQUIRE(std::isfinite(x));
  for (int64_t h = 4; h < 8; ++h) CHECK(std::isfinite(out.lse[h]));
}

TEST_CASE("split-K merge equals the single pass including empty splits") {
  const Case c = make_case({3, 8, 2, 1, 65, 64}, 21, true);
  const AttentionOutput single = attention(c.problem());
  for (int64_t splits : {1, 2, 3, 7, 65 + 3}) {
    CAPTURE(splits);
    const AttentionOutput merged = split_k_attention(c.problem(), splits);
    CHECK(relative_difference(merged.o, single.o) <= 1e-12);
    CHECK(relative_difference(merged.lse, single.lse) <= 1e-12);
  }
  SUBCASE("partials of an empty range are O = 0, LSE = -inf and vanish in the merge") {
    const AttentionOutput empty = attention(c.problem(), {}, {40, 40});
    for (double l : empty.lse) CHECK(l == -INFINITY);
    const AttentionOutput merged = merge_partials({empty, single, empty});
    CHECK(relative_difference(merged.o, single.o) <= 1e-15);
  }
  CHECK(test::message_of<InputError>([&] { split_k_attention(c.problem(), 0); }).find("splits must be positive") !=
        std::string::npos);
}

TEST_CASE("ALiBi slopes match the closed form (BLOOM) for powers of two and others") {
  for (int64_t n : {8, 12, 20, 40, 64}) {
    CAPTURE(n);
    const std::vector<double> got = alibi_slopes(n);
    const std::vector<long double> want = test::bloom_slopes(n);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - static_cast<double>(want[i])) <= 1e-15 * got[i]);
  }
  const std::vector<double> s12 = alibi_slopes(12);  // c = 8: 2^-1..2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
  CHECK(s12[0] == 0.5);
  CHECK(s12[7] == 1.0 / 256);
  CHECK(s12[8] == doctest::Approx(std::sqrt(0.5)).epsilon(1e-15));
  CHECK(s12[11] == doctest::Approx(std::pow(2.0, -3.5)).epsilon(1e-15));
}

TEST_CASE("precision mimic: fp64 profile is the reference and fp32/bf16 profiles stay close and round") {
  const Case c = make_case({2, 8, 2, 1, 300, 64}, 31, false);
  const AttentionOutput ref = attention(c.problem());
  const AttentionOutput same = attention(c.problem(), PrecisionProfile::parse("fp64"));
  CHECK(same.o == ref.o);
  const PrecisionProfile prof = PrecisionProfile::parse("fp32-pbf16-obf16");
  CHECK(prof.name() == "fp32-pbf16-obf16");
  const AttentionOutput mimic = attention(c.problem(), prof);
  const double err = relative_difference(mimic.o, ref.o);
  CHECK(err > 0);        // the rounding is real
  CHECK(err < 2e-2);     // bf16 P and output: a few bf16 ulps (2^-8) at most
  for (double x : mimic.o) REQUIRE(static_cast<double>(round_to_bf16(static_cast<float>(x))) == x);
  const AttentionOutput fp32 = attention(c.problem(), PrecisionProfile::parse("fp32"));
  const double err32 = relative_difference(fp32.o, ref.o);
  CHECK(err32 > 0);
  CHECK(err32 < 1e-5);
  CHECK(err32 < err);
  CHECK(test::message_of<InputError>([] { PrecisionProfile::parse("fp32-pint8"); }).find("fp32-pint8") !=
        std::string::npos);
}

namespace {
// One query over one key, D = 8, softmax scale 1: softmax = 1, so LSE = q . k shows the values the
// mimic multiplied.
AttentionProblem one_key_problem(std::vector<float>& q, std::vector<float>& k, std::vector<float>& v) {
  AttentionProblem p;
  p.batch = 1, p.q_heads = 1, p.kv_heads = 1, p.head_dim = 8, p.softmax_scale = 1.0;
  p.q = q.data();
  p.k = KvView::bnsh(k.data(), {1, 1, 1, 8}), p.v = KvView::bnsh(v.data(), {1, 1, 1, 8});
  return p;
}
}  // namespace

TEST_CASE("precision mimic: qfp16 rounds each query row to fp16 after scaling it by its power of two") {
  // One key along d = 1: LSE = q[1] shows the query value the mimic used.
  std::vector<float> q = {1.0f, std::ldexp(1.0f + std::ldexp(1.0f, -7), -34), 0, 0, 0, 0, 0, 0};
  std::vector<float> k = {0, 1, 0, 0, 0, 0, 0, 0}, v = {1, 2, 3, 4, 5, 6, 7, 8};
  const AttentionProblem p = one_key_problem(q, k, v);
  const PrecisionProfile prof = PrecisionProfile::parse("fp32-qfp16-pfp16-obf16");
  CHECK(prof.name() == "fp32-qfp16-pfp16-obf16");
  // max|q| = 1: scaled by 2^14, q[1] becomes 2^-20 (1 + 2^-7), an fp16 subnormal (steps of 2^-24): 2^-20
  CHECK(attention(p, prof).lse[0] == std::ldexp(1.0, -34));
  CHECK(attention(p, PrecisionProfile::parse("fp32")).lse[0] == static_cast<double>(q[1]));
  q[1] = std::ldexp(1.0f + std::ldexp(1.0f, -7), -10);  // fits fp16 after scaling: unchanged
  CHECK(attention(p, prof).lse[0] == static_cast<double>(q[1]));
  CHECK(PrecisionProfile::parse("fp32-qbf16").q_before_qk == RoundTo::kBf16);
}

TEST_CASE("precision mimic: kfp16 rounds each K value to fp16 before the product") {
  // LSE = k[0] shows the K value the mimic used.
  std::vector<float> q = {1, 0, 0, 0, 0, 0, 0, 0}, v(8, 1.0f);
  std::vector<float> k = {1.0f + std::ldexp(1.0f, -12), 0, 0, 0, 0, 0, 0, 0};  // a quarter fp16 step above 1
  const AttentionProblem p = one_key_problem(q, k, v);
  const PrecisionProfile prof = PrecisionProfile::parse("fp32-qfp16-kfp16-pfp16-obf16");
  CHECK(prof.name() == "fp32-qfp16-kfp16-pfp16-obf16");
  CHECK(prof.k_before_qk == RoundTo::kFp16);
  CHECK(attention(p, prof).lse[0] == 1.0);  // rounded to the nearest fp16, 1
  CHECK(attention(p, PrecisionProfile::parse("fp32-qfp16")).lse[0] == static_cast<double>(k[0]));
}

TEST_CASE("probabilities sum to one over the key set") {
  const Case c = make_case({3, 4, 2, 1, 50, 8}, 41, true);
  std::vector<double> probs;
  const AttentionOutput out = attention(c.problem(), {}, {}, &probs);
  REQUIRE(probs.size() == static_cast<size_t>(3 * 4 * 50));
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t h = 0; h < 4; ++h) {
      double sum = 0;
      for (int64_t j = 0; j < 50; ++j) {
        const double p = probs[(b * 4 + h) * 50 + j];
        if (j >= c.seq_lens[b]) CHECK(p == 0.0);
        sum += p;
      }
      CHECK(sum == doctest::Approx(c.seq_lens[b] > 0 ? 1.0 : 0.0).epsilon(1e-12));
    }
}

TEST_CASE("bad attention input raises a clear error") {
  Case c = make_case({2, 6, 4, 1, 8, 8}, 51, false);
  CHECK(test::message_of<InputError>([&] { attention(c.problem()); }) ==
        "attention: num_q_heads 6 is not a multiple of num_kv_heads 4");
  c = make_case({2, 4, 2, 1, 8, 8}, 52, false);
  c.seq_lens[1] = 9;
  CHECK(test::message_of<InputError>([&] { attention(c.problem()); }) ==
        "attention: seq_lens[1] = 9 is outside [0, T=8]");
  c.seq_lens[1] = 8;
  AttentionProblem p = c.problem();
  p.v.shape.tokens = 7;
  CHECK(test::message_of<InputError>([&] { attention(p); }) == "attention: V has shape [2, 2, 7, 8], expected [2, 2, 8, 8]");
}
