#include "experiments/gate/paged_cache.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "quant/errors.hpp"

namespace kvq {

Paging make_paging(const std::vector<int64_t>& lens, int64_t tokens, int page_tokens, uint32_t seed,
                   const std::vector<int64_t>& from) {
  if (page_tokens <= 0) throw InputError("paged cache: page_tokens must be positive");
  if (!from.empty() && from.size() != lens.size())
    throw InputError("paged cache: " + std::to_string(from.size()) + " first tokens for " + std::to_string(lens.size()) +
                     " sequences");
  Paging pg;
  pg.page_tokens = page_tokens;
  pg.table_stride = std::max<int64_t>((tokens + page_tokens - 1) / page_tokens, 1);
  for (size_t b = 0; b < lens.size(); ++b) pg.firsts.push_back(from.empty() ? 0 : from[b] / page_tokens);
  int64_t used = 0;
  for (size_t b = 0; b < lens.size(); ++b) used += std::max<int64_t>((lens[b] + page_tokens - 1) / page_tokens - pg.firsts[b], 0);
  pg.pages = used + kSparePages;
  std::vector<int32_t> order(static_cast<size_t>(pg.pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  pg.table.assign(lens.size() * static_cast<size_t>(pg.table_stride), order.back());  // a spare page
  size_t next = 0;
  for (size_t b = 0; b < lens.size(); ++b) {
    pg.counts.push_back((lens[b] + page_tokens - 1) / page_tokens);
    for (int64_t i = pg.firsts[b]; i < pg.counts.back(); ++i)
      pg.table[b * pg.table_stride + i] = order[next++];
  }
  return pg;
}

std::vector<uint8_t> to_pages(const std::vector<uint8_t>& src, const PagedUnits& u, const Paging& pg, uint8_t fill) {
  const int64_t P = pg.page_tokens;
  if (static_cast<int64_t>(src.size()) != u.batch * u.heads * u.tokens * u.unit)
    throw InputError("paged cache: the source holds " + std::to_string(src.size()) + " bytes, expected " +
                     std::to_string(u.batch * u.heads * u.tokens * u.unit));
  std::vector<uint8_t> out(static_cast<size_t>(pg.pages * P * u.heads * u.unit), fill);
  if (static_cast<int64_t>(pg.counts.size()) != u.batch)
    throw InputError("paged cache: a page table of " + std::to_string(pg.counts.size()) + " sequences for a batch of " +
                     std::to_string(u.batch));
  for (int64_t b = 0; b < u.batch; ++b)
    for (int64_t i = pg.firsts[b]; i < pg.counts[b]; ++i) {  // the sequence's own pages (the others name spare ones)
      const int64_t page = pg.table[b * pg.table_stride + i];
      for (int64_t j = 0; j < P && i * P + j < u.tokens; ++j)
        for (int64_t h = 0; h < u.heads; ++h) {
          const int64_t t = i * P + j;
          const int64_t from = u.token_major ? (b * u.tokens + t) * u.heads + h : (b * u.heads + h) * u.tokens + t;
          const int64_t to = u.head_major ? (page * u.heads + h) * P + j : (page * P + j) * u.heads + h;
          std::memcpy(out.data() + to * u.unit, src.data() + from * u.unit, static_cast<size_t>(u.unit));
        }
    }
  return out;
}

}  // namespace kvq
