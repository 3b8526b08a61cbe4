// kvq: the command line. Exit codes: 0 ok, 2 usage error, 3 input error (a bad file or path), 4 corrupt
// input file (HDF5 cannot read it, or reading it crashed or hung the check process), 1 other errors (no
// GPU, internal).
#include <fmt/format.h>

#include <filesystem>
#include <string>

#include "experiments/cli/commands.hpp"
#include "data/dump.hpp"
#include "experiments/common/run_info.hpp"
#include "quant/errors.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kvq: accuracy and speed of quantized KV caches for decode attention"};
  app.set_version_flag("--version", kvq::kvq_version() + " (" + kvq::kvq_commit() + ")");
  app.require_subcommand(1);
  std::vector<kvq::Command> commands = {
      kvq::add_sweep_command(app),     kvq::add_recommend_command(app), kvq::add_quantize_command(app),
      kvq::add_reference_command(app), kvq::add_inspect_command(app),   kvq::add_synth_command(app),
      kvq::add_bench_cpu_command(app), kvq::add_check_dump_command(app),
      kvq::add_plan_command(app),      kvq::add_merge_command(app),     kvq::add_slurm_command(app)};
  for (kvq::Command& c : kvq::add_gpu_commands(app)) commands.push_back(std::move(c));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    for (const kvq::Command& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const kvq::CorruptFileError& e) {
    fmt::print(stderr, "kvq: error: {}\n", e.what());
    return 4;
  } catch (const kvq::InputError& e) {
    fmt::print(stderr, "kvq: error: {}\n", e.what());
    return 3;
  } catch (const std::filesystem::filesystem_error& e) {  // a path the user gave: --out naming a file, a full disk
    std::string what = e.what();  // libstdc++: "filesystem error: OP: REASON [PATH1]"
    if (const std::string prefix = "filesystem error: "; what.rfind(prefix, 0) == 0) what.erase(0, prefix.size());
    if (const size_t paths = what.find(" [" + e.path1().string() + "]"); paths != std::string::npos) what.erase(paths);
    fmt::print(stderr, "kvq: error: {}: {}\n", e.path1().string(), what);
    return 3;
  } catch (const kvq::Error& e) {  // e.g. no CUDA device
    fmt::print(stderr, "kvq: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kvq: internal error: {}\n", e.what());
    return 1;
  }
  return 2;
}
