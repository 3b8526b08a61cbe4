// kvq bench past one machine: (GPU type, shape, variant) units, one shard's run on a GPU of its type,
// and the merge into one decode.csv per GPU type in the order a single `kvq bench` writes rows
// (shape, then storage, then variant). The GPU timing itself stays in kvq bench (cmd_bench.cpp),
// which hands it to run_bench_shard as a callback: this file builds and is tested without CUDA.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "experiments/cluster/work_plan.hpp"

namespace kvq {

struct BenchStudy {
  std::vector<std::string> gpus;      // GPU types (h100, a100, l40s...; "any": the GPU a task gets)
  std::string shapes = ".";           // regex over the DESIGN.md shape labels
  std::vector<std::string> variants;  // decode variant names (kvq variants)
  std::string storages;               // kvq bench --schemes; "" for its default list
  int reps = 50, calls_per_graph = 8, splits = 0;
};

// Units GPU-type-major, then shape, then variant; cost grows with the bytes a decode call reads.
WorkPlan plan_bench(const BenchStudy& study, int shards);

// Times one (shape label, variant, storage) into `csv_path`: kvq bench's CSV (header, then rows).
using BenchCase = std::function<void(const std::string& shape, const std::string& variant, const std::string& storage,
                                     const std::string& csv_path)>;

// Does `device` (e.g. "NVIDIA H100 80GB HBM3") have GPU type `type` (e.g. "h100")? "any" matches all.
bool gpu_is_type(const std::string& device, const std::string& type);

// Runs the units of shard `spec` of GPU type `gpu` ("" when the plan has one type) not yet in
// `out_dir`, each storage of `storages` through `time_one`; refuses a device of another type.
void run_bench_shard(const WorkPlan& plan, const ShardSpec& spec, const std::string& gpu, const std::string& device,
                     const std::vector<std::string>& storages, const std::string& out_dir, const BenchCase& time_one);

// OUT/<gpu type>/decode.csv for every GPU type of the plan.
void merge_bench(const CollectedUnits& units, const std::string& out_dir);

}  // namespace kvq
