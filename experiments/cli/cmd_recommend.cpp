// kvq recommend: the smallest-memory K and V schemes within an error budget: attention-level (sweep
// results, --max-rel-l2) or end to end (kvq eval results, --max-kld).
#include <fmt/format.h>

#include <memory>

#include "experiments/cli/commands.hpp"
#include "experiments/cli/number_checks.hpp"
#include "experiments/sweep/recommend.hpp"
#include "experiments/sweep/recommend_print.hpp"
#include "quant/errors.hpp"

namespace kvq {

Command add_recommend_command(CLI::App& parent) {
  struct Args {
    std::string csv, metric;
    double rel_l2_budget = 0.0, kld_budget = 0.0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = parent.add_subcommand(
      "recommend",
      "The smallest-memory K and V schemes within an error budget: from sweep results per layer and overall, or "
      "from kvq eval results (experiments/eval/kvq_eval.py) ranked by end-to-end KL divergence");
  cmd->add_option("results", a->csv, "sweep.csv (kvq sweep) or eval.csv (kvq eval)")->required()->check(CLI::ExistingFile);
  CLI::Option* rel = cmd->add_option("--max-rel-l2", a->rel_l2_budget, "Attention-error budget (sweep results)")
                         ->check(kPositive);
  CLI::Option* kld = cmd->add_option("--max-kld", a->kld_budget, "End-to-end KL budget in nats (eval results)")
                         ->check(kNonNegative);
  rel->excludes(kld);
  kld->excludes(rel);
  cmd->add_option("--metric", a->metric,
                  "Budgeted column: out_rel_l2_mean (default) or out_rel_l2_max; kld_mean (default) or kld_max")
      ->check(CLI::IsMember({"out_rel_l2_mean", "out_rel_l2_max", "kld_mean", "kld_max"}));
  cmd->parse_complete_callback([rel, kld] {  // during parsing, so that it is a usage error (exit 2)
    if (!*rel && !*kld) throw CLI::RequiredError("--max-rel-l2 (sweep results) or --max-kld (eval results)");
  });
  return {cmd, [a, kld] {
            const bool end_to_end = is_end_to_end_results(a->csv);
            if (end_to_end != bool(*kld))
              throw InputError(fmt::format("{}: {} results need {}", a->csv, end_to_end ? "kvq eval" : "kvq sweep",
                                           end_to_end ? "--max-kld" : "--max-rel-l2"));
            const std::string metric = !a->metric.empty() ? a->metric : end_to_end ? "kld_mean" : "out_rel_l2_mean";
            if ((metric.rfind("kld", 0) == 0) != end_to_end)
              throw InputError(fmt::format("--metric {} does not apply to {} results", metric,
                                           end_to_end ? "kvq eval" : "kvq sweep"));
            if (end_to_end) {
              print_end_to_end_ranking(rank_end_to_end(read_end_to_end_results(a->csv, metric), a->kld_budget),
                                       metric, a->kld_budget, stdout);
            } else {
              print_recommendations(recommend(read_pair_results(a->csv, metric), a->rel_l2_budget), metric,
                                    a->rel_l2_budget, stdout);
            }
            return 0;
          }};
}

}  // namespace kvq
