// kvq recommend: the smallest-memory K and V schemes within an attention-error budget.
#include <fmt/format.h>

#include <memory>

#include "experiments/commands.hpp"
#include "experiments/recommend.hpp"
#include "experiments/recommend_print.hpp"

namespace kvq {

Command add_recommend_command(CLI::App& parent) {
  struct Args {
    std::string csv, metric = "out_rel_l2_mean";
    double budget = 0.0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = parent.add_subcommand(
      "recommend", "From sweep results: the smallest-memory K and V schemes within an error budget, per layer and overall");
  cmd->add_option("results", a->csv, "sweep.csv written by kvq sweep")->required()->check(CLI::ExistingFile);
  cmd->add_option("--max-rel-l2", a->budget, "Error budget for the metric")->required()->check(CLI::PositiveNumber);
  cmd->add_option("--metric", a->metric, "Budgeted column")
      ->capture_default_str()
      ->check(CLI::IsMember({"out_rel_l2_mean", "out_rel_l2_max"}));
  return {cmd, [a] {
            print_recommendations(recommend(read_pair_results(a->csv, a->metric), a->budget), a->metric, a->budget, stdout);
            return 0;
          }};
}

}  // namespace kvq
