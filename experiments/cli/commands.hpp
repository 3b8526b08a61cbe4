// The kvq subcommands. Each adds itself to the app and returns the function that runs it after
// parsing; run functions throw InputError for bad input (exit code 3), CorruptFileError for a
// damaged file (exit code 4).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace kvq {

struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command add_sweep_command(CLI::App& parent);
Command add_bench_cpu_command(CLI::App& parent);
Command add_synth_command(CLI::App& parent);
Command add_inspect_command(CLI::App& parent);
Command add_quantize_command(CLI::App& parent);
Command add_reference_command(CLI::App& parent);
Command add_recommend_command(CLI::App& parent);
Command add_check_dump_command(CLI::App& parent);
Command add_plan_command(CLI::App& parent);   // a study's units (experiments/cluster/)
Command add_merge_command(CLI::App& parent);  // its shard folders into one run's files
Command add_slurm_command(CLI::App& parent);  // its shards as a Slurm array job  // hidden: the child of experiments/common/dump_check.hpp
// variants, validate, bench-quantize: real commands when built with CUDA, else each says why not.
std::vector<Command> add_gpu_commands(CLI::App& parent);
std::vector<Command> add_bench_command(CLI::App& parent);  // GPU builds only (cmd_bench.cpp)

}  // namespace kvq
