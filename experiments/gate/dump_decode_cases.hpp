// The decode gate's real-dump cases (kvq validate --dump): a dump's own decode queries as Tq = 1
// problems, built from the dump as it is — every batch entry with its own sequence length, the
// layer's heads, D, ALiBi flag and softmax scale. CPU-only, so the construction is tested without a
// GPU; experiments/gate/validate_decode.cpp runs the cases.
//
// Query row i of entry b sits at position seq_len - Tq + i (DESIGN.md) and sees keys 0..position,
// which is the decode problem with seq_len' = position + 1 over the same K/V. With Tq = 1 that is
// the entry's own decode step; with Tq > 1 each entry gives the positions prefix_positions() picks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/kv_layer.hpp"
#include "experiments/common/decode_shapes.hpp"

namespace kvq {

// Where one batch entry of a case comes from.
struct DumpQuery {
  int64_t batch = 0;     // entry in the dump
  int64_t position = 0;  // absolute query position; -1 for an empty sequence (no keys)
  int64_t q_row = 0;     // row of the dump's Q [B, Hq, Tq, D]
};

struct DumpDecodeCase {
  std::string label;  // "<file> layer <L> entries b..b'"
  DecodeShape shape;  // B' queries, the layer's Hq, Hkv, T and D
  std::vector<DumpQuery> queries;  // [B']
  std::vector<int32_t> seq_lens;   // [B']: position + 1
  std::vector<float> k, v;         // [B', Hkv, T, D]: the source entry's K/V, zero past the position
  std::vector<float> q;            // [B', Hq, D]
  bool alibi = false;
  double softmax_scale = 0.0;  // 0: 1 / sqrt(D)
};

// Positions of an entry's queries to check, for a cache of T tokens, among the positions its rows
// hold, [lo, hi]: 0, 1, T/3, 2T/3 and T - 1 where they fall in [lo, hi], and lo and hi themselves;
// sorted, without repeats. Empty when hi < lo.
std::vector<int64_t> prefix_positions(int64_t tokens, int64_t lo, int64_t hi);

// The cases of one layer (none when it has no queries), each holding at most `max_kv_elements`
// K elements (but at least one entry). `file` names the dump in the labels.
std::vector<DumpDecodeCase> dump_decode_cases(const KvLayer& layer, const std::string& file,
                                              int64_t max_kv_elements = int64_t{1} << 26);

}  // namespace kvq
