// Which elements share a scale. Every granularity's group is a box in (b, h, t, d) index space, and
// groups are numbered in the order their scales are stored:
//   tensor [1] (0 if empty)   token [B, T]   head [B, H, T]   gG [B, H, T, D/G]   chan-tN [B, H, ceil(T/N), D]
// (chan-tN: the last token group is partial when N does not divide T.)
#pragma once

#include <vector>

#include "quant/scheme.hpp"

namespace kvq {

// Logical K or V shape [B, H, T, D] (H = KV heads).
struct KvShape {
  int64_t batch = 0, heads = 0, tokens = 0, head_dim = 0;
  KVQ_HD int64_t numel() const { return batch * heads * tokens * head_dim; }
  KVQ_HD int64_t rows() const { return batch * heads * tokens; }  // (b, h, t) rows of head_dim
  bool operator==(const KvShape& o) const {
    return batch == o.batch && heads == o.heads && tokens == o.tokens && head_dim == o.head_dim;
  }
};

// Half-open index ranges of one group.
struct GroupBox {
  int64_t b0, b1, h0, h1, t0, t1, d0, d1;
  KVQ_HD int64_t size() const { return (b1 - b0) * (h1 - h0) * (t1 - t0) * (d1 - d0); }
};

KVQ_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

KVQ_HD int64_t num_groups(const Scheme& s, const KvShape& x) {
  if (s.scale_free) return 0;
  switch (s.granularity) {
    case Granularity::kTensor: return x.numel() > 0 ? 1 : 0;
    case Granularity::kToken: return x.batch * x.tokens;
    case Granularity::kHead: return x.rows();
    case Granularity::kGroup: return x.rows() * (x.head_dim / s.group);
    case Granularity::kChannel: return x.batch * x.heads * ceil_div(x.tokens, s.group) * x.head_dim;
  }
  return 0;
}

// Elements of one scale group along a row, for the granularities whose groups lie in one row
// (head: the whole row; gG: G), in head_dim's integer type (kernels keep it in 32 bits).
template <typename I>
KVQ_HD I row_group_size(const Scheme& s, I head_dim) {
  return s.granularity == Granularity::kHead ? head_dim : static_cast<I>(s.group);
}

KVQ_HD GroupBox group_box(const Scheme& s, const KvShape& x, int64_t g) {
  switch (s.granularity) {
    case Granularity::kTensor:
      return {0, x.batch, 0, x.heads, 0, x.tokens, 0, x.head_dim};
    case Granularity::kToken: {
      const int64_t b = g / x.tokens, t = g % x.tokens;
      return {b, b + 1, 0, x.heads, t, t + 1, 0, x.head_dim};
    }
    case Granularity::kHead: {
      const int64_t t = g % x.tokens, bh = g / x.tokens;
      return {bh / x.heads, bh / x.heads + 1, bh % x.heads, bh % x.heads + 1, t, t + 1, 0, x.head_dim};
    }
    case Granularity::kGroup: {
      const int64_t per_row = x.head_dim / s.group;
      const int64_t row = g / per_row, d0 = (g % per_row) * s.group;
      const int64_t t = row % x.tokens, bh = row / x.tokens;
      return {bh / x.heads, bh / x.heads + 1, bh % x.heads, bh % x.heads + 1, t, t + 1, d0, d0 + s.group};
    }
    case Granularity::kChannel: {
      const int64_t d = g % x.head_dim, rest = g / x.head_dim;
      const int64_t tg = ceil_div(x.tokens, s.group);
      const int64_t t0 = (rest % tg) * s.group, bh = rest / tg;
      const int64_t t1 = t0 + s.group < x.tokens ? t0 + s.group : x.tokens;
      return {bh / x.heads, bh / x.heads + 1, bh % x.heads, bh % x.heads + 1, t0, t1, d, d + 1};
    }
  }
  return {0, 0, 0, 0, 0, 0, 0, 0};
}

// The group of element (b, h, t, d); the inverse of group_box.
KVQ_HD int64_t group_of(const Scheme& s, const KvShape& x, int64_t b, int64_t h, int64_t t, int64_t d) {
  switch (s.granularity) {
    case Granularity::kTensor: return 0;
    case Granularity::kToken: return b * x.tokens + t;
    case Granularity::kHead: return (b * x.heads + h) * x.tokens + t;
    case Granularity::kGroup: return ((b * x.heads + h) * x.tokens + t) * (x.head_dim / s.group) + d / s.group;
    case Granularity::kChannel:
      return ((b * x.heads + h) * ceil_div(x.tokens, s.group) + t / s.group) * x.head_dim + d;
  }
  return 0;
}

// The shape of the scale (and zero-point) array, in group order (host only).
inline std::vector<int64_t> scale_shape(const Scheme& s, const KvShape& x) {
  switch (s.granularity) {
    case Granularity::kTensor: return {num_groups(s, x)};
    case Granularity::kToken: return {x.batch, x.tokens};
    case Granularity::kHead: return {x.batch, x.heads, x.tokens};
    case Granularity::kGroup: return {x.batch, x.heads, x.tokens, x.head_dim / s.group};
    case Granularity::kChannel: return {x.batch, x.heads, ceil_div(x.tokens, s.group), x.head_dim};
  }
  return {};
}

// +wW: how many leading tokens of a sequence of length `len` (of `tokens` stored) are quantized;
// the rest keep their input values. Lq = max(0, len - W), rounded down to a multiple of N for
// chan-tN (whole token groups only). Without a window every stored token is quantized.
KVQ_HD int64_t quantized_length(const Scheme& s, int64_t len, int64_t tokens) {
  if (!s.has_window()) return tokens;
  int64_t lq = len - s.window > 0 ? len - s.window : 0;
  if (s.granularity == Granularity::kChannel) lq -= lq % s.group;
  return lq;
}

// Bytes of codes in one (b, h, t) row.
KVQ_HD int64_t code_bytes_per_row(const Scheme& s, int64_t head_dim) { return head_dim * s.bits / 8; }

}  // namespace kvq
