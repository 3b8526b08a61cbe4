// kvq check-dump: reads a dump in full and exits 0, 3 (breaks the schema) or 4 (corrupt). kvq runs
// it in a child process before any command reads a dump (experiments/common/dump_check.hpp); hidden from
// the help, since run directly it is as exposed to HDF5's crashes as any reader.
#include <memory>

#include "experiments/cli/commands.hpp"
#include "experiments/common/dump_check.hpp"

namespace kvq {

Command add_check_dump_command(CLI::App& parent) {
  struct Args {
    std::string path;
    std::vector<int> layers;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = parent.add_subcommand("check-dump", "Read a dump in full (the child process of every dump read)");
  cmd->group("");
  cmd->add_option("file", a->path, "HDF5 dump (schema v1)")->required();
  cmd->add_option("--layers", a->layers, "Layer indices (default: all)")->delimiter(',');
  return {cmd, [a] {
            read_dump_fully(a->path, a->layers);
            return 0;
          }};
}

}  // namespace kvq
