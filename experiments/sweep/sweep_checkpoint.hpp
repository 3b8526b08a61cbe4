// kvq sweep's checkpoints: every finished (dump, layer) unit's rows go to <out>/checkpoint/ as it
// finishes, so an interrupted or crashed sweep loses at most the unit it was computing, and a rerun
// with the same dumps and settings reuses the rest. A unit is reused only when the dump's sha256,
// the layer, the scheme pairs and top-k all match; anything else is recomputed.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "experiments/sweep/sweep.hpp"

namespace kvq {

struct SweepUnitKey {
  std::string dump_sha256;
  int layer = 0;
  std::string settings;  // the scheme pairs and top-k, as text
};

std::string sweep_settings(const std::vector<SchemePair>& pairs, const SweepOptions& options);

// Exact round trip (doubles at full precision, non-finite values as "inf" / "-inf" / "nan"); the
// latency columns are not kept (a GPU run measures them after the sweep).
nlohmann::json to_json(const SweepRow& row);
SweepRow sweep_row_from_json(const nlohmann::json& j);

class SweepCheckpoint {
 public:
  explicit SweepCheckpoint(std::string dir) : dir_(std::move(dir)) {}
  enum class Found { kNone, kMatch, kStale };  // kStale: a unit file of other settings
  Found find(const SweepUnitKey& key, std::vector<SweepRow>* rows) const;
  // Written to a temporary file and renamed: a unit file is whole or absent.
  void save(const SweepUnitKey& key, const std::string& dump_path, const std::vector<SweepRow>& rows) const;
  void remove_all() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string file_of(const SweepUnitKey& key) const;
  std::string dir_;
};

// Writes `text` to `path` through a temporary file and a rename.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace kvq
