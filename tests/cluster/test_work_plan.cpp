// A study's units, shards and merge (experiments/cluster/): the split, the unit store, the checks
// of the merge, and the bench's shard driver with a stand-in for the GPU timing.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "experiments/cluster/bench_shards.hpp"
#include "experiments/cluster/work_plan.hpp"
#include "quant/errors.hpp"
#include "../test_util.hpp"

using namespace kvq;
namespace fs = std::filesystem;

namespace {

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("kvq_cluster_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}

// Units of unequal cost in two groups: the cost of unit i is 1 + (i * 7) % 5.
WorkPlan sample_plan(int units, int shards) {
  WorkPlan plan;
  plan.kind = "sweep";
  plan.shards = shards;
  plan.settings = {{"what", "test"}};
  for (int i = 0; i < units; ++i)
    plan.units.push_back({"u" + std::to_string(i), i % 3 == 0 ? "g" : "", 1.0 + (i * 7) % 5, {{"i", i}}});
  return plan;
}

void fill(const WorkPlan& plan, const std::string& dir, int shard) {
  const ShardDir out(dir, plan);
  for (size_t i : units_of_shard(plan, {shard, plan.shards}, ""))
    out.save(plan.units[i], {{"value", plan.units[i].key["i"].get<int>() * 10}}, task_info());
  for (size_t i : units_of_shard(plan, {shard, plan.shards}, "g"))
    out.save(plan.units[i], {{"value", plan.units[i].key["i"].get<int>() * 10}}, task_info());
}

}  // namespace

TEST_CASE("every unit is in exactly one shard, runs are contiguous and balanced, for any N") {
  for (int n : {1, 2, 3, 4, 7, 40, 100}) {
    CAPTURE(n);
    const WorkPlan plan = sample_plan(40, n);
    const std::vector<int> a = shard_assignment(plan.units, n);
    CHECK(a == shard_assignment(plan.units, n));  // deterministic
    for (const std::string group : {"", "g"}) {
      double total = 0, max_cost = 0;
      std::vector<double> cost(n, 0);
      int last = 0;
      for (size_t i = 0; i < plan.units.size(); ++i) {
        if (plan.units[i].group != group) continue;
        REQUIRE(a[i] >= 0);
        REQUIRE(a[i] < n);
        CHECK(a[i] >= last);  // contiguous: a shard's units are neighbours
        last = a[i];
        cost[a[i]] += plan.units[i].cost;
        total += plan.units[i].cost;
        max_cost = std::max(max_cost, plan.units[i].cost);
      }
      for (int s = 0; s < n; ++s) CHECK(std::abs(cost[s] - total / n) <= max_cost);
    }
    size_t listed = 0;
    for (int s = 0; s < n; ++s) listed += units_of_shard(plan, {s, n}, "").size() + units_of_shard(plan, {s, n}, "g").size();
    CHECK(listed == plan.units.size());
  }
}

TEST_CASE("--shard is I/N or I with the plan's N, 0 <= I < N") {
  CHECK(parse_shard("2/4", 1).index == 2);
  CHECK(parse_shard("2/4", 1).count == 4);
  CHECK(parse_shard("3", 8).count == 8);
  for (const char* bad : {"4/4", "-1/4", "x/4", "1/0", "1/4x", "", "2"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_shard(bad, 2), InputError);
  }
  CHECK(test::message_of<InputError>([] { parse_shard("5/3", 1); }).find("got I = 5, N = 3") != std::string::npos);
}

TEST_CASE("a plan round-trips through JSON and a bad one is refused naming what is wrong") {
  const WorkPlan plan = sample_plan(9, 3);
  const WorkPlan back = plan_from_json(to_json(plan), "x");
  CHECK(to_json(back) == to_json(plan));
  nlohmann::json twice = to_json(plan);
  twice["units"][1]["id"] = "u0";
  CHECK(test::message_of<InputError>([&] { plan_from_json(twice, "p.json"); }) == "p.json: unit u0 listed twice");
  nlohmann::json free = to_json(plan);
  free["units"][2]["cost"] = 0;
  CHECK(test::message_of<InputError>([&] { plan_from_json(free, "p.json"); }).find("unit u2: cost 0") != std::string::npos);
}

TEST_CASE("merge: every unit exactly once, missing and doubled units named with their files and shard") {
  const WorkPlan plan = sample_plan(12, 3);
  const std::string a = temp_dir("a"), b = temp_dir("b"), c = temp_dir("c");
  fill(plan, a, 0), fill(plan, b, 1), fill(plan, c, 2);
  const CollectedUnits all = collect_units({a, b, c});
  REQUIRE(all.results.size() == 12);
  for (size_t i = 0; i < 12; ++i) CHECK(all.results[i]["value"] == static_cast<int>(i) * 10);  // plan order
  CHECK(all.manifest["unit_runs"].size() == 12);

  SUBCASE("a re-run skips what is there") {
    const ShardDir again(a, plan);
    for (size_t i : units_of_shard(plan, {0, 3}, "")) CHECK_FALSE(again.result(plan.units[i]).is_null());
  }
  SUBCASE("a unit lost (a killed task) is named with the shard to re-run") {
    const size_t lost = units_of_shard(plan, {1, 3}, "").front();
    fs::remove(b + "/units/" + plan.units[lost].id + ".json");
    const std::string m = test::message_of<InputError>([&] { collect_units({a, b, c}); });
    CHECK(m.find("1 of 12 unit(s) in none of the 3 folder(s)") != std::string::npos);
    CHECK(m.find(plan.units[lost].id + " ({\"i\":" + std::to_string(lost) + "}; shard 1/3)") != std::string::npos);
    CHECK(test::message_of<InputError>([&] { collect_units({a, c}); }).find("of 12 unit(s) in none") != std::string::npos);
  }
  SUBCASE("a unit in two folders is named with both files") {
    const std::string id = plan.units[units_of_shard(plan, {0, 3}, "").front()].id;
    fs::copy_file(a + "/units/" + id + ".json", c + "/units/" + id + ".json");
    const std::string m = test::message_of<InputError>([&] { collect_units({a, b, c}); });
    CHECK(m.find(id + " in " + a + "/units/" + id + ".json and " + c + "/units/" + id + ".json") != std::string::npos);
  }
  SUBCASE("folders of another plan, and files that are not of the plan, are refused") {
    const WorkPlan other = sample_plan(12, 4);
    CHECK_THROWS_AS(ShardDir(a, other), InputError);  // a folder holds one plan
    std::ofstream(b + "/units/stray.json") << "{}";
    CHECK(test::message_of<InputError>([&] { collect_units({a, b, c}); }).find("unit stray is not in the plan") !=
          std::string::npos);
  }
  SUBCASE("a unit file of another key is refused") {
    const std::string id = plan.units[units_of_shard(plan, {2, 3}, "").front()].id;
    std::ofstream(c + "/units/" + id + ".json") << R"({"unit": ")" << id << R"(", "key": {"i": 99}, "result": {}})";
    CHECK(test::message_of<InputError>([&] { collect_units({a, b, c}); }).find("expected key") != std::string::npos);
  }
  for (const std::string& d : {a, b, c}) fs::remove_all(d);
}

TEST_CASE("bench shards: units per GPU type, the device type checked, rows merged in kvq bench's order") {
  BenchStudy study;
  study.gpus = {"h100", "a100"};
  study.shapes = "seed002|llama8b/B1/T1024";
  study.variants = {"decode-tc", "decode-splitk"};
  const WorkPlan plan = plan_bench(study, 2);
  REQUIRE(plan.units.size() == 2 * 2 * 2);
  CHECK(plan_groups(plan) == std::vector<std::string>{"h100", "a100"});
  CHECK(gpu_is_type("NVIDIA H100 80GB HBM3", "h100"));
  CHECK_FALSE(gpu_is_type("NVIDIA H200", "h100"));
  CHECK(gpu_is_type("NVIDIA A100-SXM4-80GB", "a100"));
  CHECK(gpu_is_type("anything", "any"));

  const std::vector<std::string> storages = {"bf16", "int8-head"};
  int calls = 0;
  // Stands in for kvq bench: a header and one row naming the case.
  const BenchCase fake = [&](const std::string& shape, const std::string& variant, const std::string& storage,
                             const std::string& csv) {
    ++calls;
    std::ofstream(csv) << "shape,kernel,storage\n" << shape << "," << variant << "," << storage << "\n";
  };
  const std::string root = temp_dir("bench");
  CHECK(test::message_of<InputError>([&] { run_bench_shard(plan, {0, 2}, "h100", "NVIDIA H200", storages, root + "/x", fake); })
            .find("this task's GPU is 'NVIDIA H200', not a h100") != std::string::npos);
  CHECK_THROWS_AS(run_bench_shard(plan, {0, 2}, "", "NVIDIA H100", storages, root + "/x", fake), InputError);
  std::vector<std::string> dirs;
  for (const std::string gpu : {"h100", "a100"})
    for (int s = 0; s < 2; ++s) {
      dirs.push_back(root + "/" + gpu + "-" + std::to_string(s));
      run_bench_shard(plan, {s, 2}, gpu, gpu == "h100" ? "NVIDIA H100 80GB HBM3" : "NVIDIA A100", storages, dirs.back(), fake);
    }
  CHECK(calls == 8 * 2);
  run_bench_shard(plan, {0, 2}, "h100", "NVIDIA H100", storages, dirs.front(), fake);  // all there: nothing re-timed
  CHECK(calls == 8 * 2);
  merge_bench(collect_units(dirs), root + "/results");
  std::ifstream in(root + "/results/h100/decode.csv");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  CHECK(lines == std::vector<std::string>{"shape,kernel,storage",  // shape, then storage, then variant
                                          "seed002/B1/T1024,decode-tc,bf16",
                                          "seed002/B1/T1024,decode-splitk,bf16",
                                          "seed002/B1/T1024,decode-tc,int8-head",
                                          "seed002/B1/T1024,decode-splitk,int8-head",
                                          "llama8b/B1/T1024,decode-tc,bf16",
                                          "llama8b/B1/T1024,decode-splitk,bf16",
                                          "llama8b/B1/T1024,decode-tc,int8-head",
                                          "llama8b/B1/T1024,decode-splitk,int8-head"});
  CHECK(fs::exists(root + "/results/a100/decode.csv"));
  fs::remove_all(root);
}
