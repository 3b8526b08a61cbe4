// kvq sweep past one machine: the plan of (dump, layer, K/V pair) units, one shard's run, and the
// merge into the sweep.csv, sweep_heads.csv and sweep.json that one `kvq sweep` writes.
#pragma once

#include <string>
#include <vector>

#include "experiments/cluster/work_plan.hpp"

namespace kvq {

struct SweepStudy {
  std::vector<std::string> dumps;  // paths as the single run is given them (sweep.json records them)
  std::vector<int> layers;         // empty: all
  std::string k_schemes, v_schemes;
  int64_t top_k = 8;
};

// Opens every dump (child-process check), hashes it and lists its units in the single run's order:
// dump, layer, pair. Cost of a unit: its attention (B·Hq·Tq·T·D) plus quantizing K and V.
WorkPlan plan_sweep(const SweepStudy& study, int shards);

// Runs the units of shard `spec` that `out_dir` does not hold yet, each saved as it finishes; a
// dump whose bytes changed since the plan is an error. Progress on stderr, a summary on stdout.
void run_sweep_shard(const WorkPlan& plan, const ShardSpec& spec, const std::string& out_dir);

// The single run's three files from the collected units, and its table on stdout.
void merge_sweep(const CollectedUnits& units, const std::string& out_dir);

}  // namespace kvq
