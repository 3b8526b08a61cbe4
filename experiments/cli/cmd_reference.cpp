// kvq reference: fp64 attention outputs O and LSE for a dump's decode queries.
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <optional>

#include "data/dump.hpp"
#include "data/h5_writer.hpp"
#include "experiments/cli/commands.hpp"
#include "experiments/common/dump_check.hpp"
#include "experiments/common/run_info.hpp"
#include "experiments/sweep/sweep.hpp"

namespace kvq {
namespace {

struct ReferenceArgs {
  std::string in, out;
  bool alibi = false;
  std::optional<double> scale;  // unset: the layer's
  std::vector<int> layers;
};

int run(const ReferenceArgs& a) {
  if (a.scale && !(*a.scale > 0 && std::isfinite(*a.scale)))
    throw InputError(fmt::format("--scale {}: the softmax scale must be positive and finite", *a.scale));
  refuse_output_over_input(a.out, a.in);
  const DumpInfo info = open_dump_checked(a.in, a.layers);
  const std::vector<size_t> layers = select_layers(info, a.layers);
  for (size_t i : layers)  // the layers asked for: another one may have no queries
    if (!info.layers[i].q)
      throw DumpError(fmt::format("{}: /layers/{}/q: missing dataset (kvq reference needs decode queries)", a.in,
                                  info.layers[i].name));
  H5Writer f(a.out);
  f.set_attr("/", "kvq_reference", int64_t{1});
  f.set_attr("/", "source", info.source);
  f.set_attr("/", "input", a.in);
  f.set_attr("/", "created_by", "kvq reference " + kvq_version() + " (" + kvq_commit() + ")");
  for (size_t i : layers) {
    const int index = info.layers[i].index;
    const KvLayer layer = read_layer(info, i);
    check_finite_queries(info, i, layer);
    AttentionProblem p = attention_problem(layer, layer.k, layer.v);
    p.alibi = a.alibi || layer.alibi;
    p.softmax_scale = a.scale.value_or(layer.softmax_scale);
    const AttentionOutput out = attention(p);
    const std::string group = "/layers/" + std::to_string(index);
    f.write_doubles(group + "/o", {p.batch, p.q_heads, p.q_len, p.head_dim}, out.o);
    f.write_doubles(group + "/lse", {p.batch, p.q_heads, p.q_len}, out.lse);
    f.set_attr(group, "softmax_scale", p.scale());
    f.set_bool_attr(group, "alibi", p.alibi);
    fmt::print("layer {}: O [{}, {}, {}, {}], softmax scale {:.6g}, ALiBi {}\n", index, p.batch, p.q_heads, p.q_len,
               p.head_dim, p.scale(), p.alibi ? "on" : "off");
  }
  f.close();
  fmt::print("wrote {}\n", a.out);
  return 0;
}

}  // namespace

Command add_reference_command(CLI::App& parent) {
  auto a = std::make_shared<ReferenceArgs>();
  CLI::App* cmd = parent.add_subcommand("reference", "fp64 reference attention outputs O and LSE for a dump's queries");
  cmd->add_option("input", a->in, "HDF5 dump (schema v1) with decode queries")->required()->check(CLI::ExistingFile);
  cmd->add_option("--out", a->out, "Output HDF5 file")->required();
  cmd->add_flag("--alibi", a->alibi, "Add ALiBi biases (also on where the dump's layer says alibi)");
  cmd->add_option("--scale", a->scale, "Softmax scale (default: the layer's, else 1/sqrt(D))");
  cmd->add_option("--layers", a->layers, "Layer indices (default: all)")->delimiter(',');
  return {cmd, [a] { return run(*a); }};
}

}  // namespace kvq
