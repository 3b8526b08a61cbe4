#include "experiments/cli/python_gate.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "quant/errors.hpp"

namespace kvq {

void add_python_gate_options(CLI::App* validate, PythonGateArgs& a) {
  validate->add_option("--python", a.target, "Gate a Python kernel instead: module:function or file.py:function "
                                             "(python -m kvq.gate; docs/gate.md)");
  validate->add_option("--k", a.k, "--python: K storage, bf16, fp16 or a kvq scheme")->capture_default_str();
  validate->add_option("--v", a.v, "--python: V storage")->capture_default_str();
  validate->add_option("--layout", a.layout, "--python: cache layout of a plain function (bnsh, bsnh, paged, fbgemm)");
  validate->add_option("--profile", a.profile, "--python: precision profile of a plain function (e.g. fp32-pbf16-obf16)");
  validate->add_option("--device", a.device, "--python: cpu (numpy arrays) or cuda (torch CUDA tensors)")
      ->capture_default_str();
}

namespace {
// The Python that runs the gate: $KVQ_PYTHON, else the one this build was configured with, else python3.
std::string gate_python() {
  if (const char* env = std::getenv("KVQ_PYTHON"); env && *env) return env;
  if (access(KVQ_BUILD_PYTHON, X_OK) == 0) return KVQ_BUILD_PYTHON;
  return "python3";
}
}  // namespace

void run_python_gate(const PythonGateArgs& a, const std::string& cases, const std::string& report, int reruns) {
  std::vector<std::string> args = {"-m", "kvq.gate", a.target, "--k", a.k, "--v", a.v,
                                   "--cases", cases, "--device", a.device};
  if (!a.layout.empty()) args.insert(args.end(), {"--layout", a.layout});
  if (!a.profile.empty()) args.insert(args.end(), {"--profile", a.profile});
  if (!report.empty()) args.insert(args.end(), {"--report", report});
  if (reruns > 0) args.insert(args.end(), {"--reruns", std::to_string(reruns)});
  exec_python(args, "kvq validate --python");
}

void exec_python(std::vector<std::string> args, const std::string& what) {
  args.insert(args.begin(), gate_python());
  // The package beside this binary (build/python) comes first, so that the Python side is this build's.
  if (access(KVQ_BUILD_PACKAGE "/kvq/__init__.py", R_OK) == 0) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path = old && *old ? fmt::format("{}:{}", KVQ_BUILD_PACKAGE, old) : std::string(KVQ_BUILD_PACKAGE);
    setenv("PYTHONPATH", path.c_str(), 1);
  }
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  execvp(argv[0], argv.data());
  throw InputError(fmt::format("{}: cannot run {}: {} (set KVQ_PYTHON to a Python with kvq installed)", what, args[0],
                               std::strerror(errno)));
}

}  // namespace kvq
