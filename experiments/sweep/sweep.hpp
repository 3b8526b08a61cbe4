// The accuracy sweep: for each layer x (K scheme, V scheme), reconstruction error of K and V and,
// when the layer has decode queries, the attention error against the fp64 reference on the
// original K/V. Memory per token comes with every row.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "data/kv_layer.hpp"
#include "quant/scheme_pairs.hpp"
#include "reference/attention.hpp"
#include "reference/metrics.hpp"

namespace kvq {

// The layer's decode queries against K/V `k` and `v` (the layer's own, or a dequantized copy),
// with the layer's softmax scale, ALiBi flag and sequence lengths.
AttentionProblem attention_problem(const KvLayer& layer, const std::vector<float>& k, const std::vector<float>& v);

// Padding (t >= seq_lens[b]) may hold anything, NaN too, and must not influence a result. The
// quantizers see it filled with the entry's last valid token (an empty entry: another entry's, else
// zeros): values its scale groups already hold, so per-tensor and per-channel statistics are those of
// the valid tokens. Reconstruction errors are taken with the padding zeroed on both sides.
// Where no entry is shorter than T (the common dump) both are the tensor itself: no copies.
class ValidTokens {
 public:
  ValidTokens(const std::vector<float>& x, const KvShape& shape, const std::vector<int32_t>& seq_lens);
  const std::vector<float>& filled() const { return padded_ ? filled_ : x_; }  // what the quantizers see
  const std::vector<float>& zeroed() const { return padded_ ? zeroed_ : x_; }  // what the errors compare with

 private:
  const std::vector<float>& x_;
  bool padded_;
  std::vector<float> filled_, zeroed_;
};
void zero_padding(std::vector<float>& x, const KvShape& shape, const std::vector<int32_t>& seq_lens);

// +had in the sweep: every D-row of `x` rotated by the codec's fp32 transform (K, Q); and O rotated
// back in fp64 (a +had V: O = H (P · H V), H symmetric and orthogonal).
void rotate_rows(std::vector<float>& x, int64_t head_dim, int64_t block);
void rotate_rows_back(std::vector<double>& x, int64_t head_dim, int64_t block);

// GPU decode time of a scheme pair, measured at a reference decode shape (not the dump's).
struct DecodeLatency {
  std::string variant, shape;
  double us = 0, gbps = 0;
};

struct SweepRow {
  std::string source;
  int dump = 0;  // index of its dump's record in sweep.json: two dumps may share a source
  int layer = 0;
  SchemePair schemes;
  double k_sqnr_db = 0, k_max_abs = 0, v_sqnr_db = 0, v_max_abs = 0;
  bool has_attention = false;  // false when the layer has no queries
  OutputError output;
  std::vector<HeadError> heads;  // per (b, query head), in that order
  int64_t q_heads = 0;           // to index heads
  ProbabilityError probabilities;
  double k_bytes_per_token_head = 0, v_bytes_per_token_head = 0;
  double kv_bits_per_element = 0;  // K and V together
  int64_t k_group_elems = 0, v_group_elems = 0;  // elements per scale group
  std::optional<DecodeLatency> latency;          // kvq sweep with a GPU (experiments/sweep/sweep_latency.hpp)
};

struct SweepOptions {
  int64_t top_k = 8;  // for the top-k overlap of attention probabilities
  // Names of K, V and Q in error messages (e.g. "x.h5: /layers/3/k"); default "<source> layer <L> K".
  std::string k_name, v_name, q_name;
  // Called with each row as it is finished (a shard saves it at once: a killed job loses one pair).
  std::function<void(const SweepRow&)> on_row;
};

// The pairs a sweep runs on a layer of `head_dim`: the crossed lists (one list empty: the other for
// both), or without either the default set (quant/scheme_pairs.hpp).
std::vector<SchemePair> sweep_pairs(const std::string& k_schemes, const std::string& v_schemes, int64_t head_dim);

// Throws SchemeError when a pair does not fit the layer's head_dim, InputError for non-finite K, V
// (when a pair quantizes them) or Q.
std::vector<SweepRow> sweep_layer(const KvLayer& layer, const std::vector<SchemePair>& pairs,
                                  const SweepOptions& options = {});

}  // namespace kvq
