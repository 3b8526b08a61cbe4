// kvq validate --python module:function: the gate's decode cases on a kernel written in Python
// (python/kvq/gate.py does the work; this hands it the options). Works in CPU-only builds too.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace kvq {

struct PythonGateArgs {
  std::string target;  // module:function or path/to/file.py:function
  std::string k = "bf16", v = "bf16", layout, profile, device = "cpu";
};

// Adds --python, --k, --v, --layout, --profile and --device to `validate`.
void add_python_gate_options(CLI::App* validate, PythonGateArgs& a);

// Replaces this process with `python -m kvq.gate ...` (KVQ_PYTHON, else the build's Python); the
// gate's exit code is kvq's. cases: "quick" or "full"; reruns 0: the gate's default.
[[noreturn]] void run_python_gate(const PythonGateArgs& a, const std::string& cases, const std::string& report, int reruns);

// Replaces this process with `python ARGS...` (KVQ_PYTHON, else the build's Python, else python3),
// this build's kvq package first on PYTHONPATH. `what` names the command in the error if it cannot.
[[noreturn]] void exec_python(std::vector<std::string> args, const std::string& what);

}  // namespace kvq
