// A paged cache for the gate (kvq validate's paged family): each sequence's tokens in pages of P
// tokens, the pages shuffled through a pool with spare (poisoned) pages, as a serving engine's
// allocator leaves them. Host code: the layout moves are tested on the CPU.
#pragma once

#include <cstdint>
#include <vector>

namespace kvq {

struct Paging {
  int page_tokens = 0;    // P
  int64_t pages = 0;      // pages in the pool (used and spare)
  int64_t table_stride = 0;  // entries per sequence: ceil(T / P)
  std::vector<int32_t> table;  // [B, table_stride]; entries past a sequence's pages name a spare page
  std::vector<int64_t> counts;  // [B]: each sequence's pages, ceil(len / P)
  std::vector<int64_t> firsts;  // [B]: each sequence's first page held (the ones before name a spare page)
};

inline constexpr int kSparePages = 2;

// ceil(len_b / P) pages for each sequence of `lens` (T: the longest the table holds), every page and
// kSparePages unused ones in an order drawn from `seed`. `from` [B] (empty: 0): each sequence's
// pages begin with the one holding token from[b] (a +wW window's raw pages, as an engine keeps only
// those); the entries before it name a spare page.
Paging make_paging(const std::vector<int64_t>& lens, int64_t tokens, int page_tokens, uint32_t seed,
                   const std::vector<int64_t>& from = {});

// How units of an array lie: the source [B, H, T] (token_major: [B, T, H]) of `unit` bytes each, the
// pages [pages, P, H] (head_major: [pages, H, P]).
struct PagedUnits {
  int64_t batch = 0, heads = 0, tokens = 0, unit = 0;
  bool token_major = false, head_major = false;
};

// The units of every token in a sequence's own pages (t < T, the padding past its length too) moved
// there; tokens past T in a last page and the spare pages hold `fill`.
std::vector<uint8_t> to_pages(const std::vector<uint8_t>& src, const PagedUnits& u, const Paging& pg, uint8_t fill);

}  // namespace kvq
