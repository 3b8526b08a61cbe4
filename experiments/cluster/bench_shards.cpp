#include "experiments/cluster/bench_shards.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>

#include "experiments/common/decode_shapes.hpp"
#include "experiments/sweep/sweep_checkpoint.hpp"
#include "quant/errors.hpp"

namespace fs = std::filesystem;

namespace kvq {
namespace {

std::string simple(const std::string& s) {  // lower case letters and digits only
  std::string out;
  for (char c : s)
    if (std::isalnum(static_cast<unsigned char>(c))) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: kvq bench wrote no CSV", path));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  if (lines.empty()) throw InputError(fmt::format("{}: empty (expected kvq bench's header)", path));
  return lines;
}

}  // namespace

bool gpu_is_type(const std::string& device, const std::string& type) {
  return type == "any" || (!simple(type).empty() && simple(device).find(simple(type)) != std::string::npos);
}

WorkPlan plan_bench(const BenchStudy& study, int shards) {
  if (study.gpus.empty()) throw InputError("plan bench: give the GPU types (--gpus h100,a100 or any)");
  if (study.variants.empty()) throw InputError("plan bench: give the decode variants (--variants; kvq variants lists them)");
  std::regex re;
  try {
    re = std::regex(study.shapes);
  } catch (const std::regex_error& e) {
    throw InputError(fmt::format("--shapes '{}': not a valid regular expression ({})", study.shapes, e.what()));
  }
  std::vector<DecodeShape> shapes;
  for (const DecodeShape& s : design_decode_shapes())
    if (std::regex_search(s.label(), re)) shapes.push_back(s);
  if (shapes.empty()) throw InputError(fmt::format("--shapes '{}' matches none of the shapes (a label reads seed000/B128/T8192)", study.shapes));
  WorkPlan plan;
  plan.kind = "bench";
  plan.shards = shards;
  for (const std::string& gpu : study.gpus) {
    if (simple(gpu) != gpu) throw InputError(fmt::format("--gpus: '{}' (expected lower-case letters and digits, e.g. h100)", gpu));
    for (const DecodeShape& s : shapes)
      for (const std::string& v : study.variants) {
        if (v.empty() || v.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-_") != std::string::npos)
          throw InputError(fmt::format("--variants: '{}' is not a variant name (kvq variants lists them)", v));
        const double bytes = 2.0 * s.batch * s.kv_heads * s.tokens * s.head_dim;  // K and V elements
        plan.units.push_back({fmt::format("{}-{}-B{}-T{}-{}", gpu, s.group, s.batch, s.tokens, v), gpu,
                              1.0 + bytes / (1 << 24), {{"gpu", gpu}, {"shape", s.label()}, {"variant", v}}});
      }
  }
  plan.settings = {{"gpus", study.gpus},         {"shapes", study.shapes},
                   {"variants", study.variants}, {"storages", study.storages},
                   {"reps", study.reps},         {"calls_per_graph", study.calls_per_graph},
                   {"splits", study.splits}};
  return plan;
}

void run_bench_shard(const WorkPlan& plan, const ShardSpec& spec, const std::string& gpu, const std::string& device,
                     const std::vector<std::string>& storages, const std::string& out_dir, const BenchCase& time_one) {
  const auto started = std::chrono::steady_clock::now();
  const std::vector<std::string> groups = plan_groups(plan);
  std::string type = gpu;
  if (type.empty() && groups.size() == 1) type = groups.front();
  if (std::find(groups.begin(), groups.end(), type) == groups.end())
    throw InputError(fmt::format("bench shard: the plan benches on {}: give --gpu with one of them{}",
                                 fmt::join(groups, ", "), type.empty() ? "" : fmt::format(" (got '{}')", type)));
  if (!gpu_is_type(device, type))
    throw InputError(fmt::format("bench shard {} of {}: this task's GPU is '{}', not a {} (ask Slurm for "
                                 "--gres=gpu:{}:1)", spec.label(), type, device, type, type));
  const ShardDir out(out_dir, plan);
  const nlohmann::json ran_by = task_info(device);
  std::vector<std::string> ran, reused;
  const std::vector<size_t> mine = units_of_shard(plan, spec, type);
  for (size_t n = 0; n < mine.size(); ++n) {
    const WorkUnit& u = plan.units[mine[n]];
    if (!out.result(u).is_null()) {
      reused.push_back(u.id);
      continue;
    }
    fmt::print(stderr, "bench shard {} ({}): unit {} of {}: {}\n", spec.label(), type, n + 1, mine.size(), u.id);
    nlohmann::json cases = nlohmann::json::array();
    for (size_t s = 0; s < storages.size(); ++s) {
      const std::string csv = fmt::format("{}/units/{}.{}.csv.tmp", out_dir, u.id, s);
      time_one(u.key.at("shape").get<std::string>(), u.key.at("variant").get<std::string>(), storages[s], csv);
      std::vector<std::string> lines = read_lines(csv);
      fs::remove(csv);
      cases.push_back({{"storage", storages[s]}, {"header", lines.front()},
                       {"rows", std::vector<std::string>(lines.begin() + 1, lines.end())}});
    }
    out.save(u, {{"cases", cases}}, ran_by);
    ran.push_back(u.id);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  out.record_run(spec, type, ran, reused, seconds, ran_by);
  fmt::print("bench shard {} ({}): {} unit(s) run, {} reused, {} in all, {:.1f} s; results in {}/units\n", spec.label(),
             type, ran.size(), reused.size(), mine.size(), seconds, out_dir);
}

void merge_bench(const CollectedUnits& c, const std::string& out_dir) {
  for (const std::string& gpu : plan_groups(c.plan)) {
    std::vector<std::string> shapes, storages, variants;
    auto add = [](std::vector<std::string>& v, const std::string& s) {
      if (std::find(v.begin(), v.end(), s) == v.end()) v.push_back(s);
    };
    std::string header;
    for (size_t i = 0; i < c.plan.units.size(); ++i) {
      const WorkUnit& u = c.plan.units[i];
      if (u.group != gpu) continue;
      add(shapes, u.key.at("shape").get<std::string>());
      add(variants, u.key.at("variant").get<std::string>());
      for (const nlohmann::json& k : c.results[i].at("cases")) {
        add(storages, k.at("storage").get<std::string>());
        if (header.empty()) header = k.at("header").get<std::string>();
        if (k.at("header").get<std::string>() != header)
          throw InputError(fmt::format("merge: unit {}: CSV header {} (expected {}, as the other units)", u.id,
                                       k.at("header").get<std::string>(), header));
      }
    }
    std::string text = header + "\n";
    for (const std::string& shape : shapes)  // kvq bench's order: shape, storage, variant
      for (const std::string& storage : storages)
        for (const std::string& variant : variants)
          for (size_t i = 0; i < c.plan.units.size(); ++i) {
            const WorkUnit& u = c.plan.units[i];
            if (u.group != gpu || u.key.at("shape") != shape || u.key.at("variant") != variant) continue;
            for (const nlohmann::json& k : c.results[i].at("cases"))
              if (k.at("storage") == storage)
                for (const nlohmann::json& row : k.at("rows")) text += row.get<std::string>() + "\n";
          }
    fs::create_directories(out_dir + "/" + gpu);
    write_file_atomically(out_dir + "/" + gpu + "/decode.csv", text);
    fmt::print("wrote {}/{}/decode.csv\n", out_dir, gpu);
  }
}

}  // namespace kvq
