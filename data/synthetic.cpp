#include "data/synthetic.hpp"

#include <fmt/format.h>

#include <cmath>

#include "quant/errors.hpp"

namespace kvq {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Box-Muller on two 53-bit uniforms derived from one counter.
double normal_at(uint64_t seed, uint64_t stream, uint64_t i) {
  const uint64_t a = splitmix64(seed ^ splitmix64(stream * 0x632be59bd9b4e019ull + 2 * i));
  const uint64_t b = splitmix64(a + 1);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

enum Stream : uint64_t { kStreamK = 1, kStreamV, kStreamQ, kStreamTokenScale, kStreamOutlierPick };

}  // namespace

void fill_normal(std::vector<float>& out, uint64_t seed, uint64_t stream) {
  const int64_t n = static_cast<int64_t>(out.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(normal_at(seed, stream, i));
}

KvLayer make_synthetic(const SyntheticSpec& spec) {
  if (spec.batch < 0 || spec.q_heads <= 0 || spec.kv_heads <= 0 || spec.tokens < 0 || spec.head_dim <= 0 ||
      spec.q_len < 0 || spec.q_heads % spec.kv_heads != 0 || spec.outlier_channels < 0 ||
      spec.outlier_channels > spec.head_dim)
    throw InputError(fmt::format("synthetic: bad spec B={} Hq={} Hkv={} T={} D={} Tq={} outlier_channels={} "
                                 "(need Hq % Hkv == 0 and 0 <= outlier_channels <= D)",
                                 spec.batch, spec.q_heads, spec.kv_heads, spec.tokens, spec.head_dim, spec.q_len,
                                 spec.outlier_channels));
  KvLayer out;
  out.kv_shape = {spec.batch, spec.kv_heads, spec.tokens, spec.head_dim};
  out.q_shape = {spec.batch, spec.q_heads, spec.q_len, spec.head_dim};
  out.k.resize(out.kv_shape.numel());
  out.v.resize(out.kv_shape.numel());
  out.q.resize(out.q_shape.numel());
  fill_normal(out.k, spec.seed, kStreamK);
  fill_normal(out.v, spec.seed, kStreamV);
  fill_normal(out.q, spec.seed, kStreamQ);

  // Outlier channels: distinct, picked by the seed.
  std::vector<bool> outlier(spec.head_dim, false);
  for (int64_t c = 0, draw = 0; c < spec.outlier_channels; ++draw) {
    const int64_t ch = static_cast<int64_t>(splitmix64(spec.seed ^ (kStreamOutlierPick << 32) ^ draw) % spec.head_dim);
    if (!outlier[ch]) outlier[ch] = true, ++c;
  }
  const int64_t rows = out.kv_shape.rows(), d = spec.head_dim;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float token_scale = static_cast<float>(std::exp(spec.token_spread * normal_at(spec.seed, kStreamTokenScale, r)));
    for (int64_t i = 0; i < d; ++i) {
      const float channel = outlier[i] ? static_cast<float>(spec.outlier_scale) : 1.0f;
      out.k[r * d + i] *= token_scale * channel;
      out.v[r * d + i] *= token_scale;
    }
  }
  out.seq_lens.assign(static_cast<size_t>(spec.batch), static_cast<int32_t>(spec.tokens));
  out.source = fmt::format(
      "synthetic:gaussian-outliers(seed={},B={},Hq={},Hkv={},T={},D={},Tq={},outlier_channels={},outlier_scale={},"
      "token_spread={})",
      spec.seed, spec.batch, spec.q_heads, spec.kv_heads, spec.tokens, spec.head_dim, spec.q_len,
      spec.outlier_channels, spec.outlier_scale, spec.token_spread);
  return out;
}

}  // namespace kvq
