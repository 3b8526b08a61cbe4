// kvq merge DIR... --out OUT: the shard folders of a study into the files one process writes, after
// checking that every unit of the plan is there exactly once; OUT/manifest.json says who ran what.
#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "experiments/cli/commands.hpp"
#include "experiments/cli/python_gate.hpp"
#include "experiments/cluster/bench_shards.hpp"
#include "experiments/cluster/sweep_shards.hpp"
#include "experiments/sweep/sweep_checkpoint.hpp"
#include "quant/errors.hpp"

namespace kvq {
namespace {

struct MergeArgs {
  std::vector<std::string> dirs;
  std::string out;
};

int run_merge(const MergeArgs& a) {
  const CollectedUnits c = collect_units(a.dirs);
  std::filesystem::create_directories(a.out);
  write_file_atomically(a.out + "/manifest.json", c.manifest.dump(1) + "\n");
  fmt::print("merge: {} {} units from {} folder(s), each once; manifest {}/manifest.json\n", c.plan.units.size(),
             c.plan.kind, a.dirs.size(), a.out);
  if (c.plan.kind == "sweep") {
    merge_sweep(c, a.out);
  } else if (c.plan.kind == "bench") {
    merge_bench(c, a.out);
  } else {  // eval: its CSV is Python's csv module's; Python writes it from the checked units
    nlohmann::json units = nlohmann::json::array();
    for (size_t i = 0; i < c.results.size(); ++i) units.push_back({{"unit", c.plan.units[i].id}, {"result", c.results[i]}});
    const std::string path = a.out + "/.eval_units.json";
    write_file_atomically(path, nlohmann::json({{"settings", c.plan.settings}, {"units", units}}).dump() + "\n");
    exec_python({KVQ_SOURCE_DIR "/experiments/eval/kvq_eval.py", "--merge-units", path, "--out", a.out}, "kvq merge");
  }
  return 0;
}

}  // namespace

Command add_merge_command(CLI::App& parent) {
  auto a = std::make_shared<MergeArgs>();
  CLI::App* cmd = parent.add_subcommand("merge", "Merge a study's shard folders into the files one process writes; "
                                                 "fails naming any unit missing or found twice");
  cmd->add_option("dirs", a->dirs, "Shard folders (STUDY/shards/*)")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--out", a->out, "Output folder (STUDY/results)")->required();
  return {cmd, [a] { return run_merge(*a); }};
}

}  // namespace kvq
