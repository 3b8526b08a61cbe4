// Console output of recommendations, shared by `kvq recommend` and `kvq sweep --max-rel-l2`.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <set>

#include "experiments/recommend.hpp"

namespace kvq {

inline void print_recommendations(const std::vector<Recommendation>& recs, const std::string& metric, double budget,
                                  std::FILE* out) {
  fmt::print(out, "smallest K+V memory with {} <= {:g}\n", metric, budget);
  fmt::print(out, "{:<12} {:>5}  {:<20} {:<20} {:>12} {:>11}\n", "scope", "layer", "K scheme", "V scheme",
             "B/token/head", metric.substr(4));
  std::set<std::string> sources;
  for (const Recommendation& r : recs)
    if (r.layer >= 0) sources.insert(r.source);
  for (const Recommendation& r : recs) {
    const std::string scope = r.layer < 0 ? "overall" : "layer", layer = r.layer < 0 ? "all" : std::to_string(r.layer);
    if (sources.size() > 1 && r.layer >= 0 && (&r == &recs.front() || (&r)[-1].source != r.source))
      fmt::print(out, "{}\n", r.source);  // several dumps: name each before its layers
    if (r.found)
      fmt::print(out, "{:<12} {:>5}  {:<20} {:<20} {:>12.2f} {:>11.3e}\n", scope, layer, r.best.k_scheme,
                 r.best.v_scheme, r.best.kv_bytes_per_token_head, r.best.error);
    else
      fmt::print(out, "{:<12} {:>5}  no scheme pair meets the budget\n", scope, layer);
  }
}

}  // namespace kvq
