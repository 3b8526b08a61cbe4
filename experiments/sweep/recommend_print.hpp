// Console output of recommendations, shared by `kvq recommend` and `kvq sweep --max-rel-l2`.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <set>

#include "experiments/sweep/recommend.hpp"

namespace kvq {

inline void print_recommendations(const std::vector<Recommendation>& recs, const std::string& metric, double budget,
                                  std::FILE* out) {
  fmt::print(out, "smallest K+V memory with {} <= {:g}\n", metric, budget);
  fmt::print(out, "{:<12} {:>5}  {:<23} {:<23} {:>12} {:>11}\n", "scope", "layer", "K scheme", "V scheme",
             "B/token/head", metric.substr(4));
  std::set<std::pair<int, std::string>> dumps;
  for (const Recommendation& r : recs)
    if (r.layer >= 0) dumps.insert({r.dump, r.source});
  for (const Recommendation& r : recs) {
    const std::string scope = r.layer < 0 ? "overall" : "layer", layer = r.layer < 0 ? "all" : std::to_string(r.layer);
    const bool first = &r == &recs.front() || (&r)[-1].source != r.source || (&r)[-1].dump != r.dump;
    if (dumps.size() > 1 && r.layer >= 0 && first)  // several dumps: name each before its layers
      fmt::print(out, "{}\n", r.dump < 0 ? r.source : fmt::format("dump {}: {}", r.dump, r.source));
    if (r.found)
      fmt::print(out, "{:<12} {:>5}  {:<23} {:<23} {:>12.2f} {:>11.3e}\n", scope, layer, r.best.k_scheme,
                 r.best.v_scheme, r.best.kv_bytes_per_token_head, r.best.error);
    else
      fmt::print(out, "{:<12} {:>5}  no scheme pair meets the budget\n", scope, layer);
  }
}

// kvq recommend on eval results: every pair ranked by the end-to-end metric, then the pick.
inline void print_end_to_end_ranking(const std::vector<EndToEndRanking>& rankings, const std::string& metric,
                                     double budget, std::FILE* out) {
  for (const EndToEndRanking& g : rankings) {
    fmt::print(out, "{}: scheme pairs ranked by end-to-end {} (KL of next-token distributions, nats)\n", g.source,
               metric);
    fmt::print(out, "{:>4}  {:<23} {:<23} {:>12} {:>10} {:>10} {:>7} {:>10}  {}\n", "rank", "K scheme", "V scheme",
               "B/token/head", "kld_mean", "kld_max", "top-1", "ppl delta", "within budget");
    for (size_t i = 0; i < g.ranked.size(); ++i) {
      const EndToEndResult& r = g.ranked[i];
      fmt::print(out, "{:>4}  {:<23} {:<23} {:>12.2f} {:>10.3e} {:>10.3e} {:>7.3f} {:>+10.4f}  {}\n", i + 1, r.k_scheme,
                 r.v_scheme, r.kv_bytes_per_token_head, r.kld_mean, r.kld_max, r.top1_agreement, r.ppl_delta,
                 r.error <= budget ? "yes" : "no");
    }
    if (g.best < 0) {
      fmt::print(out, "no scheme pair has {} <= {:g}\n", metric, budget);
    } else {
      const EndToEndResult& b = g.ranked[g.best];
      fmt::print(out, "smallest K+V memory with {} <= {:g}: K {}, V {} ({:.2f} B/token/head, {} {:.3e})\n", metric,
                 budget, b.k_scheme, b.v_scheme, b.kv_bytes_per_token_head, metric, b.error);
    }
  }
}

}  // namespace kvq
