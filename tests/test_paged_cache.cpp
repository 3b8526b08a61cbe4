// The gate's paged cache (experiments/gate/paged_cache.hpp): every sequence's own pages, each page
// used once, units moved where the kernel's paged addressing reads them, the rest poisoned.
#include "experiments/gate/paged_cache.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "quant/errors.hpp"

using namespace kvq;

TEST_CASE("make_paging: ceil(len / P) pages per sequence, each page once, spare entries past them") {
  const std::vector<int64_t> lens = {100, 1, 0, 32};
  const Paging pg = make_paging(lens, 100, 32, 7);
  CHECK(pg.table_stride == 4);
  CHECK(pg.counts == std::vector<int64_t>{4, 1, 0, 1});
  CHECK(pg.pages == 6 + kSparePages);
  std::set<int32_t> owned;
  for (size_t b = 0; b < lens.size(); ++b)
    for (int64_t i = 0; i < pg.counts[b]; ++i) CHECK(owned.insert(pg.table[b * pg.table_stride + i]).second);
  CHECK(owned.size() == 6);
  for (size_t b = 0; b < lens.size(); ++b)
    for (int64_t i = pg.counts[b]; i < pg.table_stride; ++i) {  // past a sequence's pages: a spare page
      const int32_t id = pg.table[b * pg.table_stride + i];
      CHECK(id >= 0);
      CHECK(id < pg.pages);
      CHECK(owned.count(id) == 0);
    }
  CHECK_THROWS_AS(make_paging(lens, 100, 0, 7), InputError);
}

TEST_CASE("make_paging from a first token: the pages before its page name a spare one and hold nothing") {
  const std::vector<int64_t> lens = {100, 40, 0}, from = {70, 0, 0};  // a window from token 70: pages 2 and 3
  const Paging pg = make_paging(lens, 100, 32, 9, from);
  CHECK(pg.firsts == std::vector<int64_t>{2, 0, 0});
  CHECK(pg.pages == 2 + 2 + kSparePages);
  std::set<int32_t> owned;
  for (size_t b = 0; b < lens.size(); ++b)
    for (int64_t i = pg.firsts[b]; i < pg.counts[b]; ++i) CHECK(owned.insert(pg.table[b * pg.table_stride + i]).second);
  CHECK(owned.size() == 4);
  for (int64_t i = 0; i < 2; ++i) CHECK(owned.count(pg.table[i]) == 0);  // pages 0 and 1 of sequence 0: spare
  const std::vector<uint8_t> src(3 * 1 * 100, 7);
  const std::vector<uint8_t> out = to_pages(src, {3, 1, 100, 1, false, false}, pg, 0xFF);
  CHECK(std::count(out.begin(), out.end(), uint8_t{7}) == 36 + 64);  // tokens 64..99 of sequence 0, its 2 pages of 1
  CHECK_THROWS_AS(make_paging(lens, 100, 32, 9, {1, 2}), InputError);
}

TEST_CASE("to_pages: unit (b, h, t) lands at its page's (t % P, h) (NHD) or (h, t % P) (head-major)") {
  const int64_t B = 2, H = 3, T = 37, unit = 2;
  const std::vector<int64_t> lens = {37, 20};
  const Paging pg = make_paging(lens, T, 16, 3);
  std::vector<uint8_t> src(B * H * T * unit);
  auto value = [&](int64_t b, int64_t h, int64_t t, int64_t byte) { return static_cast<uint8_t>((b * 101 + h * 37 + t * 3 + byte) % 251); };
  for (bool token_major : {false, true})
    for (bool head_major : {false, true}) {
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t t = 0; t < T; ++t)
            for (int64_t i = 0; i < unit; ++i) {
              const int64_t at = token_major ? (b * T + t) * H + h : (b * H + h) * T + t;
              src[at * unit + i] = value(b, h, t, i);
            }
      const std::vector<uint8_t> out = to_pages(src, {B, H, T, unit, token_major, head_major}, pg, 0xFF);
      REQUIRE(out.size() == static_cast<size_t>(pg.pages * 16 * H * unit));
      std::vector<bool> written(out.size() / unit, false);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < pg.counts[b] * 16 && t < T; ++t)
          for (int64_t h = 0; h < H; ++h) {
            const int64_t page = pg.table[b * pg.table_stride + t / 16], j = t % 16;
            const int64_t to = head_major ? (page * H + h) * 16 + j : (page * 16 + j) * H + h;
            for (int64_t i = 0; i < unit; ++i) CHECK(out[to * unit + i] == value(b, h, t, i));
            written[to] = true;
          }
      for (size_t u = 0; u < written.size(); ++u)  // spare pages and the tail past T: poisoned
        if (!written[u]) CHECK((out[u * unit] == 0xFF && out[u * unit + 1] == 0xFF));
    }
  CHECK_THROWS_AS(to_pages(std::vector<uint8_t>(5), {B, H, T, unit, false, false}, pg, 0), InputError);
}
