#include "experiments/gate/large_logits.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "quant/errors.hpp"

namespace kvq {

LogitMode LogitMode::parse(const std::string& text) {
  if (text == "plain") return {kPlain};
  if (text == "large") return {kLarge};
  if (text == "negative") return {kNegative};
  const std::string prefix = "dominant@";
  if (text.rfind(prefix, 0) == 0) {
    try {
      size_t used = 0;
      const double at = std::stod(text.substr(prefix.size()), &used);
      if (used == text.size() - prefix.size() && at >= 0 && at <= 1) return {kDominant, at};
    } catch (const std::exception&) {
    }
  }
  throw InputError(fmt::format("logit mode '{}': expected plain, large, negative or dominant@F (0 <= F <= 1)", text));
}

std::string LogitMode::name() const {
  switch (kind) {
    case kPlain: return "plain";
    case kLarge: return "large";
    case kNegative: return "negative";
    case kDominant: return fmt::format("dominant@{:g}", at);
  }
  return "";
}

void shape_logits(std::vector<float>& q, std::vector<float>& k, const DecodeShape& s, const std::vector<int32_t>& lens,
                  const std::vector<LogitMode>& modes, double softmax_scale, uint32_t seed) {
  const int64_t D = s.head_dim, group = s.q_heads / s.kv_heads;
  // |k . u| that gives a score of kLogitTarget against a query kLogitScale * u
  const float c = static_cast<float>(kLogitTarget / (kLogitScale * softmax_scale));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t b = 0; b < s.batch && b < static_cast<int64_t>(modes.size()); ++b) {
    const LogitMode& m = modes[b];
    const int64_t n = lens.empty() ? s.tokens : lens[b];
    if (m.kind == LogitMode::kPlain) continue;
    if (m.kind == LogitMode::kLarge) {
      for (int64_t i = b * s.q_heads * D; i < (b + 1) * s.q_heads * D; ++i) q[i] *= kLogitScale;
      continue;
    }
    for (int64_t h = 0; h < s.kv_heads; ++h) {  // one direction u per KV head; its query heads all along u
      std::vector<float> u(D);
      double norm = 0;
      for (float& x : u) x = normal(rng), norm += double(x) * x;
      for (float& x : u) x = static_cast<float>(x / std::sqrt(norm));
      for (int64_t qh = h * group; qh < (h + 1) * group; ++qh)
        for (int64_t d = 0; d < D; ++d) q[(b * s.q_heads + qh) * D + d] = kLogitScale * u[d];
      auto key = [&](int64_t t) { return k.data() + ((b * s.kv_heads + h) * s.tokens + t) * D; };
      if (m.kind == LogitMode::kNegative) {
        for (int64_t t = 0; t < n; ++t)
          for (int64_t d = 0; d < D; ++d) key(t)[d] -= c * u[d];
      } else if (n > 0) {
        const int64_t j = std::min<int64_t>(n - 1, static_cast<int64_t>(m.at * static_cast<double>(n)));
        for (int64_t d = 0; d < D; ++d) key(j)[d] += c * u[d];
      }
    }
  }
}

}  // namespace kvq
