#include "reference/metrics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "quant/errors.hpp"
#include "quant/quantize.hpp"

namespace kvq {
namespace {

template <typename A, typename B>
void check_same_size(const std::vector<A>& a, const std::vector<B>& b, const char* metric) {
  if (a.size() != b.size())
    throw InputError(fmt::format("{}: inputs differ in size ({} vs {})", metric, a.size(), b.size()));
}

// Indices of the k largest entries (ties broken by lower index, so the result is deterministic).
std::vector<int64_t> top_k(const double* row, int64_t n, int64_t k) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int64_t a, int64_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

// max / min that carry a NaN through (std::max keeps whichever side is not NaN): a NaN output must
// show in the error, not vanish from it
double nan_max(double a, double b) { return std::isnan(a) || std::isnan(b) ? std::nan("") : std::max(a, b); }
double nan_min(double a, double b) { return std::isnan(a) || std::isnan(b) ? std::nan("") : std::min(a, b); }

// Mean, min and max of per-head or per-query values; `empty` stands in when there were none.
struct Summary {
  double sum = 0, min = std::numeric_limits<double>::infinity(), max = -std::numeric_limits<double>::infinity();
  int64_t count = 0;
  void add(double x) {
    sum += x, min = nan_min(min, x), max = nan_max(max, x);
    ++count;
  }
  double mean_or(double empty) const { return count ? sum / count : empty; }
  double min_or(double empty) const { return count ? min : empty; }
  double max_or(double empty) const { return count ? max : empty; }
};

}  // namespace

double sqnr_db(const std::vector<float>& x, const std::vector<float>& x_hat) {
  check_same_size(x, x_hat, "sqnr_db");
  double signal = 0, noise = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = static_cast<double>(x[i]) - x_hat[i];
    signal += static_cast<double>(x[i]) * x[i];
    noise += e * e;
  }
  if (noise == 0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(signal / noise);
}

template <typename A, typename B>
double max_abs_difference(const std::vector<A>& a, const std::vector<B>& b) {
  check_same_size(a, b, "max_abs_difference");
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = nan_max(m, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}
template double max_abs_difference(const std::vector<float>&, const std::vector<float>&);
template double max_abs_difference(const std::vector<double>&, const std::vector<double>&);
template double max_abs_difference(const std::vector<float>&, const std::vector<double>&);

std::vector<HeadError> head_errors(const std::vector<double>& o_test, const std::vector<double>& o_ref,
                                   int64_t values_per_head) {
  check_same_size(o_test, o_ref, "output_error");
  if (values_per_head <= 0 || o_ref.size() % values_per_head != 0)
    throw InputError(fmt::format("output_error: {} values do not split into heads of {}", o_ref.size(), values_per_head));
  std::vector<HeadError> heads(o_ref.size() / values_per_head);
  for (size_t h = 0; h < heads.size(); ++h) {
    double diff2 = 0, ref2 = 0, test2 = 0, dot = 0, max_abs = 0;
    for (int64_t i = 0; i < values_per_head; ++i) {
      const double t = o_test[h * values_per_head + i], r = o_ref[h * values_per_head + i];
      diff2 += (t - r) * (t - r);
      ref2 += r * r;
      test2 += t * t;
      dot += t * r;
      max_abs = nan_max(max_abs, std::abs(t - r));
    }
    heads[h].max_abs = max_abs;
    // A zero reference (an empty key set) that the output matches: nothing to measure against. One it
    // does not match is an error over nothing: rel-L2 inf (NaN with a NaN output), cosine 0.
    heads[h].empty = ref2 == 0 && diff2 == 0;
    if (heads[h].empty) continue;
    heads[h].rel_l2 = std::sqrt(diff2 / ref2);
    const double norms = std::sqrt(test2 * ref2);
    heads[h].cosine = norms > 0 ? dot / norms : std::isnan(norms) ? norms : 0.0;
  }
  return heads;
}

OutputError summarize(const std::vector<HeadError>& heads) {
  Summary rel_l2, cosine;
  OutputError e;
  for (const HeadError& h : heads) {
    e.max_abs = nan_max(e.max_abs, h.max_abs);
    if (h.empty) continue;
    rel_l2.add(h.rel_l2);
    cosine.add(h.cosine);
  }
  e.rel_l2_mean = rel_l2.mean_or(0);
  e.rel_l2_max = rel_l2.max_or(0);
  e.cosine_mean = cosine.mean_or(1);
  e.cosine_min = cosine.min_or(1);
  return e;
}

ProbabilityError probability_error(const std::vector<double>& p_test, const std::vector<double>& p_ref,
                                   int64_t row_length, int64_t k) {
  check_same_size(p_test, p_ref, "probability_error");
  if (row_length <= 0 || p_ref.size() % row_length != 0 || k <= 0)
    throw InputError(fmt::format("probability_error: {} values, row length {}, k {}", p_ref.size(), row_length, k));
  Summary kl, overlap;
  for (size_t r = 0; r < p_ref.size() / row_length; ++r) {
    const double* pr = p_ref.data() + r * row_length;
    const double* pt = p_test.data() + r * row_length;
    int64_t support = 0;
    double divergence = 0;
    bool nan = false;  // a NaN probability: both metrics NaN (and no top-k ordering of NaNs)
    for (int64_t j = 0; j < row_length; ++j) {
      nan = nan || std::isnan(pt[j]);
      if (pr[j] <= 0) continue;
      ++support;
      divergence += pr[j] * (pt[j] > 0 ? std::log(pr[j] / pt[j]) : std::numeric_limits<double>::infinity());
    }
    if (support == 0) continue;
    if (nan) {
      kl.add(std::nan("")), overlap.add(std::nan(""));
      continue;
    }
    const int64_t kk = std::min(k, support);
    const std::vector<int64_t> a = top_k(pr, row_length, kk), b = top_k(pt, row_length, kk);
    std::vector<int64_t> common;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
    kl.add(std::max(divergence, 0.0));  // rounding can make a zero divergence slightly negative
    overlap.add(static_cast<double>(common.size()) / kk);
  }
  ProbabilityError e;
  e.kl_mean = kl.mean_or(0);
  e.kl_max = kl.max_or(0);
  e.topk_overlap_mean = overlap.mean_or(1);
  e.topk_overlap_min = overlap.min_or(1);
  return e;
}

double bytes_per_token_per_head(const Scheme& s, const KvShape& shape, const int32_t* seq_lens) {
  const double tokens_x_heads = static_cast<double>(shape.batch * shape.heads * shape.tokens);
  const double code_bytes = static_cast<double>(shape.head_dim) * s.bits / 8.0;
  // nvfp4's fp32 per-tensor scale, once per layer's K or V
  const double tensor_bytes = s.format == CodeFormat::kNvfp4 ? 4.0 : 0.0;
  if (tokens_x_heads == 0) return code_bytes;
  if (!s.has_window())
    return code_bytes + (static_cast<double>(num_groups(s, shape)) * s.param_bytes() + tensor_bytes) / tokens_x_heads;
  // +wW: quantized tokens cost their codes, window tokens kKeptBytes per element; only groups with
  // a quantized element store parameters (the others are all-window and need none).
  const std::vector<int32_t> qlen = window_boundaries(s, shape, seq_lens);
  double quantized = 0;
  for (int32_t l : qlen) quantized += static_cast<double>(l) * shape.heads;
  int64_t groups = 0;
  for (int64_t g = 0; g < num_groups(s, shape); ++g) {
    const GroupBox box = group_box(s, shape, g);
    for (int64_t b = box.b0; b < box.b1; ++b)
      if (box.t0 < qlen[b]) {
        ++groups;
        break;
      }
  }
  const double kept = (tokens_x_heads - quantized) * static_cast<double>(shape.head_dim) * kKeptBytes;
  const double params = static_cast<double>(groups) * s.param_bytes() + (groups ? tensor_bytes : 0.0);
  return (quantized * code_bytes + kept + params) / tokens_x_heads;
}

double bits_per_element(const Scheme& s, const KvShape& shape, const int32_t* seq_lens) {
  return 8.0 * bytes_per_token_per_head(s, shape, seq_lens) / static_cast<double>(shape.head_dim);
}

int64_t elements_per_group(const Scheme& s, const KvShape& shape) {
  switch (s.granularity) {
    case Granularity::kTensor: return shape.numel();
    case Granularity::kToken: return shape.heads * shape.head_dim;
    case Granularity::kHead: return shape.head_dim;
    case Granularity::kGroup:
    case Granularity::kChannel: return s.group;
  }
  return 0;
}

}  // namespace kvq
