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
// sweep.csv, sweep_heads.csv and sweep.json in `dir`, each through a temporary file and a rename (an
// interrupted sweep never leaves half a file). `sources`: one record per dump (file, sha256, source,
// rope, layers), to which the run's provenance is added; `complete`: false while layers remain.
void write_sweep_results(const std::string& dir, const std::vector<SweepRow>& rows, const nlohmann::json& sources,
                         int64_t top_k, bool complete);
void print_sweep_table(const std::vector<SweepRow>& rows, std::FILE* out);

// CSV field quoting for text that may hold commas or quotes (dump sources do).
std::string csv_quoted(const std::string& s);

}  // namespace kvq
