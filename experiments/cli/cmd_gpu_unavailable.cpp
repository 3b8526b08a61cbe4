// Built without CUDA: the GPU subcommands exist and say why they cannot run.
#include "experiments/cli/commands.hpp"
#include "quant/errors.hpp"

namespace kvq {

std::vector<Command> add_gpu_commands(CLI::App& parent) {
  std::vector<Command> out;
  for (const char* name : {"variants", "validate", "bench-quantize", "bench"}) {
    CLI::App* cmd = parent.add_subcommand(name, "GPU command (this kvq was built without CUDA)");
    cmd->allow_extras();
    out.push_back({cmd, [] () -> int {
                     throw InputError("this kvq was built without CUDA (KVQ_CUDA=OFF or no nvcc): GPU commands are "
                                      "unavailable; rebuild with nvcc on PATH");
                   }});
  }
  return out;
}

}  // namespace kvq
