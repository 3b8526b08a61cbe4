// Built without CUDA: the GPU subcommands exist and say why they cannot run.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "experiments/cli/commands.hpp"
#include "experiments/cli/python_gate.hpp"
#include "quant/errors.hpp"

namespace kvq {

std::vector<Command> add_gpu_commands(CLI::App& parent) {
  std::vector<Command> out;
  for (const char* name : {"variants", "validate", "bench-quantize", "bench"}) {
    const bool validate = std::string(name) == "validate";
    CLI::App* cmd = parent.add_subcommand(name, validate ? "The adoption gate (here: --python kernels only; this kvq "
                                                           "was built without CUDA)"
                                                         : "GPU command (this kvq was built without CUDA)");
    auto py = std::make_shared<PythonGateArgs>();
    auto quick = std::make_shared<bool>(false);
    auto report = std::make_shared<std::string>("results/validate/validate.json");
    if (validate) {  // a Python kernel is gated by Python: no CUDA needed for numpy kernels
      add_python_gate_options(cmd, *py);
      cmd->add_flag("--quick", *quick, "Small shapes only");
      cmd->add_option("--report", *report, "JSON report")->capture_default_str();
    }
    cmd->allow_extras();
    out.push_back({cmd, [py, quick, report, cmd]() -> int {
                     if (!py->target.empty()) {
                       if (!cmd->remaining().empty())
                         throw InputError(fmt::format("kvq validate --python: unexpected option {} (this kvq was built "
                                                      "without CUDA)", cmd->remaining().front()));
                       run_python_gate(*py, *quick ? "quick" : "full", *report, 0);
                     }
                     throw InputError("this kvq was built without CUDA (KVQ_CUDA=OFF or no nvcc): GPU commands are "
                                      "unavailable; rebuild with nvcc on PATH");
                   }});
  }
  return out;
}

}  // namespace kvq
