// The smallest-memory K and V schemes that stay within an attention-error budget.
#pragma once

#include <string>
#include <vector>

namespace kvq {

struct PairResult {
  std::string source;
  int layer = 0;
  std::string k_scheme, v_scheme;
  double kv_bytes_per_token_head = 0;  // K + V
  double error = 0;                     // the budgeted metric, e.g. out_rel_l2_mean
  int dump = -1;  // sweep.csv's dump column; -1 in a file written before it (rows keyed by source)
};

struct Recommendation {
  std::string source;  // empty for the overall recommendation
  int dump = -1;
  int layer = -1;      // -1: overall (every layer of every source)
  bool found = false;
  PairResult best;  // for overall: the worst error over layers, the mean bytes
};

// Per (dump, source, layer): the pair with the fewest bytes whose error <= budget (ties: lower error).
// Overall: the pair within budget on every layer of every source with the fewest mean bytes.
std::vector<Recommendation> recommend(const std::vector<PairResult>& results, double budget);

// Reads a sweep CSV; `metric` names the error column (out_rel_l2_mean, out_rel_l2_max, ...).
// Throws InputError when the file lacks the column or has no attention metrics (no Q), or when two
// rows have the same dump, layer and pair (e.g. an old file without the dump column whose dumps share a source).
std::vector<PairResult> read_pair_results(const std::string& csv_path, const std::string& metric);

// ---- end to end (kvq eval results) -----------------------------------------------------------
// One evaluated pair: what the whole model lost with its KV cache in these schemes.
struct EndToEndResult {
  std::string source;
  std::string k_scheme, v_scheme;
  double kv_bytes_per_token_head = 0;  // K + V
  double kld_mean = 0, kld_max = 0, top1_agreement = 0, ppl_delta = 0;
  double error = 0;  // the ranked metric: kld_mean or kld_max
};

// True when the CSV holds kvq eval results (a kld_mean column) rather than sweep results.
bool is_end_to_end_results(const std::string& csv_path);
// Reads eval.csv (experiments/eval/kvq_eval.py); `metric` is kld_mean or kld_max.
std::vector<EndToEndResult> read_end_to_end_results(const std::string& csv_path, const std::string& metric);

struct EndToEndRanking {
  std::string source;
  std::vector<EndToEndResult> ranked;  // by error, then bytes
  int best = -1;  // index into ranked: the fewest bytes within budget (ties: lower error); -1 if none
};
// One ranking per source (model and text), in order of first appearance.
std::vector<EndToEndRanking> rank_end_to_end(const std::vector<EndToEndResult>& results, double budget);

}  // namespace kvq
