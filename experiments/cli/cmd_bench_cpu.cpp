// kvq bench-cpu: timing of the fp64 reference on the DESIGN.md decode shapes.
#include <fmt/format.h>

#include <memory>

#include "experiments/bench/bench_cpu.hpp"
#include "experiments/cli/commands.hpp"
#include "experiments/cli/number_checks.hpp"
#include "experiments/common/run_info.hpp"
#include "experiments/sweep/sweep_checkpoint.hpp"
#include "quant/errors.hpp"

namespace kvq {
namespace {

struct BenchArgs {
  std::string filter = ".*", csv;
  int min_reps = 3;
  double min_seconds = 1.0;
};

int run(const BenchArgs& a) {
  const std::vector<DecodeShape> shapes = design_decode_shapes(a.filter, "--filter");
  const nlohmann::json info = run_info();
  const int threads = info["threads"].get<int>();
  const std::string cpu = info["cpu"].get<std::string>();
  fmt::print("fp64 reference, {} threads on {}\n", threads, cpu);
  fmt::print("{:<22} {:>4} {:>4} {:>4} {:>6} {:>4} {:>10} {:>10} {:>10} {:>8} {:>8}\n", "shape", "B", "Hq", "Hkv", "T",
             "D", "median ms", "p10 ms", "p90 ms", "GFLOP/s", "GB/s");
  std::vector<CpuTiming> timings;
  for (const DecodeShape& s : shapes) {
    const CpuTiming t = time_reference(s, a.min_reps, a.min_seconds);
    fmt::print("{:<22} {:>4} {:>4} {:>4} {:>6} {:>4} {:>10.3f} {:>10.3f} {:>10.3f} {:>8.2f} {:>8.2f}\n", s.label(),
               s.batch, s.q_heads, s.kv_heads, s.tokens, s.head_dim, t.median_ms, t.p10_ms, t.p90_ms, t.gflops,
               t.kv_gbps);
    std::fflush(stdout);
    timings.push_back(t);
  }
  if (a.csv.empty()) return 0;
  std::string text = "shape,B,HQ,HKV,T,D,impl,dtype,threads,reps,median_ms,p10_ms,p90_ms,gflops,kv_gbps,cpu,kvq_commit\n";
  for (const CpuTiming& t : timings)
    text += fmt::format("{},{},{},{},{},{},kvq-reference,fp64,{},{},{:.6f},{:.6f},{:.6f},{:.4f},{:.4f},\"{}\",{}\n",
                        t.shape.group, t.shape.batch, t.shape.q_heads, t.shape.kv_heads, t.shape.tokens,
                        t.shape.head_dim, threads, t.reps, t.median_ms, t.p10_ms, t.p90_ms, t.gflops, t.kv_gbps, cpu,
                        kvq_commit());
  write_file_atomically(a.csv, text);  // as the sweep's files: a failed write leaves no partial CSV
  fmt::print("wrote {}\n", a.csv);
  return 0;
}

}  // namespace

Command add_bench_cpu_command(CLI::App& parent) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = parent.add_subcommand(
      "bench-cpu", "Time the fp64 CPU reference on the DESIGN.md decode shapes (median, p10, p90, GFLOP/s)");
  cmd->add_option("--filter", a->filter, "Regex over shape labels like seed000/B32/T8192")->capture_default_str();
  cmd->add_option("--min-reps", a->min_reps, "Timed runs per shape, at least")->capture_default_str()->check(kPositive);
  cmd->add_option("--min-seconds", a->min_seconds, "Timed seconds per shape, at least")
      ->capture_default_str()
      ->check(kNonNegative);
  cmd->add_option("--csv", a->csv, "Write the timings as CSV");
  return {cmd, [a] { return run(*a); }};
}

}  // namespace kvq
