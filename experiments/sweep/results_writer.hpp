// Sweep results as files (CSV for pandas, JSON for the run's metadata) and as a console table.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "experiments/sweep/sweep.hpp"

namespace kvq {

// One row per layer x scheme pair; attention columns are empty when the layer had no queries.
void write_sweep_csv(const std::vector<SweepRow>& rows, const std::string& path);
// One row per layer x scheme pair x (batch, query head): the attention error of each head.
void write_head_csv(const std::vector<SweepRow>& rows, const std::string& path);
void write_json(const nlohmann::json& document, const std::string& path);
void print_sweep_table(const std::vector<SweepRow>& rows, std::FILE* out);

// CSV field quoting for text that may hold commas or quotes (dump sources do).
std::string csv_quoted(const std::string& s);

}  // namespace kvq
