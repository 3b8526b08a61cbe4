// kvq sweep: accuracy of every scheme pair on dumps (or synthetic data).
#include <fmt/format.h>

#include <fmt/ranges.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <set>

#include "data/dump.hpp"
#include "experiments/cli/commands.hpp"
#include "experiments/cli/number_checks.hpp"
#include "experiments/common/dump_check.hpp"
#include "experiments/sweep/recommend_print.hpp"
#include "experiments/sweep/results_writer.hpp"
#include "experiments/common/run_info.hpp"
#include "experiments/sweep/sweep_checkpoint.hpp"
#include "experiments/sweep/sweep_latency.hpp"
#include "experiments/cli/synthetic_options.hpp"
#include "experiments/cluster/sweep_shards.hpp"

namespace kvq {
namespace {

struct SweepArgs {
  std::vector<std::string> dumps;
  std::vector<int> layers;  // empty: all
  bool synthetic = false;
  SyntheticSpec spec{2, 8, 2, 1024, 128, 1};
  std::string k_schemes, v_schemes, out_dir = "results/sweep";
  int64_t top_k = 8;
  double max_rel_l2 = 0.0;  // > 0: print recommendations within this budget
  std::string latency_shape = "seed000:128";
  bool no_latency = false;
  std::string plan, shard;  // --shard: one shard of a study (experiments/cluster/sweep_shards.hpp)
};

// A progress line on stderr, only when it is a terminal.
void progress(const std::string& text) {
  static const bool tty = isatty(fileno(stderr));
  if (tty) fmt::print(stderr, "\r\033[K{}", text);
}

std::vector<SchemePair> pairs_for(const SweepArgs& a, int64_t head_dim) {
  return sweep_pairs(a.k_schemes, a.v_schemes, head_dim);
}

// A dump that could not be swept: its one-line error, printed after the results are written.
struct FailedDump {
  std::string message;
  bool corrupt = false;
};

int run(const SweepArgs& a) {
  for (const std::string& list : {a.k_schemes, a.v_schemes})  // unknown names: before any work
    if (!list.empty()) parse_scheme_list(list);
  refuse_repeated_dumps(a.dumps, "sweep");
  std::vector<SweepRow> rows;
  nlohmann::json sources = nlohmann::json::array();
  std::vector<std::string> notes;
  std::vector<FailedDump> failed;
  const SweepCheckpoint checkpoint(a.out_dir + "/checkpoint");
  std::vector<std::string> resumed, redone;
  std::set<std::pair<std::string, int>> saved_now;  // (sha256, layer): a copy of a dump swept earlier in this run

  const std::string csv = a.out_dir + "/sweep.csv", heads = a.out_dir + "/sweep_heads.csv",
                    json = a.out_dir + "/sweep.json";
  auto write_results = [&](const std::vector<SweepRow>& done, const nlohmann::json& done_sources, bool complete) {
    write_sweep_results(a.out_dir, done, done_sources, a.top_k, complete);
  };

  auto sweep_one = [&](const KvLayer& layer, const SweepOptions& options) {
    progress(fmt::format("sweep: {} layer {}", layer.source, layer.layer));
    return sweep_layer(layer, pairs_for(a, layer.kv_shape.head_dim), options);
  };
  if (a.synthetic) {
    const KvLayer layer = make_synthetic(a.spec);
    sources.push_back({{"file", ""}, {"source", layer.source}, {"rope", "post"}, {"layers", "[0]"}});
    SweepOptions options;
    options.top_k = a.top_k;
    const std::vector<SweepRow> part = sweep_one(layer, options);
    rows.insert(rows.end(), part.begin(), part.end());
  }
  // Each dump on its own: a bad one is reported after the others' results are written. Finished
  // layers are checkpointed, and the results files rewritten, as they finish.
  for (const std::string& path : a.dumps) {
    const int dump = static_cast<int>(sources.size());  // its record's index in sweep.json
    std::vector<SweepRow> dump_rows;
    try {
      const DumpInfo info = open_dump_checked(path, a.layers);
      const std::string sha256 = file_sha256(path);
      nlohmann::json used = nlohmann::json::array();
      auto record = [&] {
        return nlohmann::json{{"file", path}, {"sha256", sha256}, {"source", info.source}, {"rope", info.rope},
                              {"layers", used.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)}};
      };
      for (size_t i : select_layers(info, a.layers)) {
        const LayerInfo& li = info.layers[i];
        const std::string where = fmt::format("{}: /layers/{}", path, li.name);
        SweepOptions options{a.top_k, where + "/k", where + "/v", where + "/q", {}};
        const SweepUnitKey key{sha256, li.index, sweep_settings(pairs_for(a, li.head_dim), options)};
        std::vector<SweepRow> part;
        const SweepCheckpoint::Found found = checkpoint.find(key, &part);
        if (found == SweepCheckpoint::Found::kMatch) {
          if (!saved_now.count({sha256, li.index})) resumed.push_back(fmt::format("{} layer {}", path, li.index));
        } else {
          if (found == SweepCheckpoint::Found::kStale) redone.push_back(fmt::format("{} layer {}", path, li.index));
          const KvLayer layer = read_layer(info, i);  // one layer in memory at a time
          check_finite_queries(info, i, layer);
          part = sweep_one(layer, options);
          checkpoint.save(key, path, part);
          saved_now.insert({sha256, li.index});
        }
        for (SweepRow& r : part) r.dump = dump;
        dump_rows.insert(dump_rows.end(), part.begin(), part.end());
        used.push_back(li.index);
        std::vector<SweepRow> so_far = rows;
        so_far.insert(so_far.end(), dump_rows.begin(), dump_rows.end());
        nlohmann::json so_far_sources = sources;
        so_far_sources.push_back(record());
        write_results(so_far, so_far_sources, false);
      }
      rows.insert(rows.end(), dump_rows.begin(), dump_rows.end());
      sources.push_back(record());
      if (std::any_of(info.layers.begin(), info.layers.end(), [](const LayerInfo& l) { return !l.q; }))
        notes.push_back(fmt::format("note: {} has layers without decode queries (q): their attention metrics need Q; "
                                    "they get reconstruction metrics only", path));
    } catch (const InputError& e) {
      std::string message = e.what();  // e.g. a scheme that does not fit this dump's head_dim
      if (message.rfind(path, 0) != 0) message = path + ": " + message;
      failed.push_back({message, dynamic_cast<const CorruptFileError*>(&e) != nullptr});
      sources.push_back({{"file", path}, {"error", message}});
    }
  }
  progress("");
  auto report_failures = [&] {
    std::fflush(stdout);
    for (const FailedDump& f : failed) fmt::print(stderr, "kvq: error: {}\n", f.message);
    const bool corrupt = std::any_of(failed.begin(), failed.end(), [](const FailedDump& f) { return f.corrupt; });
    return failed.empty() ? 0 : corrupt ? 4 : 3;
  };
  if (rows.empty()) {
    if (!failed.empty()) return report_failures();
    throw InputError("sweep: nothing to do (give dumps or --synthetic)");
  }
  if (!resumed.empty())
    fmt::print("sweep: reused {} finished layer(s) from {} (an earlier run with the same dumps and settings stopped "
               "part-way): {}\n", resumed.size(), checkpoint.dir(), fmt::join(resumed, ", "));
  if (!redone.empty())
    fmt::print("sweep: recomputed {} layer(s) whose checkpoint in {} had other settings: {}\n", redone.size(),
               checkpoint.dir(), fmt::join(redone, ", "));
  if (!a.no_latency) attach_decode_latency(rows, a.latency_shape);
  print_sweep_table(rows, stdout);
  for (const std::string& note : notes) fmt::print("{}\n", note);

  write_results(rows, sources, true);
  fmt::print("\nwrote {} ({} rows), {} and {}\n", csv, rows.size(), heads, json);
  if (failed.empty())
    checkpoint.remove_all();  // complete: nothing to resume
  else
    fmt::print("{} of {} dumps failed (below); the finished layers stay in {} for a rerun\n", failed.size(),
               a.dumps.size(), checkpoint.dir());
  if (a.max_rel_l2 > 0) {
    std::vector<PairResult> results;
    for (const SweepRow& r : rows)
      if (r.has_attention)
        results.push_back({r.source, r.layer, to_string(r.schemes.k), to_string(r.schemes.v),
                           r.k_bytes_per_token_head + r.v_bytes_per_token_head, r.output.rel_l2_mean, r.dump});
    if (results.empty()) {
      report_failures();
      throw InputError("sweep --max-rel-l2: no layer had decode queries, which the budget needs");
    }
    fmt::print("\n");
    print_recommendations(recommend(results, a.max_rel_l2), "out_rel_l2_mean", a.max_rel_l2, stdout);
  }
  return report_failures();
}

}  // namespace

Command add_sweep_command(CLI::App& parent) {
  auto a = std::make_shared<SweepArgs>();
  CLI::App* cmd = parent.add_subcommand(
      "sweep", "Quantize K/V with every scheme pair; report reconstruction and attention error vs the fp64 reference");
  cmd->add_option("dumps", a->dumps, "HDF5 dumps (schema v1); default: the bundled real capture")->check(CLI::ExistingFile);
  cmd->add_option("--layers", a->layers, "Layer indices to sweep (default: all)")->delimiter(',');
  cmd->add_flag("--synthetic", a->synthetic, "Sweep seeded synthetic data (see the synthetic options)");
  cmd->add_option("--k", a->k_schemes, "K schemes, comma-separated (e.g. int8-head,int4-g32-asym)");
  cmd->add_option("--v", a->v_schemes, "V schemes, comma-separated; every K scheme is paired with every V scheme");
  cmd->add_option("--out", a->out_dir, "Directory for sweep.csv and sweep.json")->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "k of the top-k attention overlap")->capture_default_str()->check(kPositive);
  cmd->add_option("--max-rel-l2", a->max_rel_l2, "Also recommend the smallest schemes with out_rel_l2_mean within this budget")
      ->check(kPositive);
  cmd->add_flag("--no-latency", a->no_latency,
                "Skip the latency columns a GPU adds (each pair's decode time with the default decode variant)");
  cmd->add_option("--latency-shape", a->latency_shape, "Decode shape of the latency columns: NAME:B of a kvq bench shape")
      ->capture_default_str();
  cmd->add_option("--plan", a->plan, "A study's plan.json (kvq plan sweep): run one shard of it (--shard)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--shard", a->shard, "I/N (or I with --plan): run shard I of N into --out, skipping units "
                                       "already there; kvq merge joins the shards");
  add_synthetic_options(*cmd, a->spec);
  return {cmd, [a] {
            if (!a->plan.empty() && a->shard.empty()) throw InputError("sweep --plan: give --shard I (which shard to run)");
            if (a->dumps.empty() && !a->synthetic)  // relative to here when it can be: results stay portable
              a->dumps.push_back(std::filesystem::proximate(KVQ_DATA_DIR "/dumps/stories260k.h5").string());
            if (!a->shard.empty()) {
              if (a->synthetic) throw InputError("sweep --shard: shards run dumps (kvq synth writes one)");
              const WorkPlan plan = a->plan.empty() ? plan_sweep({a->dumps, a->layers, a->k_schemes, a->v_schemes, a->top_k},
                                                                 parse_shard(a->shard, 0).count)
                                                    : read_plan(a->plan);
              if (plan.kind != "sweep") throw InputError(fmt::format("{}: a {} plan, not a sweep's", a->plan, plan.kind));
              run_sweep_shard(plan, parse_shard(a->shard, plan.shards), a->out_dir);
              return 0;
            }
            return run(*a);
          }};
}

}  // namespace kvq
