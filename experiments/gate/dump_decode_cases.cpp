#include "experiments/gate/dump_decode_cases.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace kvq {

std::vector<int64_t> prefix_positions(int64_t tokens, int64_t lo, int64_t hi) {
  if (hi < lo) return {};
  std::vector<int64_t> out = {lo, hi};
  for (int64_t p : {int64_t{0}, int64_t{1}, tokens / 3, 2 * tokens / 3, tokens - 1})
    if (p >= lo && p <= hi) out.push_back(p);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<DumpDecodeCase> dump_decode_cases(const KvLayer& layer, const std::string& file, int64_t max_kv_elements) {
  if (!layer.has_queries()) return {};
  const KvShape& kv = layer.kv_shape;
  const KvShape& qs = layer.q_shape;
  const int64_t tq = qs.tokens;

  // Every entry's queries: its own decode step (Tq = 1), or the picked positions its rows hold.
  std::vector<DumpQuery> all;
  for (int64_t b = 0; b < kv.batch; ++b) {
    const int64_t len = layer.seq_lens.empty() ? kv.tokens : layer.seq_lens[static_cast<size_t>(b)];
    if (len == 0) {  // no keys: the last row's query attends nothing (O = 0, LSE = -inf)
      all.push_back({b, -1, tq - 1});
      continue;
    }
    for (int64_t pos : prefix_positions(kv.tokens, std::max<int64_t>(0, len - tq), len - 1))
      all.push_back({b, pos, pos - (len - tq)});
  }

  const int64_t entry_kv = kv.heads * kv.tokens * kv.head_dim, entry_q = qs.heads * kv.head_dim;
  const int64_t per_case = std::max<int64_t>(1, max_kv_elements / std::max<int64_t>(1, entry_kv));
  std::vector<DumpDecodeCase> cases;
  for (size_t first = 0; first < all.size(); first += static_cast<size_t>(per_case)) {
    const size_t last = std::min(all.size(), first + static_cast<size_t>(per_case));
    DumpDecodeCase c;
    c.queries.assign(all.begin() + static_cast<std::ptrdiff_t>(first), all.begin() + static_cast<std::ptrdiff_t>(last));
    const int64_t n = static_cast<int64_t>(c.queries.size());
    c.shape = {"", n, qs.heads, kv.heads, kv.tokens, kv.head_dim};
    c.alibi = layer.alibi;
    c.softmax_scale = layer.softmax_scale;
    c.k.reserve(static_cast<size_t>(n * entry_kv)), c.v.reserve(static_cast<size_t>(n * entry_kv));
    c.q.reserve(static_cast<size_t>(n * entry_q));
    for (const DumpQuery& e : c.queries) {
      const auto kv_begin = static_cast<std::ptrdiff_t>(e.batch * entry_kv);
      c.k.insert(c.k.end(), layer.k.begin() + kv_begin, layer.k.begin() + kv_begin + entry_kv);
      c.v.insert(c.v.end(), layer.v.begin() + kv_begin, layer.v.begin() + kv_begin + entry_kv);
      // Keys past the query's position are this problem's padding: zero, since the dump's own
      // padding may hold anything (NaN too) and a quantizer rejects non-finite input.
      for (int64_t h = 0; h < kv.heads; ++h) {
        const auto from = c.k.size() - static_cast<size_t>(entry_kv) +
                          static_cast<size_t>((h * kv.tokens + e.position + 1) * kv.head_dim);
        const auto to = c.k.size() - static_cast<size_t>(entry_kv) + static_cast<size_t>((h + 1) * kv.tokens * kv.head_dim);
        std::fill(c.k.begin() + static_cast<std::ptrdiff_t>(from), c.k.begin() + static_cast<std::ptrdiff_t>(to), 0.0f);
        std::fill(c.v.begin() + static_cast<std::ptrdiff_t>(from), c.v.begin() + static_cast<std::ptrdiff_t>(to), 0.0f);
      }
      for (int64_t h = 0; h < qs.heads; ++h) {
        const auto row = static_cast<std::ptrdiff_t>(((e.batch * qs.heads + h) * tq + e.q_row) * kv.head_dim);
        c.q.insert(c.q.end(), layer.q.begin() + row, layer.q.begin() + row + kv.head_dim);
      }
      c.seq_lens.push_back(static_cast<int32_t>(e.position + 1));
    }
    const DumpQuery &a = c.queries.front(), &z = c.queries.back();
    c.label = fmt::format("{} layer {} entries {}..{} ({} queries{})", file, layer.layer, a.batch, z.batch, n,
                          tq == 1 ? ", Tq = 1" : fmt::format(", of Tq = {}", tq));
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace kvq
