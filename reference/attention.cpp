#include "reference/attention.hpp"

#include <fmt/format.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "quant/float_formats.hpp"

namespace kvq {

double round_to(double x, RoundTo to) {
  switch (to) {
    case RoundTo::kNone: return x;
    case RoundTo::kFp16: return round_to_fp16(static_cast<float>(x));
    case RoundTo::kBf16: return round_to_bf16(static_cast<float>(x));
  }
  return x;
}

double AttentionProblem::scale() const {
  return softmax_scale != 0.0 ? softmax_scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

void check_problem(const AttentionProblem& p) {
  auto fail = [](const std::string& what) { throw InputError("attention: " + what); };
  if (p.batch < 0 || p.q_heads <= 0 || p.kv_heads <= 0 || p.q_len < 0 || p.head_dim <= 0)
    fail(fmt::format("dimensions must be non-negative (heads and head_dim positive), got B={} Hq={} Hkv={} Tq={} D={}",
                     p.batch, p.q_heads, p.kv_heads, p.q_len, p.head_dim));
  if (p.q_heads % p.kv_heads != 0)
    fail(fmt::format("num_q_heads {} is not a multiple of num_kv_heads {}", p.q_heads, p.kv_heads));
  const KvShape expected{p.batch, p.kv_heads, p.k.shape.tokens, p.head_dim};
  for (const auto& [name, view] : {std::pair{"K", &p.k}, std::pair{"V", &p.v}}) {
    const KvShape& s = view->shape;
    if (!(s == expected))
      fail(fmt::format("{} has shape [{}, {}, {}, {}], expected [{}, {}, {}, {}]", name, s.batch, s.heads, s.tokens,
                       s.head_dim, expected.batch, expected.heads, expected.tokens, expected.head_dim));
  }
  for (int64_t b = 0; p.seq_lens && b < p.batch; ++b)
    if (p.seq_lens[b] < 0 || p.seq_lens[b] > p.tokens())
      fail(fmt::format("seq_lens[{}] = {} is outside [0, T={}]", b, p.seq_lens[b], p.tokens()));
  if (!(std::isfinite(p.softmax_scale) && p.softmax_scale >= 0))
    fail(fmt::format("softmax_scale {} must be finite and > 0 (0: 1/sqrt(D))", p.softmax_scale));
}

std::vector<double> alibi_slopes(int64_t n) {
  std::vector<double> slopes;
  if (n <= 0) return slopes;
  int64_t c = 1;
  while (c * 2 <= n) c *= 2;  // largest power of two <= n
  for (int64_t h = 1; h <= c; ++h) slopes.push_back(std::exp2(-8.0 * h / c));
  for (int64_t j = 1; j <= n - c; ++j) slopes.push_back(std::exp2(-4.0 * (2 * j - 1) / c));
  return slopes;
}

namespace {

template <typename Acc>
using RowMatrix = Eigen::Matrix<Acc, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using FloatRows = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0,
                             Eigen::OuterStride<>>;

constexpr int64_t kKeyBlock = 256;  // keys converted to Acc at a time: stays in L2

template <typename Acc>
Acc round_as(Acc x, RoundTo to) {
  return to == RoundTo::kNone ? x : static_cast<Acc>(round_to(static_cast<double>(x), to));
}

// All queries of one (batch, KV head): the Hq/Hkv query heads x Tq rows attend together, so each
// key block is read once and converted once.
template <typename Acc>
void attend_kv_head(const AttentionProblem& p, const PrecisionProfile& prof, KeyRange range, int64_t b, int64_t kvh,
                    const std::vector<double>& slopes, AttentionOutput& out, std::vector<double>* probabilities) {
  const int64_t group = p.q_heads / p.kv_heads, tq = p.q_len, d = p.head_dim, rows = group * tq;
  const int64_t seq = p.seq_len(b), T = p.tokens();
  const int64_t begin = std::max<int64_t>(range.begin, 0), end = std::min(range.end, seq);
  const int64_t n = std::max<int64_t>(end - begin, 0);
  const Acc scale = static_cast<Acc>(p.scale());

  RowMatrix<Acc> q(rows, d);  // (query head, query row) x D
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = p.q + (((b * p.q_heads) + kvh * group + r / tq) * tq + r % tq) * d;
    if (prof.q_before_qk == RoundTo::kFp16) {
      float amax = 0.0f;
      for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(src[i]));
      const int e = fp16_operand_exponent(amax);
      for (int64_t i = 0; i < d; ++i) q(r, i) = static_cast<Acc>(std::ldexp(round_to_fp16(std::ldexp(src[i], e)), -e));
    } else {
      for (int64_t i = 0; i < d; ++i) q(r, i) = round_as(static_cast<Acc>(src[i]), prof.q_before_qk);
    }
  }
  RowMatrix<Acc> s(rows, n), kv_block;
  for (int64_t j0 = 0; j0 < n; j0 += kKeyBlock) {
    const int64_t nb = std::min(kKeyBlock, n - j0);
    kv_block = FloatRows(p.k.row(b, kvh, begin + j0), nb, d, Eigen::OuterStride<>(p.k.stride_t)).cast<Acc>();
    if (prof.k_before_qk != RoundTo::kNone) kv_block = kv_block.unaryExpr([&](Acc x) { return round_as(x, prof.k_before_qk); });
    s.middleCols(j0, nb).noalias() = q * kv_block.transpose();
  }

  // Softmax per row over the causal keys; s is overwritten with the (rounded) probabilities.
  std::vector<Acc> row_sum(rows, Acc(0));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t hq = kvh * group + r / tq, i = r % tq;
    const int64_t pos = seq - tq + i;                       // absolute position of this query
    const int64_t valid = std::clamp<int64_t>(pos + 1 - begin, 0, n);  // keys begin..min(pos, end-1)
    const Acc slope = p.alibi ? static_cast<Acc>(slopes[hq]) : Acc(0);
    Acc m = -std::numeric_limits<Acc>::infinity();
    for (int64_t j = 0; j < valid; ++j) {
      s(r, j) = scale * s(r, j) - slope * static_cast<Acc>(pos - (begin + j));
      m = std::max(m, s(r, j));
    }
    Acc l = 0;
    for (int64_t j = 0; j < valid; ++j) {
      const Acc e = std::exp(s(r, j) - m);
      l += e;  // kernels sum the unrounded probabilities
      s(r, j) = round_as(e, prof.p_before_pv);
    }
    for (int64_t j = valid; j < n; ++j) s(r, j) = 0;
    row_sum[r] = l;
    const int64_t orow = (b * p.q_heads + hq) * tq + i;
    out.lse[orow] = valid > 0 ? static_cast<double>(m + std::log(l)) : -std::numeric_limits<double>::infinity();
    if (probabilities) {
      double* prow = probabilities->data() + orow * T;
      for (int64_t j = 0; j < valid; ++j) prow[begin + j] = static_cast<double>(s(r, j) / l);
    }
  }

  RowMatrix<Acc> o = RowMatrix<Acc>::Zero(rows, d);
  for (int64_t j0 = 0; j0 < n; j0 += kKeyBlock) {
    const int64_t nb = std::min(kKeyBlock, n - j0);
    kv_block = FloatRows(p.v.row(b, kvh, begin + j0), nb, d, Eigen::OuterStride<>(p.v.stride_t)).cast<Acc>();
    o.noalias() += s.middleCols(j0, nb) * kv_block;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t orow = (b * p.q_heads + kvh * group + r / tq) * tq + r % tq;
    const Acc l = row_sum[r];
    for (int64_t i = 0; i < d; ++i)
      out.o[orow * d + i] = l > 0 ? static_cast<double>(round_as(o(r, i) / l, prof.output)) : 0.0;
  }
}

}  // namespace

AttentionOutput attention(const AttentionProblem& p, const PrecisionProfile& profile, KeyRange range,
                          std::vector<double>* probabilities) {
  check_problem(p);
  AttentionOutput out;
  out.o.assign(static_cast<size_t>(p.batch * p.q_heads * p.q_len * p.head_dim), 0.0);
  out.lse.assign(static_cast<size_t>(p.batch * p.q_heads * p.q_len), 0.0);
  if (probabilities) probabilities->assign(static_cast<size_t>(p.batch * p.q_heads * p.q_len * p.tokens()), 0.0);
  const std::vector<double> slopes = alibi_slopes(p.q_heads);
  const int64_t tasks = p.batch * p.kv_heads;
#pragma omp parallel for schedule(dynamic)
  for (int64_t task = 0; task < tasks; ++task) {
    if (profile.fp32)
      attend_kv_head<float>(p, profile, range, task / p.kv_heads, task % p.kv_heads, slopes, out, probabilities);
    else
      attend_kv_head<double>(p, profile, range, task / p.kv_heads, task % p.kv_heads, slopes, out, probabilities);
  }
  return out;
}

AttentionOutput merge_partials(const std::vector<AttentionOutput>& partials) {
  if (partials.empty()) throw InputError("merge_partials: no partials to merge");
  const size_t rows = partials[0].lse.size(), dim = rows ? partials[0].o.size() / rows : 0;
  for (const AttentionOutput& part : partials)
    if (part.lse.size() != rows || part.o.size() != rows * dim)
      throw InputError(fmt::format("merge_partials: partials disagree in size ({} vs {} rows)", part.lse.size(), rows));
  AttentionOutput out{std::vector<double>(rows * dim, 0.0), std::vector<double>(rows)};
  const double neg_inf = -std::numeric_limits<double>::infinity();
  for (size_t r = 0; r < rows; ++r) {
    double m = neg_inf;
    for (const AttentionOutput& part : partials) m = std::max(m, part.lse[r]);
    if (m == neg_inf) {  // every split empty
      out.lse[r] = neg_inf;
      continue;
    }
    double sum = 0;
    for (const AttentionOutput& part : partials) sum += std::exp(part.lse[r] - m);
    out.lse[r] = m + std::log(sum);
    for (const AttentionOutput& part : partials) {
      if (part.lse[r] == neg_inf) continue;
      const double w = std::exp(part.lse[r] - out.lse[r]);
      for (size_t i = 0; i < dim; ++i) out.o[r * dim + i] += w * part.o[r * dim + i];
    }
  }
  return out;
}

AttentionOutput split_k_attention(const AttentionProblem& p, int64_t splits) {
  if (splits <= 0) throw InputError(fmt::format("split_k_attention: splits must be positive, got {}", splits));
  const int64_t T = p.tokens();
  std::vector<AttentionOutput> partials;
  for (int64_t s = 0; s < splits; ++s)
    partials.push_back(attention(p, PrecisionProfile::reference(), {T * s / splits, T * (s + 1) / splits}));
  return merge_partials(partials);
}

PrecisionProfile PrecisionProfile::parse(const std::string& name) {
  auto round_name = [&](const std::string& part, size_t skip) {
    const std::string dt = part.substr(skip);
    if (dt == "bf16") return RoundTo::kBf16;
    if (dt == "fp16") return RoundTo::kFp16;
    throw InputError(fmt::format("precision profile '{}': '{}' must round to bf16 or fp16", name, part));
  };
  PrecisionProfile prof;
  size_t start = 0;
  bool first = true;
  while (start <= name.size()) {
    const size_t dash = name.find('-', start);
    const std::string part = name.substr(start, dash == std::string::npos ? std::string::npos : dash - start);
    if (first && (part == "fp32" || part == "fp64")) {
      prof.fp32 = part == "fp32";
    } else if (!first && part.size() > 1 && part[0] == 'q') {
      prof.q_before_qk = round_name(part, 1);
    } else if (!first && part.size() > 1 && part[0] == 'k') {
      prof.k_before_qk = round_name(part, 1);
    } else if (!first && part.size() > 1 && part[0] == 'p') {
      prof.p_before_pv = round_name(part, 1);
    } else if (!first && part.size() > 1 && part[0] == 'o') {
      prof.output = round_name(part, 1);
    } else {
      throw InputError(fmt::format("precision profile '{}': expected fp64 or fp32[-q<bf16|fp16>][-k<bf16|fp16>][-p<bf16|fp16>][-o<bf16|fp16>]", name));
    }
    first = false;
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  return prof;
}

std::string PrecisionProfile::name() const {
  if (!fp32 && q_before_qk == RoundTo::kNone && k_before_qk == RoundTo::kNone && p_before_pv == RoundTo::kNone &&
      output == RoundTo::kNone)
    return "fp64";
  auto dt = [](RoundTo r) { return r == RoundTo::kBf16 ? "bf16" : "fp16"; };
  std::string s = fp32 ? "fp32" : "fp64";
  if (q_before_qk != RoundTo::kNone) s += std::string("-q") + dt(q_before_qk);
  if (k_before_qk != RoundTo::kNone) s += std::string("-k") + dt(k_before_qk);
  if (p_before_pv != RoundTo::kNone) s += std::string("-p") + dt(p_before_pv);
  if (output != RoundTo::kNone) s += std::string("-o") + dt(output);
  return s;
}

}  // namespace kvq
