#include "data/synthetic.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <string>
#include <vector>

#include "quant/errors.hpp"

namespace kvq {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t random_bits(uint64_t seed, uint64_t stream, uint64_t i) {
  return splitmix64(seed ^ splitmix64(stream * 0x632be59bd9b4e019ull + i));
}

// Box-Muller on two 53-bit uniforms derived from one counter.
double normal_at(uint64_t seed, uint64_t stream, uint64_t i) {
  const uint64_t a = random_bits(seed, stream, 2 * i), b = random_bits(seed, stream, 2 * i + 1);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

enum Stream : uint64_t { kK = 1, kV, kQ, kTokenScale, kOutlierPick, kOutlierSign, kSinkDirection };

// Every parameter outside its range, named with its value and the rule (a user fixes them all at once).
void check_spec(const SyntheticSpec& s) {
  std::vector<std::string> bad;
  const auto need = [&](bool ok, const std::string& what) {
    if (!ok) bad.push_back(what);
  };
  need(s.batch > 0, fmt::format("B={} (need > 0: a dump holds no empty tensor)", s.batch));
  need(s.q_heads > 0 && s.kv_heads > 0 && s.q_heads % s.kv_heads == 0,
       fmt::format("Hq={} Hkv={} (need both > 0, Hkv dividing Hq)", s.q_heads, s.kv_heads));
  need(s.tokens > 0, fmt::format("T={} (need > 0: a dump holds no empty tensor)", s.tokens));
  need(s.head_dim > 0 && s.head_dim % 2 == 0, fmt::format("D={} (need even and > 0: RoPE rotates pairs)", s.head_dim));
  need(s.q_len >= 0 && s.q_len <= s.tokens, fmt::format("Tq={} (need 0 <= Tq <= T = {})", s.q_len, s.tokens));
  need(s.outlier_channels >= 0 && s.outlier_channels <= s.head_dim / 2,
       fmt::format("outlier_channels={} (need 0 .. D/2 = {})", s.outlier_channels, s.head_dim / 2));
  need(s.sink_tokens >= 0 && s.sink_tokens <= s.tokens,
       fmt::format("sink_tokens={} (need 0 .. T = {})", s.sink_tokens, s.tokens));
  need(std::isfinite(s.outlier_scale), fmt::format("outlier_scale={} (need finite)", s.outlier_scale));
  need(std::isfinite(s.token_spread) && s.token_spread >= 0,
       fmt::format("token_spread={} (need finite, >= 0)", s.token_spread));
  need(std::isfinite(s.sink_scale), fmt::format("sink_scale={} (need finite)", s.sink_scale));
  need(std::isfinite(s.query_bias), fmt::format("query_bias={} (need finite)", s.query_bias));
  need(std::isfinite(s.rope_theta) && s.rope_theta > 0, fmt::format("rope_theta={} (need finite, > 0)", s.rope_theta));
  if (!bad.empty()) throw InputError(fmt::format("synthetic: bad parameters: {}", fmt::join(bad, "; ")));
}

}  // namespace

void fill_normal(std::vector<float>& out, uint64_t seed, uint64_t stream) {
  const int64_t n = static_cast<int64_t>(out.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(normal_at(seed, stream, i));
}

void apply_rope(float* x, int64_t head_dim, int64_t pos, double theta) {
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const double angle = static_cast<double>(pos) * std::pow(theta, -2.0 * i / head_dim);
    const double c = std::cos(angle), s = std::sin(angle), a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = static_cast<float>(a * c - b * s);
    x[2 * i + 1] = static_cast<float>(a * s + b * c);
  }
}

std::string synthetic_source(const SyntheticSpec& s) {
  return fmt::format(
      "synthetic:llm-shaped(seed={},B={},Hq={},Hkv={},T={},D={},Tq={},outlier_channels={},outlier_scale={},"
      "token_spread={},sink_tokens={},sink_scale={},query_bias={},rope_theta={})",
      s.seed, s.batch, s.q_heads, s.kv_heads, s.tokens, s.head_dim, s.q_len, s.outlier_channels, s.outlier_scale,
      s.token_spread, s.sink_tokens, s.sink_scale, s.query_bias, s.rope_theta);
}

KvLayer make_synthetic(const SyntheticSpec& spec) {
  check_spec(spec);
  const int64_t D = spec.head_dim, T = spec.tokens, H = spec.kv_heads;
  KvLayer out;
  out.kv_shape = {spec.batch, H, T, D};
  out.q_shape = {spec.batch, spec.q_heads, spec.q_len, D};
  out.k.resize(out.kv_shape.numel());
  out.v.resize(out.kv_shape.numel());
  out.q.resize(out.q_shape.numel());
  out.seq_lens.assign(static_cast<size_t>(spec.batch), static_cast<int32_t>(T));

  // Outliers sit in the slowly rotating (low-frequency) upper half of the RoPE pairs, so they keep
  // their sign across positions, as in real K caches.
  std::vector<double> channel_mean(D, 0.0), channel_sigma(D, 1.0);
  for (int64_t picked = 0, draw = 0; picked < spec.outlier_channels; ++draw) {
    const int64_t ch = D / 2 + static_cast<int64_t>(random_bits(spec.seed, kOutlierPick, draw) % (D / 2));
    if (channel_mean[ch] != 0.0) continue;
    const double sign = random_bits(spec.seed, kOutlierSign, ch) & 1 ? 1.0 : -1.0;
    channel_mean[ch] = sign * spec.outlier_scale;
    channel_sigma[ch] = spec.outlier_scale / 2;
    ++picked;
  }
  // Per KV head, a unit direction in the last quarter of channels (barely rotated by RoPE): sink
  // keys point along it and queries lean towards it.
  std::vector<double> sink_dir(H * D, 0.0);
  for (int64_t h = 0; h < H; ++h) {
    double norm = 0;
    for (int64_t d = 3 * D / 4; d < D; ++d) {
      sink_dir[h * D + d] = normal_at(spec.seed, kSinkDirection, h * D + d);
      norm += sink_dir[h * D + d] * sink_dir[h * D + d];
    }
    for (int64_t d = 3 * D / 4; d < D; ++d) sink_dir[h * D + d] /= std::sqrt(norm);
  }
  const double root_d = std::sqrt(static_cast<double>(D));

#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < out.kv_shape.rows(); ++r) {
    const int64_t b = r / (H * T), h = (r / T) % H, t = r % T;
    const double magnitude = std::exp(spec.token_spread * normal_at(spec.seed, kTokenScale, b * T + t));
    float* k = out.k.data() + r * D;
    float* v = out.v.data() + r * D;
    const bool sink = t < spec.sink_tokens;
    for (int64_t d = 0; d < D; ++d) {
      const double zk = normal_at(spec.seed, kK, r * D + d), zv = normal_at(spec.seed, kV, r * D + d);
      k[d] = static_cast<float>(sink ? spec.sink_scale * root_d * sink_dir[h * D + d] + 0.1 * zk
                                     : magnitude * (channel_mean[d] + channel_sigma[d] * zk));
      v[d] = static_cast<float>(sink ? 0.1 * zv : magnitude * zv);  // sinks carry little value
    }
    apply_rope(k, D, t, spec.rope_theta);
  }
  const int64_t group = spec.q_heads / H, q_rows = out.q_shape.rows();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < q_rows; ++r) {
    const int64_t hq = (r / spec.q_len) % spec.q_heads, i = r % spec.q_len;
    float* q = out.q.data() + r * D;
    for (int64_t d = 0; d < D; ++d)
      q[d] = static_cast<float>(spec.query_bias * root_d * sink_dir[(hq / group) * D + d] + normal_at(spec.seed, kQ, r * D + d));
    apply_rope(q, D, T - spec.q_len + i, spec.rope_theta);
  }
  out.source = synthetic_source(spec);
  return out;
}

}  // namespace kvq
