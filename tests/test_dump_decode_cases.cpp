// The decode gate's real-dump cases: built from any dump shape, every case in range, and each
// decode query the same problem as the dump's own query row (the fp64 reference agrees to rounding:
// Eigen may sum in another order for another number of rows).
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "data/synthetic.hpp"
#include "experiments/gate/dump_decode_cases.hpp"
#include "reference/attention.hpp"

using namespace kvq;

namespace {

KvLayer layer_of(int64_t batch, int64_t tokens, int64_t q_len, int64_t head_dim, bool alibi) {
  SyntheticSpec spec;
  spec.batch = batch, spec.q_heads = 6, spec.kv_heads = 2, spec.tokens = tokens, spec.head_dim = head_dim;
  spec.q_len = q_len, spec.seed = static_cast<uint64_t>(tokens * 7 + head_dim);
  KvLayer l = make_synthetic(spec);
  l.layer = 3;
  l.alibi = alibi;
  l.softmax_scale = alibi ? 0.3 : 0.0;
  // B = 3: a full sequence, an empty one and a partial one (its padding poisoned).
  if (batch == 3) l.seq_lens = {static_cast<int32_t>(tokens), 0, static_cast<int32_t>((tokens + 1) / 2)};
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < l.kv_shape.heads; ++h)
      for (int64_t t = l.seq_lens[b]; t < tokens; ++t)
        for (int64_t d = 0; d < head_dim; ++d) l.k[((b * l.kv_shape.heads + h) * tokens + t) * head_dim + d] = NAN;
  return l;
}

AttentionProblem problem(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t q_len, const KvShape& kv,
                         const float* q, const float* k, const float* v, const int32_t* seq_lens, double scale,
                         bool alibi) {
  AttentionProblem p;
  p.batch = batch, p.q_heads = q_heads, p.kv_heads = kv_heads, p.q_len = q_len, p.head_dim = kv.head_dim;
  p.q = q, p.k = KvView::bnsh(k, kv), p.v = KvView::bnsh(v, kv), p.seq_lens = seq_lens;
  p.softmax_scale = scale, p.alibi = alibi;
  return p;
}

}  // namespace

TEST_CASE("prefix positions come from T, lie in the rows' range and do not repeat") {
  CHECK(prefix_positions(256, 0, 255) == std::vector<int64_t>{0, 1, 85, 170, 255});
  CHECK(prefix_positions(37, 0, 36) == std::vector<int64_t>{0, 1, 12, 24, 36});
  CHECK(prefix_positions(101, 0, 100) == std::vector<int64_t>{0, 1, 33, 67, 100});
  CHECK(prefix_positions(2, 0, 1) == std::vector<int64_t>{0, 1});
  CHECK(prefix_positions(1, 0, 0) == std::vector<int64_t>{0});
  CHECK(prefix_positions(256, 0, 127) == std::vector<int64_t>{0, 1, 85, 127});  // a shorter sequence
  CHECK(prefix_positions(100, 60, 63) == std::vector<int64_t>{60, 63});         // Tq = 4 rows of 64 tokens
  CHECK(prefix_positions(10, 3, 2).empty());
}

TEST_CASE("real-dump decode cases for any dump shape reproduce the dump's own queries") {
  for (int64_t tokens : {1, 2, 37, 100, 101, 256})
    for (int64_t batch : {1, 3})
      for (bool every_position : {false, true})
        for (int64_t head_dim : {8, 64, 128}) {
          const int64_t q_len = every_position ? tokens : 1;
          const bool alibi = head_dim == 64;
          SUBCASE(fmt::format("T={} B={} Tq={} D={}{}", tokens, batch, q_len, head_dim, alibi ? " alibi" : "").c_str()) {
            const KvLayer l = layer_of(batch, tokens, q_len, head_dim, alibi);
            const std::vector<DumpDecodeCase> cases = dump_decode_cases(l, "user.h5");
            REQUIRE(!cases.empty());
            const AttentionOutput whole =
                attention(problem(batch, 6, 2, q_len, l.kv_shape, l.q.data(), l.k.data(), l.v.data(),
                                  l.seq_lens.data(), l.softmax_scale, alibi));
            std::set<int64_t> entries;
            for (const DumpDecodeCase& c : cases) {
              CHECK(c.label.find("user.h5 layer 3") == 0);
              const DecodeShape& s = c.shape;
              REQUIRE(s.batch == static_cast<int64_t>(c.queries.size()));
              CHECK((s.q_heads == 6 && s.kv_heads == 2 && s.tokens == tokens && s.head_dim == head_dim));
              CHECK((c.alibi == alibi && c.softmax_scale == l.softmax_scale));
              REQUIRE(c.seq_lens.size() == c.queries.size());
              REQUIRE(c.k.size() == static_cast<size_t>(s.batch * 2 * tokens * head_dim));
              REQUIRE(c.q.size() == static_cast<size_t>(s.batch * 6 * head_dim));
              CHECK(std::all_of(c.k.begin(), c.k.end(), [](float x) { return std::isfinite(x); }));  // padding zeroed
              std::set<std::pair<int64_t, int64_t>> seen;
              for (size_t i = 0; i < c.queries.size(); ++i) {
                const DumpQuery& e = c.queries[i];
                const int64_t len = l.seq_lens[e.batch];
                CHECK((c.seq_lens[i] >= 0 && c.seq_lens[i] <= tokens && c.seq_lens[i] == e.position + 1));
                CHECK((e.q_row >= 0 && e.q_row < q_len));
                CHECK(e.position <= len - 1);
                CHECK(e.position >= (len == 0 ? -1 : std::max<int64_t>(0, len - q_len)));
                CHECK(seen.insert({e.batch, e.position}).second);  // no repeats
                entries.insert(e.batch);
              }
              // Every query is the dump's own row: the same fp64 result.
              auto same = [](double a, double b) { return a == b || std::fabs(a - b) <= 1e-12 * (1 + std::fabs(b)); };
              const AttentionOutput got =
                  attention(problem(s.batch, 6, 2, 1, {s.batch, 2, tokens, head_dim}, c.q.data(), c.k.data(),
                                    c.v.data(), c.seq_lens.data(), c.softmax_scale, c.alibi));
              for (size_t i = 0; i < c.queries.size(); ++i)
                for (int64_t h = 0; h < 6; ++h) {
                  const DumpQuery& e = c.queries[i];
                  const int64_t row = (e.batch * 6 + h) * q_len + e.q_row;
                  REQUIRE(same(got.lse[i * 6 + h], whole.lse[row]));
                  for (int64_t d = 0; d < head_dim; ++d) REQUIRE(same(got.o[(i * 6 + h) * head_dim + d], whole.o[row * head_dim + d]));
                }
            }
            CHECK(static_cast<int64_t>(entries.size()) == batch);  // every entry, the empty one too
            if (batch == 3) {  // each non-empty entry's last position is its own decode step
              for (int64_t b : {0, 2}) {
                bool last = false;
                for (const DumpDecodeCase& c : cases)
                  for (const DumpQuery& e : c.queries) last = last || (e.batch == b && e.position == l.seq_lens[b] - 1);
                CHECK(last);
              }
            }
          }
        }
}

TEST_CASE("real-dump decode cases split to bound memory and keep every query once") {
  const KvLayer l = layer_of(3, 101, 101, 8, false);
  const std::vector<DumpDecodeCase> whole = dump_decode_cases(l, "x.h5");
  const std::vector<DumpDecodeCase> split = dump_decode_cases(l, "x.h5", 2 * 2 * 101 * 8);  // two entries each
  REQUIRE(whole.size() == 1);
  size_t queries = 0;
  for (const DumpDecodeCase& c : split) {
    CHECK(c.shape.batch <= 2);
    queries += c.queries.size();
  }
  CHECK(queries == whole[0].queries.size());
  CHECK(split.size() == (whole[0].queries.size() + 1) / 2);
  KvLayer no_q = l;
  no_q.q.clear();
  CHECK(dump_decode_cases(no_q, "x.h5").empty());
}
