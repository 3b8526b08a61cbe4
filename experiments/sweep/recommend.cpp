#include "experiments/sweep/recommend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "experiments/common/csv_table.hpp"
#include "quant/errors.hpp"

namespace kvq {
namespace {

bool better(const PairResult& a, const PairResult& b) {
  if (a.kv_bytes_per_token_head != b.kv_bytes_per_token_head) return a.kv_bytes_per_token_head < b.kv_bytes_per_token_head;
  return a.error < b.error;
}

}  // namespace

std::vector<Recommendation> recommend(const std::vector<PairResult>& results, double budget) {
  // A layer is one of one dump: two dumps with the same source (two captures of one model and text)
  // are two layers each, not one.
  using LayerKey = std::tuple<int, std::string, int>;
  std::map<LayerKey, Recommendation> per_layer;
  std::map<std::pair<std::string, std::string>, PairResult> per_pair;  // worst error, summed bytes
  std::map<std::pair<std::string, std::string>, std::set<LayerKey>> pair_layers;
  for (const PairResult& r : results) {
    Recommendation& rec = per_layer[{r.dump, r.source, r.layer}];
    rec.source = r.source;
    rec.dump = r.dump;
    rec.layer = r.layer;
    if (r.error <= budget && (!rec.found || better(r, rec.best))) rec.best = r, rec.found = true;
    PairResult& p = per_pair[{r.k_scheme, r.v_scheme}];
    p.k_scheme = r.k_scheme, p.v_scheme = r.v_scheme;
    p.error = std::max(p.error, r.error);
    p.kv_bytes_per_token_head += r.kv_bytes_per_token_head;
    pair_layers[{r.k_scheme, r.v_scheme}].insert({r.dump, r.source, r.layer});
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
  const std::vector<size_t> c = t.columns({"source", "layer", "k_scheme", "v_scheme", "k_bytes_per_token_head",
                                           "v_bytes_per_token_head", metric},
                                          "kvq sweep's results (sweep.csv)");
  const size_t source = c[0], layer = c[1], k = c[2], v = c[3], kb = c[4], vb = c[5], err = c[6];
  const bool has_dump = t.has_column("dump");  // absent in files written before the column
  const size_t dump = has_dump ? t.columns({"dump"}, "kvq sweep's results (sweep.csv)")[0] : 0;
  std::map<std::tuple<int, std::string, int, std::string, std::string>, size_t> seen;  // -> line
  std::vector<PairResult> out;
  for (size_t r = 0; r < t.rows(); ++r) {
    if (t.at(r, err).empty())
      throw InputError(fmt::format("{}: line {}: no {} (the dump had no decode queries Q, which attention metrics need)",
                                   csv_path, r + 2, metric));
    out.push_back({t.at(r, source), static_cast<int>(t.number(r, layer)), t.at(r, k), t.at(r, v),
                   t.number(r, kb) + t.number(r, vb), t.number(r, err), has_dump ? static_cast<int>(t.number(r, dump)) : -1});
    const PairResult& p = out.back();
    const auto [it, fresh] = seen.insert({{p.dump, p.source, p.layer, p.k_scheme, p.v_scheme}, r + 2});
    if (!fresh)  // one result per layer and pair: a second would be counted as another layer, or hide one
      throw InputError(fmt::format(
          "{}: lines {} and {}: the same {}layer {} and pair {} / {} twice{}", csv_path, it->second, r + 2,
          has_dump ? fmt::format("dump {}, ", p.dump) : "", p.layer, p.k_scheme, p.v_scheme,
          has_dump ? "" : fmt::format(" (two dumps with the source '{}' in a file without the dump column, "
                                      "which kvq sweep now writes: sweep them again)", p.source)));
  }
  if (out.empty()) throw InputError(fmt::format("{}: no result rows", csv_path));
  return out;
}

bool is_end_to_end_results(const std::string& csv_path) { return CsvTable::read(csv_path).has_column("kld_mean"); }

std::vector<EndToEndResult> read_end_to_end_results(const std::string& csv_path, const std::string& metric) {
  const CsvTable t = CsvTable::read(csv_path);
  const std::vector<size_t> c =
      t.columns({"source", "k_scheme", "v_scheme", "k_bytes_per_token_head", "v_bytes_per_token_head", "kld_mean",
                 "kld_max", "top1_agreement", "ppl_delta", metric},
                "kvq eval's results (eval.csv)");
  const size_t source = c[0], k = c[1], v = c[2], kb = c[3], vb = c[4], mean = c[5], max = c[6], top1 = c[7],
               ppl = c[8], err = c[9];
  std::vector<EndToEndResult> out;
  for (size_t r = 0; r < t.rows(); ++r)
    out.push_back({t.at(r, source), t.at(r, k), t.at(r, v), t.number(r, kb) + t.number(r, vb), t.number(r, mean),
                   t.number(r, max), t.number(r, top1), t.number(r, ppl), t.number(r, err)});
  if (out.empty()) throw InputError(fmt::format("{}: no result rows", csv_path));
  return out;
}

std::vector<EndToEndRanking> rank_end_to_end(const std::vector<EndToEndResult>& results, double budget) {
  std::vector<EndToEndRanking> rankings;
  for (const EndToEndResult& r : results) {
    auto it = std::find_if(rankings.begin(), rankings.end(), [&](const EndToEndRanking& g) { return g.source == r.source; });
    if (it == rankings.end()) it = rankings.insert(rankings.end(), EndToEndRanking{r.source, {}, -1});
    it->ranked.push_back(r);
  }
  for (EndToEndRanking& g : rankings) {
    std::stable_sort(g.ranked.begin(), g.ranked.end(), [](const EndToEndResult& a, const EndToEndResult& b) {
      return a.error != b.error ? a.error < b.error : a.kv_bytes_per_token_head < b.kv_bytes_per_token_head;
    });
    for (size_t i = 0; i < g.ranked.size(); ++i) {
      const EndToEndResult& r = g.ranked[i];
      if (r.error > budget) continue;
      if (g.best < 0 || r.kv_bytes_per_token_head < g.ranked[g.best].kv_bytes_per_token_head)
        g.best = static_cast<int>(i);  // ranked by error, so the first of equal bytes has the lower error
    }
  }
  return rankings;
}

}  // namespace kvq
