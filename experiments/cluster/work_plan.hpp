// A study's work list for running it past one machine: explicit, deterministic units of work, each
// with an estimated cost, split into shards that any scheduler (Slurm array tasks) runs
// independently, and merged back into the files one process would have written.
//   sweep: (dump, layer, K/V pair)   eval: (text window, pair)   bench: (GPU type, shape, variant)
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvq {

struct WorkUnit {
  std::string id;         // unique and file-name safe: the result file is units/<id>.json
  std::string group;      // units are sharded within their group (bench: the GPU type; else "")
  double cost = 1;        // estimated, relative: shards are balanced by it
  nlohmann::json key;     // what the unit is (kind-specific fields)
};

struct WorkPlan {
  std::string kind;         // sweep | eval | bench
  int shards = 1;           // the default N of --shard I
  nlohmann::json settings;  // kind-specific, the same for every unit
  std::vector<WorkUnit> units;
};

struct ShardSpec {
  int index = 0, count = 1;
  std::string label() const;  // "2/4"
};

// "I/N" or "I" (N from the plan). Throws InputError naming the text.
ShardSpec parse_shard(const std::string& text, int plan_shards);

// The shard of each unit, for `count` shards: every unit in exactly one; within a group, units keep
// their order and are cut into contiguous runs of about equal cost (neighbours share work: the
// sweep computes a layer's reference once per shard), so the same plan always gives the same split.
std::vector<int> shard_assignment(const std::vector<WorkUnit>& units, int count);

// Indices into plan.units of shard `spec`, in plan order; `group` selects the units of one group
// ("" for plans without groups).
std::vector<size_t> units_of_shard(const WorkPlan& plan, const ShardSpec& spec, const std::string& group = "");
std::vector<std::string> plan_groups(const WorkPlan& plan);  // distinct groups in plan order

nlohmann::json to_json(const WorkPlan& plan);
// Throws InputError naming `where` and what is wrong (missing field, duplicate unit id).
WorkPlan plan_from_json(const nlohmann::json& j, const std::string& where);
WorkPlan read_plan(const std::string& path);
void write_plan(const WorkPlan& plan, const std::string& path);  // atomically

// What the process that ran a unit was: host, time, Slurm job / array task, GPU (where known).
nlohmann::json task_info(const std::string& gpu = "");

// A shard's output folder:
//   DIR/plan.json      the plan it ran (a folder belongs to one plan)
//   DIR/units/ID.json  one per finished unit, written atomically: whole or absent
//   DIR/shard.json     its runs: which shard, where, which units ran and which were reused
class ShardDir {
 public:
  // Creates the folder and writes plan.json, or checks that the plan already there is the same.
  ShardDir(std::string dir, const WorkPlan& plan);
  // The unit's stored result when the folder has it for this very unit, else null.
  nlohmann::json result(const WorkUnit& unit) const;
  void save(const WorkUnit& unit, const nlohmann::json& result, const nlohmann::json& ran) const;
  void record_run(const ShardSpec& spec, const std::string& group, const std::vector<std::string>& ran,
                  const std::vector<std::string>& reused, double seconds, const nlohmann::json& task) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string unit_file(const WorkUnit& unit) const;
  std::string dir_;
};

// Every unit of the plan, found exactly once across the shard folders.
struct CollectedUnits {
  WorkPlan plan;
  std::vector<nlohmann::json> results;  // [unit] the stored result, in plan order
  nlohmann::json manifest;              // commit, units, which task ran what, where
};

// Throws InputError when the folders hold different plans, a unit is missing (named, with the
// shard that should have run it) or found twice (both files named), or a file is not of the plan.
CollectedUnits collect_units(const std::vector<std::string>& dirs);

}  // namespace kvq
