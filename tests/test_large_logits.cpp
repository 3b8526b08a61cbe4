// The decode gate's large-logit cases (experiments/gate/large_logits.hpp): each mode gives the scores
// it names, in its own sequence only, and the fp64 reference stays finite over them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "experiments/gate/large_logits.hpp"
#include "quant/errors.hpp"
#include "reference/attention.hpp"

using namespace kvq;

namespace {

std::vector<float> normal(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Highest and lowest score of sequence b over its first n keys, every query head.
std::pair<double, double> score_range(const std::vector<float>& q, const std::vector<float>& k, const DecodeShape& s,
                                      int64_t b, int64_t n, double scale) {
  double hi = -INFINITY, lo = INFINITY;
  for (int64_t h = 0; h < s.q_heads; ++h)
    for (int64_t t = 0; t < n; ++t) {
      double dot = 0;
      for (int64_t d = 0; d < s.head_dim; ++d)
        dot += double(q[(b * s.q_heads + h) * s.head_dim + d]) *
               k[((b * s.kv_heads + h / (s.q_heads / s.kv_heads)) * s.tokens + t) * s.head_dim + d];
      hi = std::max(hi, dot * scale), lo = std::min(lo, dot * scale);
    }
  return {hi, lo};
}

}  // namespace

TEST_CASE("large-logit modes give the scores they name, each in its own sequence") {
  const DecodeShape s{"", 4, 6, 2, 90, 64};
  const std::vector<int32_t> lens = {90, 90, 45, 90};
  std::vector<float> q = normal(s.batch * s.q_heads * s.head_dim, 1), k = normal(s.batch * s.kv_heads * s.tokens * s.head_dim, 2);
  const std::vector<LogitMode> modes = {LogitMode::parse("plain"), LogitMode::parse("large"),
                                        LogitMode::parse("negative"), LogitMode::parse("dominant@0.25")};
  const double scale = 1.0 / 8.0;
  shape_logits(q, k, s, lens, modes, scale, 7);
  const auto plain = score_range(q, k, s, 0, 90, scale), large = score_range(q, k, s, 1, 90, scale);
  const auto negative = score_range(q, k, s, 2, 45, scale), dominant = score_range(q, k, s, 3, 90, scale);
  CHECK(plain.first < 20);
  CHECK(plain.second > -20);
  CHECK(large.first > 88.7);  // past float32's exp range, both signs
  CHECK(large.second < -88.7);
  CHECK(negative.first < -200);  // every key far below zero
  CHECK(dominant.first > 250);
  CHECK(score_range(q, k, s, 3, 22, scale).first < 100);  // keys 0..21: the dominating key is key 22
  // the fp64 reference is finite over all of it
  AttentionProblem p;
  p.batch = s.batch, p.q_heads = s.q_heads, p.kv_heads = s.kv_heads, p.q_len = 1, p.head_dim = s.head_dim;
  p.q = q.data();
  const KvShape kv{s.batch, s.kv_heads, s.tokens, s.head_dim};
  p.k = KvView::bnsh(k.data(), kv), p.v = KvView::bnsh(k.data(), kv);
  p.seq_lens = lens.data();
  p.softmax_scale = scale;
  const AttentionOutput out = attention(p);
  CHECK(std::all_of(out.o.begin(), out.o.end(), [](double x) { return std::isfinite(x); }));
  CHECK(std::all_of(out.lse.begin(), out.lse.end(), [](double x) { return std::isfinite(x); }));
}

TEST_CASE("logit modes parse and name themselves, and an unknown one is named in the error") {
  CHECK(LogitMode::parse("dominant@1").name() == "dominant@1");
  CHECK(LogitMode::parse("negative").kind == LogitMode::kNegative);
  CHECK_THROWS_WITH_AS(LogitMode::parse("dominant@2"), doctest::Contains("logit mode 'dominant@2'"), InputError);
  CHECK_THROWS_AS(LogitMode::parse("huge"), InputError);
}
