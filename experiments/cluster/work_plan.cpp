#include "experiments/cluster/work_plan.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "experiments/common/run_info.hpp"
#include "experiments/sweep/sweep_checkpoint.hpp"
#include "quant/errors.hpp"

namespace fs = std::filesystem;

namespace kvq {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: cannot open", path));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
}

std::string text_of(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

std::string ShardSpec::label() const { return fmt::format("{}/{}", index, count); }

ShardSpec parse_shard(const std::string& text, int plan_shards) {
  ShardSpec s;
  const size_t slash = text.find('/');
  try {
    size_t used = 0;
    s.index = std::stoi(text.substr(0, slash), &used);
    if (used != (slash == std::string::npos ? text.size() : slash)) throw std::invalid_argument("trailing text");
    s.count = plan_shards;
    if (slash != std::string::npos) {
      s.count = std::stoi(text.substr(slash + 1), &used);
      if (used != text.size() - slash - 1) throw std::invalid_argument("trailing text");
    }
  } catch (const std::logic_error&) {
    throw InputError(fmt::format("--shard '{}': expected I/N or I (shard I of N, 0 <= I < N)", text));
  }
  if (s.count < 1 || s.index < 0 || s.index >= s.count)
    throw InputError(fmt::format("--shard '{}': expected 0 <= I < N, got I = {}, N = {}", text, s.index, s.count));
  return s;
}

std::vector<int> shard_assignment(const std::vector<WorkUnit>& units, int count) {
  std::vector<int> shard(units.size(), 0);
  std::map<std::string, double> total, before;
  for (const WorkUnit& u : units) total[u.group] += u.cost;
  for (size_t i = 0; i < units.size(); ++i) {
    const WorkUnit& u = units[i];
    // A unit goes to the shard its cost midpoint falls in: contiguous runs, each within one
    // unit's cost of total / count.
    const double mid = before[u.group] + u.cost / 2;
    before[u.group] += u.cost;
    shard[i] = std::min(count - 1, static_cast<int>(std::floor(count * mid / total[u.group])));
  }
  return shard;
}

std::vector<size_t> units_of_shard(const WorkPlan& plan, const ShardSpec& spec, const std::string& group) {
  const std::vector<int> shard = shard_assignment(plan.units, spec.count);
  std::vector<size_t> out;
  for (size_t i = 0; i < plan.units.size(); ++i)
    if (shard[i] == spec.index && plan.units[i].group == group) out.push_back(i);
  return out;
}

std::vector<std::string> plan_groups(const WorkPlan& plan) {
  std::vector<std::string> groups;
  for (const WorkUnit& u : plan.units)
    if (std::find(groups.begin(), groups.end(), u.group) == groups.end()) groups.push_back(u.group);
  return groups;
}

nlohmann::json to_json(const WorkPlan& plan) {
  nlohmann::json units = nlohmann::json::array();
  const std::vector<int> shard = shard_assignment(plan.units, plan.shards);
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const WorkUnit& u = plan.units[i];
    units.push_back({{"id", u.id}, {"group", u.group}, {"cost", u.cost}, {"shard", shard[i]}, {"key", u.key}});
  }
  return {{"kvq_plan", 1}, {"kind", plan.kind}, {"shards", plan.shards}, {"settings", plan.settings}, {"units", units}};
}

WorkPlan plan_from_json(const nlohmann::json& j, const std::string& where) {
  WorkPlan plan;
  try {
    if (j.at("kvq_plan").get<int>() != 1)
      throw InputError(fmt::format("{}: kvq_plan {} (this kvq reads 1)", where, j.at("kvq_plan").dump()));
    plan.kind = j.at("kind").get<std::string>();
    plan.shards = j.at("shards").get<int>();
    plan.settings = j.at("settings");
    std::set<std::string> ids;
    for (const nlohmann::json& u : j.at("units")) {
      WorkUnit unit{u.at("id").get<std::string>(), u.at("group").get<std::string>(), u.at("cost").get<double>(),
                    u.at("key")};
      if (!(unit.cost > 0) || !std::isfinite(unit.cost))
        throw InputError(fmt::format("{}: unit {}: cost {} (expected a positive number)", where, unit.id, unit.cost));
      if (unit.id.empty() || unit.id.find('/') != std::string::npos)
        throw InputError(fmt::format("{}: unit id '{}' (expected a non-empty name without '/')", where, unit.id));
      if (!ids.insert(unit.id).second) throw InputError(fmt::format("{}: unit {} listed twice", where, unit.id));
      plan.units.push_back(std::move(unit));
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: not a kvq plan ({})", where, e.what()));
  }
  if (plan.kind != "sweep" && plan.kind != "eval" && plan.kind != "bench")
    throw InputError(fmt::format("{}: kind '{}' (expected sweep, eval or bench)", where, plan.kind));
  if (plan.shards < 1) throw InputError(fmt::format("{}: shards {} (expected >= 1)", where, plan.shards));
  return plan;
}

WorkPlan read_plan(const std::string& path) { return plan_from_json(read_json(path), path); }

void write_plan(const WorkPlan& plan, const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  write_file_atomically(path, to_json(plan).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

nlohmann::json task_info(const std::string& gpu) {
  const nlohmann::json info = run_info();
  nlohmann::json j = {{"host", info["hostname"]}, {"time_utc", info["time_utc"]}, {"pid", getpid()},
                      {"kvq_commit", kvq_commit()}};
  if (!env("SLURM_JOB_ID").empty())
    j["slurm"] = {{"job", env("SLURM_JOB_ID")}, {"array_job", env("SLURM_ARRAY_JOB_ID")},
                  {"array_task", env("SLURM_ARRAY_TASK_ID")}, {"node", env("SLURMD_NODENAME")}};
  if (!gpu.empty()) j["gpu"] = gpu;
  return j;
}

ShardDir::ShardDir(std::string dir, const WorkPlan& plan) : dir_(std::move(dir)) {
  fs::create_directories(dir_ + "/units");
  const std::string path = dir_ + "/plan.json";
  if (fs::exists(path)) {
    if (to_json(read_plan(path)) != to_json(plan))
      throw InputError(fmt::format("{}: holds the results of another plan (its plan.json differs): give this shard "
                                   "a folder of its own", dir_));
    return;
  }
  write_plan(plan, path);
}

std::string ShardDir::unit_file(const WorkUnit& unit) const { return dir_ + "/units/" + unit.id + ".json"; }

nlohmann::json ShardDir::result(const WorkUnit& unit) const {
  std::ifstream in(unit_file(unit));
  if (!in) return nullptr;
  try {  // a file of other settings (or damaged by hand) is recomputed
    const nlohmann::json j = nlohmann::json::parse(in);
    return j.at("unit") == unit.id && j.at("key") == unit.key ? j.at("result") : nlohmann::json();
  } catch (const nlohmann::json::exception&) {
    return nullptr;
  }
}

void ShardDir::save(const WorkUnit& unit, const nlohmann::json& result, const nlohmann::json& ran) const {
  const nlohmann::json j = {{"unit", unit.id}, {"key", unit.key}, {"ran", ran}, {"result", result}};
  write_file_atomically(unit_file(unit), text_of(j) + "\n");
}

void ShardDir::record_run(const ShardSpec& spec, const std::string& group, const std::vector<std::string>& ran,
                          const std::vector<std::string>& reused, double seconds, const nlohmann::json& task) const {
  const std::string path = dir_ + "/shard.json";
  nlohmann::json runs = fs::exists(path) ? read_json(path) : nlohmann::json::array();
  nlohmann::json run = task;
  run.update({{"shard", spec.label()}, {"ran", ran}, {"reused", reused}, {"seconds", seconds}});
  if (!group.empty()) run["group"] = group;
  runs.push_back(run);
  write_file_atomically(path, runs.dump(1) + "\n");
}

CollectedUnits collect_units(const std::vector<std::string>& dirs) {
  if (dirs.empty()) throw InputError("merge: no shard folders given");
  for (size_t i = 0; i < dirs.size(); ++i)  // by any path to it: its units would count twice
    for (size_t j = 0; j < i; ++j)
      if (fs::exists(dirs[i]) && fs::exists(dirs[j]) && fs::equivalent(dirs[i], dirs[j]))
        throw InputError(fmt::format("merge: {} is given twice (as {})", dirs[i], dirs[j]));
  CollectedUnits c;
  nlohmann::json plan_json;
  std::map<std::string, size_t> index;
  std::vector<std::vector<std::string>> found;
  std::vector<nlohmann::json> ran;
  nlohmann::json folders = nlohmann::json::array();
  for (const std::string& dir : dirs) {
    const std::string plan_path = dir + "/plan.json";
    if (!fs::exists(plan_path)) throw InputError(fmt::format("{}: no plan.json (not a kvq shard folder)", dir));
    if (plan_json.is_null()) {
      c.plan = read_plan(plan_path);
      plan_json = to_json(c.plan);
      for (size_t i = 0; i < c.plan.units.size(); ++i) index[c.plan.units[i].id] = i;
      found.resize(c.plan.units.size());
      c.results.resize(c.plan.units.size());
      ran.resize(c.plan.units.size());
    } else if (to_json(read_plan(plan_path)) != plan_json) {
      throw InputError(fmt::format("{}: its plan.json differs from {}/plan.json: folders of different studies", dir,
                                   dirs.front()));
    }
    const std::string shard_json = dir + "/shard.json";
    folders.push_back({{"folder", dir}, {"runs", fs::exists(shard_json) ? read_json(shard_json) : nlohmann::json::array()}});
    if (!fs::is_directory(dir + "/units")) continue;
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::directory_iterator(dir + "/units"))
      if (e.path().extension() == ".json") files.push_back(e.path());  // *.tmp: a unit cut off mid-write
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      const auto it = index.find(file.stem().string());
      if (it == index.end())
        throw InputError(fmt::format("{}: unit {} is not in the plan", file.string(), file.stem().string()));
      const nlohmann::json j = read_json(file.string());
      const WorkUnit& unit = c.plan.units[it->second];
      if (!j.contains("key") || j["key"] != unit.key || !j.contains("result"))
        throw InputError(fmt::format("{}: unit {}: expected key {}, got {}", file.string(), unit.id, text_of(unit.key),
                                     j.contains("key") ? text_of(j["key"]) : "none"));
      found[it->second].push_back(file.string());
      c.results[it->second] = j["result"];
      ran[it->second] = j.value("ran", nlohmann::json::object());
    }
  }
  const std::vector<int> shard = shard_assignment(c.plan.units, c.plan.shards);
  std::vector<std::string> missing, twice;
  for (size_t i = 0; i < found.size(); ++i) {
    const WorkUnit& u = c.plan.units[i];
    if (found[i].empty())
      missing.push_back(fmt::format("{} ({}; shard {}/{}{})", u.id, text_of(u.key), shard[i], c.plan.shards,
                                    u.group.empty() ? "" : " of group " + u.group));
    else if (found[i].size() > 1)
      twice.push_back(fmt::format("{} in {}", u.id, fmt::join(found[i], " and ")));
  }
  auto listed = [](const std::vector<std::string>& v) {
    std::vector<std::string> head(v.begin(), v.begin() + std::min<size_t>(v.size(), 5));
    return fmt::format("{}{}", fmt::join(head, "; "), v.size() > 5 ? fmt::format("; and {} more", v.size() - 5) : "");
  };
  if (!twice.empty())
    throw InputError(fmt::format("merge: {} unit(s) found more than once (a shard run into two folders?): {}",
                                 twice.size(), listed(twice)));
  if (!missing.empty())
    throw InputError(fmt::format("merge: {} of {} unit(s) in none of the {} folder(s); re-run their shards: {}",
                                 missing.size(), c.plan.units.size(), dirs.size(), listed(missing)));
  nlohmann::json units = nlohmann::json::array();
  std::set<std::string> commits;  // more than one: shards of different code (a re-run after a change)
  for (size_t i = 0; i < c.plan.units.size(); ++i) {
    units.push_back({{"unit", c.plan.units[i].id}, {"file", found[i].front()}, {"ran", ran[i]}});
    if (ran[i].contains("kvq_commit")) commits.insert(ran[i]["kvq_commit"].get<std::string>());
  }
  if (commits.size() > 1)
    fmt::print(stderr, "merge: warning: the units were computed by {} kvq commits: {}\n", commits.size(),
               fmt::join(commits, ", "));
  c.manifest = {{"kind", c.plan.kind}, {"kvq_commit", kvq_commit()}, {"unit_commits", commits},
                {"units", c.plan.units.size()}, {"shards", c.plan.shards}, {"folders", folders}, {"unit_runs", units}};
  return c;
}

}  // namespace kvq
