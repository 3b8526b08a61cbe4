#include "experiments/recommend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "experiments/csv_table.hpp"
#include "quant/errors.hpp"

namespace kvq {
namespace {

bool better(const PairResult& a, const PairResult& b) {
  if (a.kv_bytes_per_token_head != b.kv_bytes_per_token_head) return a.kv_bytes_per_token_head < b.kv_bytes_per_token_head;
  return a.error < b.error;
}

}  // namespace

std::vector<Recommendation> recommend(const std::vector<PairResult>& results, double budget) {
  std::map<std::pair<std::string, int>, Recommendation> per_layer;
  std::map<std::pair<std::string, std::string>, PairResult> per_pair;  // worst error, summed bytes
  std::map<std::pair<std::string, std::string>, std::set<std::pair<std::string, int>>> pair_layers;
  for (const PairResult& r : results) {
    Recommendation& rec = per_layer[{r.source, r.layer}];
    rec.source = r.source;
    rec.layer = r.layer;
    if (r.error <= budget && (!rec.found || better(r, rec.best))) rec.best = r, rec.found = true;
    PairResult& p = per_pair[{r.k_scheme, r.v_scheme}];
    p.k_scheme = r.k_scheme, p.v_scheme = r.v_scheme;
    p.error = std::max(p.error, r.error);
    p.kv_bytes_per_token_head += r.kv_bytes_per_token_head;
    pair_layers[{r.k_scheme, r.v_scheme}].insert({r.source, r.layer});
  }
  std::vector<Recommendation> out;
  for (auto& [key, rec] : per_layer) out.push_back(rec);
  Recommendation overall;
  for (auto& [key, p] : per_pair) {
    if (pair_layers[key].size() != per_layer.size() || p.error > budget) continue;  // must cover every layer
    PairResult mean = p;
    mean.kv_bytes_per_token_head /= static_cast<double>(per_layer.size());
    if (!overall.found || better(mean, overall.best)) overall.best = mean, overall.found = true;
  }
  out.push_back(overall);
  return out;
}

std::vector<PairResult> read_pair_results(const std::string& csv_path, const std::string& metric) {
  const CsvTable t = CsvTable::read(csv_path);
  const size_t source = t.column("source"), layer = t.column("layer"), k = t.column("k_scheme"),
               v = t.column("v_scheme"), kb = t.column("k_bytes_per_token_head"),
               vb = t.column("v_bytes_per_token_head"), err = t.column(metric);
  std::vector<PairResult> out;
  for (size_t r = 0; r < t.rows(); ++r) {
    if (t.at(r, err).empty())
      throw InputError(fmt::format("{}: line {}: no {} (the dump had no decode queries Q, which attention metrics need)",
                                   csv_path, r + 2, metric));
    out.push_back({t.at(r, source), static_cast<int>(t.number(r, layer)), t.at(r, k), t.at(r, v),
                   t.number(r, kb) + t.number(r, vb), t.number(r, err)});
  }
  if (out.empty()) throw InputError(fmt::format("{}: no result rows", csv_path));
  return out;
}

}  // namespace kvq
