// kvq plan sweep|bench|eval: a study's work list (STUDY/plan.json), for `kvq sweep|bench|eval --shard`
// and `kvq slurm submit`.
#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "experiments/cli/commands.hpp"
#include "experiments/cli/number_checks.hpp"
#include "experiments/cli/python_gate.hpp"
#include "experiments/cluster/bench_shards.hpp"
#include "experiments/cluster/sweep_shards.hpp"
#include "quant/errors.hpp"

namespace kvq {
namespace {

struct PlanArgs {
  int shards = 1;
  std::string out;
  SweepStudy sweep;
  BenchStudy bench;
};

// The plan's shards: units and estimated cost each, so that an unbalanced split shows before it runs.
void print_plan(const WorkPlan& plan, const std::string& path) {
  fmt::print("{}: {} plan, {} units in {} shard(s)\n", path, plan.kind, plan.units.size(), plan.shards);
  for (const std::string& group : plan_groups(plan)) {
    double total = 0;
    for (const WorkUnit& u : plan.units)
      if (u.group == group) total += u.cost;
    for (int s = 0; s < plan.shards; ++s) {
      double cost = 0;
      const std::vector<size_t> units = units_of_shard(plan, {s, plan.shards}, group);
      for (size_t i : units) cost += plan.units[i].cost;
      fmt::print("  {}shard {}: {} units, {:.1f}% of the estimated cost\n", group.empty() ? "" : group + " ", s,
                 units.size(), total > 0 ? 100 * cost / total : 0.0);
    }
  }
}

void write_and_print(const WorkPlan& plan, const std::string& out) {
  const std::string path = out + "/plan.json";
  write_plan(plan, path);
  print_plan(plan, path);
}

void add_common(CLI::App* cmd, PlanArgs& a) {
  cmd->add_option("--shards", a.shards, "Number of shards (Slurm array tasks) the study runs in")
      ->required()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--out", a.out, "Study folder: plan.json goes here, then shards/, logs/, results/")->required();
}

}  // namespace

Command add_plan_command(CLI::App& parent) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* plan = parent.add_subcommand("plan", "Write a study's work list (STUDY/plan.json) for sharded runs: "
                                                 "kvq sweep|bench|eval --shard, kvq slurm submit");
  plan->require_subcommand(1);

  CLI::App* sweep = plan->add_subcommand("sweep", "Units (dump, layer, K/V pair), as kvq sweep with these arguments");
  sweep->add_option("dumps", a->sweep.dumps, "HDF5 dumps; default: the bundled capture")->check(CLI::ExistingFile);
  sweep->add_option("--layers", a->sweep.layers, "Layer indices (default: all)")->delimiter(',');
  sweep->add_option("--k", a->sweep.k_schemes, "K schemes, comma-separated (default: kvq sweep's set)");
  sweep->add_option("--v", a->sweep.v_schemes, "V schemes, comma-separated");
  sweep->add_option("--top-k", a->sweep.top_k, "k of the top-k overlap")->capture_default_str()->check(kPositive);
  add_common(sweep, *a);

  CLI::App* bench = plan->add_subcommand("bench", "Units (GPU type, shape, variant), as kvq bench on each GPU type");
  bench->add_option("--gpus", a->bench.gpus, "GPU types, comma-separated (h100,a100,l40s; any)")
                  ->delimiter(',')
                  ->required();
  bench->add_option("--variants", a->bench.variants, "Decode variants, comma-separated (kvq variants lists them)")
      ->delimiter(',')
      ->required();
  bench->add_option("--shapes", a->bench.shapes, "Regex over shape labels")->capture_default_str();
  bench->add_option("--schemes", a->bench.storages, "K/V storages as kvq bench --schemes (default: its list)");
  bench->add_option("--reps", a->bench.reps, "Timed graph replays per case")->capture_default_str()->check(CLI::Range(30, 100000));
  bench->add_option("--calls-per-graph", a->bench.calls_per_graph, "Decode calls per graph")->capture_default_str();
  bench->add_option("--splits", a->bench.splits, "Key splits (0: each variant's heuristic)")->capture_default_str();
  add_common(bench, *a);

  CLI::App* eval = plan->add_subcommand("eval", "Units (text window, pair), as experiments/eval/kvq_eval.py with the "
                                                "options after --shards/--out (e.g. --model stories260k --k ...)");
  add_common(eval, *a);
  eval->allow_extras();

  return {plan, [a, sweep, bench, eval]() -> int {
            if (sweep->parsed()) {
              if (a->sweep.dumps.empty())
                a->sweep.dumps.push_back(std::filesystem::proximate(KVQ_DATA_DIR "/dumps/stories260k.h5").string());
              write_and_print(plan_sweep(a->sweep, a->shards), a->out);
            } else if (bench->parsed()) {
              write_and_print(plan_bench(a->bench, a->shards), a->out);
            } else if (eval->parsed()) {  // the eval's pairs come from the model: Python plans it
              std::vector<std::string> args = {KVQ_SOURCE_DIR "/experiments/eval/kvq_eval.py"};
              for (const std::string& s : eval->remaining()) args.push_back(s);
              args.insert(args.end(), {"--plan-out", a->out + "/plan.json", "--shards", std::to_string(a->shards)});
              exec_python(args, "kvq plan eval");
            }
            return 0;
          }};
}

}  // namespace kvq
