// kvq slurm submit STUDY: the study's shards as a Slurm array job (one per GPU type for a bench),
// and the merge as a job that starts after every task succeeded (--dependency=afterok). The job
// scripts are scripts/slurm/*.sbatch; this only fills in their sbatch options.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "experiments/cli/commands.hpp"
#include "experiments/cli/number_checks.hpp"
#include "experiments/cluster/work_plan.hpp"
#include "experiments/sweep/sweep_checkpoint.hpp"
#include "quant/errors.hpp"

namespace fs = std::filesystem;

namespace kvq {
namespace {

struct SlurmArgs {
  std::string study, partition, time, sbatch_args, gres = "gpu:{gpu}:1";
  int cpus = 1;
  bool dry_run = false;
};

std::string sh_quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string this_kvq() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "kvq";
}

// Runs `command` (sbatch --parsable), returns the job id it prints ("123" or "123;cluster").
std::string submit(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen((command + " 2>&1").c_str(), "r"), pclose);
  if (!pipe) throw InputError(fmt::format("cannot run: {}", command));
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe.get())) out.append(buf, n);
  const int status = pclose(pipe.release());
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (status != 0 || out.empty() || out.find_first_not_of("0123456789;_-.abcdefghijklmnopqrstuvwxyz") != std::string::npos)
    throw InputError(fmt::format("sbatch failed (exit {}): {}\n  command: {}", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                                 out, command));
  return out.substr(0, out.find(';'));
}

int run_submit(const SlurmArgs& a) {
  const WorkPlan plan = read_plan(a.study + "/plan.json");
  const std::string scripts = KVQ_SOURCE_DIR "/scripts/slurm";
  fs::create_directories(a.study + "/logs");
  // The tasks run this kvq, its checkout's scripts and its Python package (an eval's shards and merge).
  const char* python = std::getenv("KVQ_PYTHON");
  std::string common = fmt::format("--export=ALL,KVQ={},KVQ_ROOT={},KVQ_PACKAGE={},KVQ_PYTHON={}", sh_quoted(this_kvq()),
                                   sh_quoted(KVQ_SOURCE_DIR), sh_quoted(KVQ_BUILD_PACKAGE),
                                   sh_quoted(python && *python ? python : KVQ_BUILD_PYTHON));
  if (!a.partition.empty()) common += " --partition=" + sh_quoted(a.partition);
  if (!a.time.empty()) common += " --time=" + sh_quoted(a.time);
  if (!a.sbatch_args.empty()) common += " " + a.sbatch_args;  // as given: the user's own sbatch options
  const std::string logs = sh_quoted(a.study + "/logs");
  nlohmann::json record = {{"study", a.study}, {"kind", plan.kind}, {"shards", plan.shards}, {"arrays", nlohmann::json::array()}};
  std::vector<std::string> arrays;
  for (const std::string& group : plan_groups(plan)) {
    std::string gres;
    if (plan.kind == "bench") {
      gres = a.gres;
      const size_t at = gres.find("{gpu}");
      if (at != std::string::npos) gres = group == "any" ? "gpu:1" : gres.replace(at, 5, group);
      gres = " --gres=" + sh_quoted(gres);
    }
    const std::string command = fmt::format(
        "sbatch --parsable --array=0-{} --job-name=kvq-{}{} --cpus-per-task={} --output={}/%x_%A_%a.out{} {} {}/{}.sbatch {}{}",
        plan.shards - 1, plan.kind, group.empty() ? "" : "-" + group, a.cpus, logs, gres, common, scripts, plan.kind,
        sh_quoted(a.study), group.empty() ? "" : " " + sh_quoted(group));
    const std::string job = a.dry_run ? "ARRAY" + std::to_string(arrays.size()) : submit(command);
    fmt::print("{}\n  -> array job {}\n", command, job);
    arrays.push_back(job);
    record["arrays"].push_back({{"group", group}, {"job", job}, {"command", command}});
  }
  const std::string merge = fmt::format(
      "sbatch --parsable --dependency=afterok:{} --job-name=kvq-merge-{} --output={}/%x_%j.out {} {}/merge.sbatch {}",
      fmt::join(arrays, ":"), plan.kind, logs, common, scripts, sh_quoted(a.study));
  const std::string merge_job = a.dry_run ? "MERGE" : submit(merge);
  fmt::print("{}\n  -> merge job {} (starts when every task succeeded; results in {}/results)\n", merge, merge_job, a.study);
  record["merge"] = {{"job", merge_job}, {"command", merge}};
  if (!a.dry_run) write_file_atomically(a.study + "/slurm.json", record.dump(1) + "\n");
  return 0;
}

}  // namespace

Command add_slurm_command(CLI::App& parent) {
  auto a = std::make_shared<SlurmArgs>();
  CLI::App* slurm = parent.add_subcommand("slurm", "Run a study (kvq plan) on a Slurm cluster");
  slurm->require_subcommand(1);
  CLI::App* cmd = slurm->add_subcommand("submit", "Submit the study's shards as an array job and the merge after it");
  cmd->add_option("study", a->study, "Study folder holding plan.json")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--partition", a->partition, "Slurm partition");
  cmd->add_option("--time", a->time, "Time limit per task (sbatch --time)");
  cmd->add_option("--cpus", a->cpus, "CPUs per task (OpenMP threads)")->capture_default_str()->check(kPositive);
  cmd->add_option("--gres", a->gres, "GPU request of a bench task; {gpu} is the GPU type")->capture_default_str();
  cmd->add_option("--sbatch", a->sbatch_args, "Further sbatch options, as one string (e.g. \"--account=x --qos=y\")");
  cmd->add_flag("--dry-run", a->dry_run, "Print the sbatch commands without submitting");
  return {slurm, [a] { return run_submit(*a); }};
}

}  // namespace kvq
