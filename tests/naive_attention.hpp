// An independent, deliberately plain attention in long double: the definition of DESIGN.md written
// as loops, used to check the Eigen reference.
#pragma once

#include <cmath>
#include <limits>
#include <vector>

namespace kvq::test {

struct NaiveShape {
  int64_t B, Hq, Hkv, Tq, T, D;
};

// BLOOM's construction: start * ratio^i with start = ratio = 2^(-8/c), then every other slope
// of the 2c construction.
inline std::vector<long double> bloom_slopes(int64_t n) {
  auto power_of_two_slopes = [](int64_t c) {
    const long double start = std::pow(2.0L, -8.0L / c);
    std::vector<long double> s;
    long double v = start;
    for (int64_t i = 0; i < c; ++i, v *= start) s.push_back(v);
    return s;
  };
  int64_t c = 1;
  while (c * 2 <= n) c *= 2;
  std::vector<long double> slopes = power_of_two_slopes(c);
  const std::vector<long double> extra = power_of_two_slopes(2 * c);
  for (int64_t j = 0; j < n - c; ++j) slopes.push_back(extra[2 * j]);
  return slopes;
}

struct NaiveOutput {
  std::vector<long double> o, lse;
};

inline NaiveOutput naive_attention(const NaiveShape& s, const std::vector<float>& q, const std::vector<float>& k,
                                   const std::vector<float>& v, const std::vector<int32_t>& seq_lens,
                                   long double scale, bool alibi) {
  NaiveOutput out{std::vector<long double>(s.B * s.Hq * s.Tq * s.D, 0.0L), std::vector<long double>(s.B * s.Hq * s.Tq)};
  const std::vector<long double> slopes = bloom_slopes(s.Hq);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.Tq; ++i) {
        const int64_t kvh = h / (s.Hq / s.Hkv), row = (b * s.Hq + h) * s.Tq + i;
        const int64_t pos = seq_lens[b] - s.Tq + i;
        if (pos < 0) {
          out.lse[row] = -std::numeric_limits<long double>::infinity();
          continue;
        }
        std::vector<long double> score(pos + 1);
        long double m = -std::numeric_limits<long double>::infinity();
        for (int64_t j = 0; j <= pos; ++j) {
          long double dot = 0;
          for (int64_t d = 0; d < s.D; ++d)
            dot += static_cast<long double>(q[row * s.D + d]) * k[((b * s.Hkv + kvh) * s.T + j) * s.D + d];
          score[j] = scale * dot - (alibi ? slopes[h] * (pos - j) : 0.0L);
          m = std::max(m, score[j]);
        }
        long double sum = 0;
        for (int64_t j = 0; j <= pos; ++j) sum += std::exp(score[j] - m);
        for (int64_t j = 0; j <= pos; ++j) {
          const long double p = std::exp(score[j] - m) / sum;
          for (int64_t d = 0; d < s.D; ++d) out.o[row * s.D + d] += p * v[((b * s.Hkv + kvh) * s.T + j) * s.D + d];
        }
        out.lse[row] = m + std::log(sum);
      }
  return out;
}

}  // namespace kvq::test
