// Option checks that say the rule broken: CLI11's PositiveNumber / NonNegativeNumber print their
// range, whose bound is DBL_MAX in 300 digits ("Value 0 not in range 0.000000 to 1797693..."), and
// call a word that is no number "not in range" too.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <string>

namespace kvq {

inline CLI::Validator number_rule(bool positive) {
  return CLI::Validator(
      [positive](std::string& text) -> std::string {
        double x = 0;
        if (!CLI::detail::lexical_cast(text, x) || std::isnan(x)) return text + " is not a number";
        if (positive ? x > 0 : x >= 0) return {};
        return text + (positive ? " is not positive (need > 0)" : " is negative (need >= 0)");
      },
      positive ? "POSITIVE" : "NONNEGATIVE");
}

inline const CLI::Validator kPositive = number_rule(true);
inline const CLI::Validator kNonNegative = number_rule(false);

}  // namespace kvq
