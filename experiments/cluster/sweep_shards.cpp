#include "experiments/cluster/sweep_shards.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>

#include "data/dump.hpp"
#include "experiments/common/dump_check.hpp"
#include "experiments/common/run_info.hpp"
#include "experiments/sweep/results_writer.hpp"
#include "experiments/sweep/sweep_checkpoint.hpp"
#include "quant/errors.hpp"

namespace kvq {
namespace {

std::string unit_id(size_t dump, int layer, const SchemePair& p) {
  return fmt::format("d{}-L{}-{}__{}", dump, layer, to_string(p.k), to_string(p.v));
}

// Progress on stderr: rewritten in place on a terminal, one line per layer in a log file.
void progress(const std::string& text) {
  static const bool tty = isatty(fileno(stderr));
  if (tty)
    fmt::print(stderr, "\r\033[K{}", text);
  else if (!text.empty())
    fmt::print(stderr, "{}\n", text);
}

}  // namespace

WorkPlan plan_sweep(const SweepStudy& study, int shards) {
  for (const std::string& list : {study.k_schemes, study.v_schemes})  // unknown names: before any file is read
    if (!list.empty()) parse_scheme_list(list);
  refuse_repeated_dumps(study.dumps, "plan sweep");
  WorkPlan plan;
  plan.kind = "sweep";
  plan.shards = shards;
  nlohmann::json dumps = nlohmann::json::array();
  for (size_t d = 0; d < study.dumps.size(); ++d) {
    const std::string& path = study.dumps[d];
    const DumpInfo info = open_dump_checked(path, study.layers);
    nlohmann::json layers = nlohmann::json::array(), no_queries = nlohmann::json::array();
    for (size_t i : select_layers(info, study.layers)) {
      const LayerInfo& li = info.layers[i];
      layers.push_back(li.index);
      if (!li.q) no_queries.push_back(li.index);
      const std::vector<int64_t>& kv = li.k.shape;  // [B, Hkv, T, D]
      const double cache = static_cast<double>(kv[0] * kv[1] * kv[2] * kv[3]);
      const double attention = li.q ? static_cast<double>(li.q->shape[0] * li.q->shape[1] * li.q->shape[2]) *
                                          static_cast<double>(kv[2] * kv[3])
                                    : 0.0;
      for (const SchemePair& p : sweep_pairs(study.k_schemes, study.v_schemes, li.head_dim)) {
        for (const Scheme& s : {p.k, p.v}) {
          try {
            check_scheme_fits(s, static_cast<int>(li.head_dim));
          } catch (const InputError& e) {
            throw InputError(fmt::format("{}: /layers/{}: {}", path, li.name, e.what()));
          }
        }
        const double cost = 1.0 + (attention + 4 * cache) / 1e6;  // 1: a unit's fixed overhead, in Mflop-ish
        plan.units.push_back({unit_id(d, li.index, p), "", cost,
                              {{"dump", d}, {"layer", li.index}, {"k", to_string(p.k)}, {"v", to_string(p.v)}}});
      }
    }
    dumps.push_back({{"file", path}, {"sha256", file_sha256(path)}, {"source", info.source}, {"rope", info.rope},
                     {"layers", layers}, {"layers_without_q", no_queries}});
  }
  if (plan.units.empty()) throw InputError("plan sweep: no units (give dumps with layers)");
  plan.settings = {{"top_k", study.top_k}, {"k_schemes", study.k_schemes}, {"v_schemes", study.v_schemes},
                   {"layers", study.layers}, {"dumps", dumps}};
  return plan;
}

void run_sweep_shard(const WorkPlan& plan, const ShardSpec& spec, const std::string& out_dir) {
  const auto started = std::chrono::steady_clock::now();
  const ShardDir out(out_dir, plan);
  const std::vector<size_t> mine = units_of_shard(plan, spec);
  const nlohmann::json& dumps = plan.settings.at("dumps");
  const int64_t top_k = plan.settings.at("top_k").get<int64_t>();
  const nlohmann::json ran_by = task_info();
  std::vector<std::string> ran, reused;
  // (dump, layer) -> this shard's units of it, in plan order: a layer is read and its reference
  // computed once per shard.
  std::map<std::pair<size_t, int>, std::vector<size_t>> groups;
  for (size_t i : mine) {
    const WorkUnit& u = plan.units[i];
    if (out.result(u).is_null())
      groups[{u.key.at("dump").get<size_t>(), u.key.at("layer").get<int>()}].push_back(i);
    else
      reused.push_back(u.id);
  }
  size_t done = reused.size();
  std::map<size_t, DumpInfo> opened;
  for (const auto& [where, units] : groups) {
    const auto& [d, layer_index] = where;
    const std::string path = dumps.at(d).at("file").get<std::string>();
    if (!opened.count(d)) {  // the plan's bytes, or nothing: units of two versions of a dump must not mix
      const std::string planned = dumps.at(d).at("sha256").get<std::string>(), now = file_sha256(path);
      if (now != planned)
        throw InputError(fmt::format("{}: changed since the plan was made (sha256 {} in the plan, {} now): make a new "
                                     "plan", path, planned, now));
      std::vector<int> layers;
      for (const auto& [w, _] : groups)
        if (w.first == d) layers.push_back(w.second);
      opened[d] = open_dump_checked(path, layers);
    }
    const DumpInfo& info = opened[d];
    const std::vector<size_t> pos = select_layers(info, {layer_index});
    const LayerInfo& li = info.layers[pos.front()];
    progress(fmt::format("sweep shard {}: {} of {} units done; {} layer {}", spec.label(), done, mine.size(), path,
                         layer_index));
    const KvLayer layer = read_layer(info, pos.front());
    check_finite_queries(info, pos.front(), layer);
    std::vector<SchemePair> pairs;
    for (size_t i : units)
      pairs.push_back({parse_scheme(plan.units[i].key.at("k").get<std::string>()),
                       parse_scheme(plan.units[i].key.at("v").get<std::string>())});
    const std::string name = fmt::format("{}: /layers/{}", path, li.name);
    SweepOptions options{top_k, name + "/k", name + "/v", name + "/q", {}};
    size_t next = 0;  // rows come in pairs order
    options.on_row = [&](const SweepRow& row) {
      const WorkUnit& u = plan.units[units[next++]];
      out.save(u, {{"row", to_json(row)}}, ran_by);
      ran.push_back(u.id);
      ++done;
    };
    sweep_layer(layer, pairs, options);
  }
  progress("");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  out.record_run(spec, "", ran, reused, seconds, ran_by);
  fmt::print("sweep shard {}: {} unit(s) run, {} reused from an earlier run, {} in all, {:.1f} s; results in {}/units\n",
             spec.label(), ran.size(), reused.size(), mine.size(), seconds, out_dir);
}

void merge_sweep(const CollectedUnits& c, const std::string& out_dir) {
  std::vector<SweepRow> rows;
  for (size_t i = 0; i < c.results.size(); ++i) {
    try {
      rows.push_back(sweep_row_from_json(c.results[i].at("row")));
      rows.back().dump = c.plan.units[i].key.at("dump").get<int>();  // from the plan: unit files predate the column
    } catch (const std::exception& e) {
      throw InputError(fmt::format("merge: unit {}: its row cannot be read ({})", c.plan.units[i].id, e.what()));
    }
  }
  nlohmann::json sources = nlohmann::json::array();
  for (const nlohmann::json& d : c.plan.settings.at("dumps"))
    sources.push_back({{"file", d.at("file")}, {"sha256", d.at("sha256")}, {"source", d.at("source")},
                       {"rope", d.at("rope")},
                       {"layers", d.at("layers").dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)}});
  print_sweep_table(rows, stdout);
  for (const nlohmann::json& d : c.plan.settings.at("dumps"))
    if (!d.at("layers_without_q").empty())
      fmt::print("note: {} has layers without decode queries (q): their attention metrics need Q; they get "
                 "reconstruction metrics only\n", d.at("file").get<std::string>());
  write_sweep_results(out_dir, rows, sources, c.plan.settings.at("top_k").get<int64_t>(), true);
  fmt::print("\nwrote {0}/sweep.csv ({1} rows), {0}/sweep_heads.csv and {0}/sweep.json\n", out_dir, rows.size());
}

}  // namespace kvq
