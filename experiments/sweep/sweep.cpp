#include "experiments/sweep/sweep.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "quant/hadamard.hpp"
#include "quant/quantize.hpp"
#include "reference/attention.hpp"

namespace kvq {

AttentionProblem attention_problem(const KvLayer& layer, const std::vector<float>& k, const std::vector<float>& v) {
  AttentionProblem p;
  p.batch = layer.q_shape.batch;
  p.q_heads = layer.q_shape.heads;
  p.kv_heads = layer.kv_shape.heads;
  p.q_len = layer.q_shape.tokens;
  p.head_dim = layer.kv_shape.head_dim;
  p.q = layer.q.data();
  p.k = KvView::bnsh(k.data(), layer.kv_shape);
  p.v = KvView::bnsh(v.data(), layer.kv_shape);
  p.seq_lens = layer.seq_lens.empty() ? nullptr : layer.seq_lens.data();
  p.softmax_scale = layer.softmax_scale;
  p.alibi = layer.alibi;
  return p;
}

namespace {

// Dequantized tensors, one per distinct scheme, with their reconstruction error. `values` are in the
// basis attention uses (rotated for +had); the errors are against the input, in its own basis.
struct Reconstruction {
  std::vector<float> values;
  double sqnr_db, max_abs;
};

const Reconstruction& reconstruct(std::map<std::string, Reconstruction>& cache, const ValidTokens& x,
                                  const KvLayer& layer, const Scheme& s, const std::string& tensor_name) {
  const std::string key = to_string(s);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const int32_t* lens = layer.seq_lens.empty() ? nullptr : layer.seq_lens.data();
  std::vector<float> x_hat = dequantize(quantize(KvView::bnsh(x.filled().data(), layer.kv_shape), s, tensor_name, lens));
  std::vector<float> unrotated = x_hat;
  if (s.hadamard) rotate_rows(unrotated, layer.kv_shape.head_dim, s.rotation_block(layer.kv_shape.head_dim));
  zero_padding(unrotated, layer.kv_shape, layer.seq_lens);  // errors over valid tokens only
  Reconstruction r{std::move(x_hat), sqnr_db(x.zeroed(), unrotated), max_abs_difference(x.zeroed(), unrotated)};
  return cache.emplace(key, std::move(r)).first->second;
}

}  // namespace

ValidTokens::ValidTokens(const std::vector<float>& x, const KvShape& shape, const std::vector<int32_t>& seq_lens)
    : x_(x), padded_(std::any_of(seq_lens.begin(), seq_lens.end(), [&](int32_t l) { return l < shape.tokens; })) {
  if (!padded_) return;
  filled_ = x;
  const int64_t D = shape.head_dim;
  const auto first = std::find_if(seq_lens.begin(), seq_lens.end(), [](int32_t l) { return l > 0; });
  for (int64_t b = 0; b < shape.batch; ++b) {
    const int64_t len = seq_lens[b];
    // The entry's last valid token; an empty entry takes the first non-empty one's (none: zeros).
    const int64_t from_b = len > 0 ? b : first != seq_lens.end() ? first - seq_lens.begin() : -1;
    for (int64_t h = 0; h < shape.heads; ++h)
      for (int64_t t = len; t < shape.tokens; ++t) {
        float* row = filled_.data() + ((b * shape.heads + h) * shape.tokens + t) * D;
        if (from_b < 0) {
          std::fill(row, row + D, 0.0f);
        } else {
          const float* last = x.data() + ((from_b * shape.heads + h) * shape.tokens + seq_lens[from_b] - 1) * D;
          std::copy(last, last + D, row);
        }
      }
  }
  zeroed_ = filled_;
  zero_padding(zeroed_, shape, seq_lens);
}

void zero_padding(std::vector<float>& x, const KvShape& shape, const std::vector<int32_t>& seq_lens) {
  for (int64_t b = 0; b < static_cast<int64_t>(seq_lens.size()); ++b)
    for (int64_t h = 0; h < shape.heads; ++h) {
      const auto row = [&](int64_t t) { return x.begin() + ((b * shape.heads + h) * shape.tokens + t) * shape.head_dim; };
      std::fill(row(seq_lens[b]), row(shape.tokens), 0.0f);
    }
}

void rotate_rows(std::vector<float>& x, int64_t head_dim, int64_t block) {
  for (size_t i = 0; i + head_dim <= x.size(); i += head_dim) hadamard_rotate(x.data() + i, head_dim, block);
}

void rotate_rows_back(std::vector<double>& x, int64_t head_dim, int64_t block) {
  for (size_t i = 0; i + head_dim <= x.size(); i += head_dim) hadamard_rotate_back(x.data() + i, head_dim, block);
}

std::vector<SchemePair> sweep_pairs(const std::string& k_schemes, const std::string& v_schemes, int64_t head_dim) {
  if (k_schemes.empty() && v_schemes.empty()) return default_pairs(head_dim);
  const std::string& k = k_schemes.empty() ? v_schemes : k_schemes;
  const std::string& v = v_schemes.empty() ? k_schemes : v_schemes;
  return cross_pairs(parse_scheme_list(k), parse_scheme_list(v));
}

std::vector<SweepRow> sweep_layer(const KvLayer& layer, const std::vector<SchemePair>& pairs,
                                  const SweepOptions& options) {
  for (const SchemePair& pair : pairs) {
    check_scheme_fits(pair.k, static_cast<int>(layer.kv_shape.head_dim));
    check_scheme_fits(pair.v, static_cast<int>(layer.kv_shape.head_dim));
  }
  const std::string where = layer.source + " layer " + std::to_string(layer.layer);
  auto name = [&](const std::string& given, const char* tensor) { return given.empty() ? where + " " + tensor : given; };
  std::vector<double> ref_probs;
  AttentionOutput ref;
  if (layer.has_queries()) {  // NaN queries would give NaN metrics and exit 0
    check_finite(KvView::bnsh(layer.q.data(), layer.q_shape), name(options.q_name, "Q"), "attention needs finite queries");
    ref = attention(attention_problem(layer, layer.k, layer.v), {}, {}, &ref_probs);
  }

  const int64_t head_dim = layer.kv_shape.head_dim;
  std::map<int64_t, std::vector<float>> rotated_q;  // for +had K schemes, per rotation block
  if (layer.has_queries())
    for (const SchemePair& pair : pairs)
      if (pair.k.hadamard && !rotated_q.count(pair.k.rotation_block(head_dim))) {
        std::vector<float>& q = rotated_q[pair.k.rotation_block(head_dim)] = layer.q;
        rotate_rows(q, head_dim, pair.k.rotation_block(head_dim));
      }
  // Padding may hold anything, NaN too, and must not reach a result (DESIGN.md).
  const ValidTokens k_in(layer.k, layer.kv_shape, layer.seq_lens), v_in(layer.v, layer.kv_shape, layer.seq_lens);
  std::map<std::string, Reconstruction> k_cache, v_cache;
  std::vector<SweepRow> rows;
  for (const SchemePair& pair : pairs) {
    const Reconstruction& k = reconstruct(k_cache, k_in, layer, pair.k, name(options.k_name, "K"));
    const Reconstruction& v = reconstruct(v_cache, v_in, layer, pair.v, name(options.v_name, "V"));
    SweepRow row;
    row.source = layer.source;
    row.layer = layer.layer;
    row.schemes = pair;
    row.k_sqnr_db = k.sqnr_db;
    row.k_max_abs = k.max_abs;
    row.v_sqnr_db = v.sqnr_db;
    row.v_max_abs = v.max_abs;
    const int32_t* lens = layer.seq_lens.empty() ? nullptr : layer.seq_lens.data();
    row.k_bytes_per_token_head = bytes_per_token_per_head(pair.k, layer.kv_shape, lens);
    row.v_bytes_per_token_head = bytes_per_token_per_head(pair.v, layer.kv_shape, lens);
    row.kv_bits_per_element =
        (bits_per_element(pair.k, layer.kv_shape, lens) + bits_per_element(pair.v, layer.kv_shape, lens)) / 2;
    row.k_group_elems = elements_per_group(pair.k, layer.kv_shape);
    row.v_group_elems = elements_per_group(pair.v, layer.kv_shape);
    if (layer.has_queries()) {
      std::vector<double> probs;
      AttentionProblem problem = attention_problem(layer, k.values, v.values);
      if (pair.k.hadamard) problem.q = rotated_q[pair.k.rotation_block(head_dim)].data();  // Q·K unchanged in exact arithmetic
      AttentionOutput out = attention(problem, {}, {}, &probs);
      if (pair.v.hadamard) rotate_rows_back(out.o, head_dim, pair.v.rotation_block(head_dim));  // O = H (P · H V)
      row.has_attention = true;
      row.heads = head_errors(out.o, ref.o, layer.q_shape.tokens * layer.q_shape.head_dim);
      row.output = summarize(row.heads);
      row.q_heads = layer.q_shape.heads;
      if (layer.kv_shape.tokens > 0)
        row.probabilities = probability_error(probs, ref_probs, layer.kv_shape.tokens, options.top_k);
    }
    if (options.on_row) options.on_row(row);
    rows.push_back(row);
  }
  return rows;
}

}  // namespace kvq
