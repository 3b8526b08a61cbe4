// kvq: the command line. Exit codes: 0 ok, 2 usage error, 3 input error, 1 internal error.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <regex>

#include "data/synthetic.hpp"
#include "experiments/bench_cpu.hpp"
#include "experiments/results_writer.hpp"
#include "experiments/run_info.hpp"

namespace {

using namespace kvq;

constexpr int kExitInput = 3;

struct SweepArgs {
  std::string k_schemes, v_schemes, out_dir = "results/sweep";
  SyntheticSpec synthetic{2, 8, 2, 1024, 128, 1, 0, 4, 8.0, 0.5};
  int64_t top_k = 8;
};

int run_sweep(const SweepArgs& args) {
  const KvLayer layer = make_synthetic(args.synthetic);
  std::vector<SchemePair> pairs;
  if (args.k_schemes.empty() && args.v_schemes.empty()) {
    pairs = default_pairs(layer.kv_shape.head_dim);
  } else {
    const std::string k = args.k_schemes.empty() ? args.v_schemes : args.k_schemes;
    const std::string v = args.v_schemes.empty() ? args.k_schemes : args.v_schemes;
    pairs = cross_pairs(parse_scheme_list(k), parse_scheme_list(v));
  }
  fmt::print("kvq sweep: {} scheme pairs on {}\n\n", pairs.size(), layer.source);
  const std::vector<SweepRow> rows = sweep_layer(layer, pairs, {args.top_k});
  print_sweep_table(rows, stdout);

  std::filesystem::create_directories(args.out_dir);
  const std::string csv = args.out_dir + "/sweep.csv", json = args.out_dir + "/sweep.json";
  write_sweep_csv(rows, csv);
  nlohmann::json meta = {{"run", run_info()},
                         {"command", "sweep"},
                         {"sources", {{{"source", layer.source}, {"layers", {layer.layer}}}}},
                         {"scheme_pairs", pairs.size()},
                         {"top_k", args.top_k},
                         {"csv", "sweep.csv"}};
  write_json(meta, json);
  fmt::print("\nwrote {} ({} rows) and {}\n", csv, rows.size(), json);
  return 0;
}

struct BenchArgs {
  std::string filter = ".*", csv;
  int min_reps = 3;
  double min_seconds = 1.0;
};

int run_bench_cpu(const BenchArgs& args) {
  const std::regex filter(args.filter);
  const nlohmann::json info = run_info();
  fmt::print("fp64 reference, {} threads on {}\n", info["threads"].get<int>(), info["cpu"].get<std::string>());
  fmt::print("{:<22} {:>4} {:>4} {:>4} {:>6} {:>4} {:>10} {:>10} {:>10} {:>8} {:>8}\n", "shape", "B", "Hq", "Hkv", "T",
             "D", "median ms", "p10 ms", "p90 ms", "GFLOP/s", "GB/s");
  std::vector<CpuTiming> timings;
  for (const DecodeShape& s : design_decode_shapes()) {
    if (!std::regex_search(s.label(), filter)) continue;
    const CpuTiming t = time_reference(s, args.min_reps, args.min_seconds);
    fmt::print("{:<22} {:>4} {:>4} {:>4} {:>6} {:>4} {:>10.3f} {:>10.3f} {:>10.3f} {:>8.2f} {:>8.2f}\n", s.label(),
               s.batch, s.q_heads, s.kv_heads, s.tokens, s.head_dim, t.median_ms, t.p10_ms, t.p90_ms, t.gflops,
               t.kv_gbps);
    std::fflush(stdout);
    timings.push_back(t);
  }
  if (timings.empty()) throw InputError(fmt::format("bench-cpu: --filter '{}' matches no shape", args.filter));
  if (!args.csv.empty()) {
    std::ofstream out(args.csv);
    if (!out) throw InputError(fmt::format("cannot write '{}'", args.csv));
    out << "shape,B,HQ,HKV,T,D,impl,dtype,threads,reps,median_ms,p10_ms,p90_ms,gflops,kv_gbps,cpu,kvq_commit\n";
    for (const CpuTiming& t : timings)
      out << fmt::format("{},{},{},{},{},{},kvq-reference,fp64,{},{},{:.6f},{:.6f},{:.6f},{:.4f},{:.4f},\"{}\",{}\n",
                         t.shape.group, t.shape.batch, t.shape.q_heads, t.shape.kv_heads, t.shape.tokens,
                         t.shape.head_dim, info["threads"].get<int>(), t.reps, t.median_ms, t.p10_ms, t.p90_ms,
                         t.gflops, t.kv_gbps, info["cpu"].get<std::string>(), kvq_commit());
    fmt::print("wrote {}\n", args.csv);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvq: accuracy and speed of quantized KV caches for decode attention"};
  app.set_version_flag("--version", kvq::kvq_version() + " (" + kvq::kvq_commit() + ")");
  app.require_subcommand(1);

  SweepArgs sweep;
  CLI::App* sweep_cmd = app.add_subcommand(
      "sweep", "Quantize K/V with every scheme pair and report reconstruction and attention error vs the fp64 reference");
  sweep_cmd->add_option("--k", sweep.k_schemes, "K schemes, comma-separated (e.g. int8-head,int4-g32-asym)");
  sweep_cmd->add_option("--v", sweep.v_schemes, "V schemes, comma-separated; every K scheme is paired with every V scheme");
  sweep_cmd->add_option("--out", sweep.out_dir, "Directory for sweep.csv and sweep.json")->capture_default_str();
  sweep_cmd->add_option("--top-k", sweep.top_k, "k of the top-k attention overlap")->capture_default_str()->check(CLI::PositiveNumber);
  auto* g = sweep_cmd->add_option_group("synthetic input", "Seeded LLM-shaped K/V/Q (a real dump comes with the data layer)");
  g->add_option("--batch", sweep.synthetic.batch, "B")->capture_default_str()->check(CLI::NonNegativeNumber);
  g->add_option("--q-heads", sweep.synthetic.q_heads, "Hq")->capture_default_str()->check(CLI::PositiveNumber);
  g->add_option("--kv-heads", sweep.synthetic.kv_heads, "Hkv")->capture_default_str()->check(CLI::PositiveNumber);
  g->add_option("--tokens", sweep.synthetic.tokens, "T")->capture_default_str()->check(CLI::NonNegativeNumber);
  g->add_option("--head-dim", sweep.synthetic.head_dim, "D")->capture_default_str()->check(CLI::PositiveNumber);
  g->add_option("--seed", sweep.synthetic.seed, "Generator seed")->capture_default_str();
  g->add_option("--outlier-channels", sweep.synthetic.outlier_channels, "K channels scaled up")->capture_default_str();

  BenchArgs bench;
  CLI::App* bench_cmd = app.add_subcommand(
      "bench-cpu", "Time the fp64 CPU reference on the DESIGN.md decode shapes (median, p10, p90, GFLOP/s)");
  bench_cmd->add_option("--filter", bench.filter, "Regex over shape labels like seed000/B32/T8192")->capture_default_str();
  bench_cmd->add_option("--min-reps", bench.min_reps, "Timed runs per shape, at least")->capture_default_str()->check(CLI::PositiveNumber);
  bench_cmd->add_option("--min-seconds", bench.min_seconds, "Timed seconds per shape, at least")->capture_default_str();
  bench_cmd->add_option("--csv", bench.csv, "Write the timings as CSV");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (sweep_cmd->parsed()) return run_sweep(sweep);
    if (bench_cmd->parsed()) return run_bench_cpu(bench);
  } catch (const kvq::InputError& e) {
    fmt::print(stderr, "kvq: error: {}\n", e.what());
    return kExitInput;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kvq: internal error: {}\n", e.what());
    return 1;
  }
  return 2;
}
