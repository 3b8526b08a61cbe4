// kvq synth: write a seeded LLM-shaped synthetic dump (schema v1).
#include <fmt/format.h>

#include <memory>

#include "data/dump.hpp"
#include "experiments/cli/commands.hpp"
#include "experiments/cli/number_checks.hpp"
#include "experiments/common/run_info.hpp"
#include "experiments/cli/synthetic_options.hpp"

namespace kvq {
namespace {

struct SynthArgs {
  SyntheticSpec spec;
  int layers = 1;
  std::string dtype = "float16", out;
};

int run(const SynthArgs& a) {
  const StoredDtype dtype = parse_stored_dtype(a.dtype);
  const std::string source = fmt::format("{} layers={} (layer l uses seed+l)", synthetic_source(a.spec), a.layers);
  DumpWriter writer(a.out, {source, "kvq synth " + kvq_version() + " (" + kvq_commit() + ")", "post"});
  for (int l = 0; l < a.layers; ++l) {
    SyntheticSpec spec = a.spec;
    spec.seed = a.spec.seed + static_cast<uint64_t>(l);  // layer l: seed + l
    KvLayer layer = make_synthetic(spec);
    layer.layer = l;
    writer.add_layer(layer, dtype);
  }
  writer.set_seq_lens(std::vector<int32_t>(static_cast<size_t>(a.spec.batch), static_cast<int32_t>(a.spec.tokens)));
  writer.close();
  fmt::print("wrote {}: {} layers of {}, source {}\n", a.out, a.layers, a.dtype, source);
  return 0;
}

}  // namespace

Command add_synth_command(CLI::App& parent) {
  auto a = std::make_shared<SynthArgs>();
  CLI::App* cmd = parent.add_subcommand("synth", "Write a seeded LLM-shaped synthetic dump (schema v1)");
  cmd->add_option("--out", a->out, "Output dump (.h5)")->required();
  cmd->add_option("--layers", a->layers, "Layers to generate")->capture_default_str()->check(kPositive);
  cmd->add_option("--dtype", a->dtype, "Stored dtype")->capture_default_str()->check(CLI::IsMember({"float16", "bfloat16", "float32"}));
  add_synthetic_options(*cmd, a->spec);
  return {cmd, [a] { return run(*a); }};
}

}  // namespace kvq
