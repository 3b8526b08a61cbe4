// Reading a dump in a child process first. libhdf5 is not hardened against malformed files: a
// corrupt one can crash it (a bad global heap, a looping object header) or make it loop forever,
// and no try/catch survives that. So every dump a kvq command reads is first read in full — its
// metadata and the data of the layers the command will use — by `kvq check-dump` in a child
// process with a time limit; the command opens the file itself only when the child read it
// cleanly. The same code reads the same file in both processes, so what the child survived the
// parent survives. Cost: the dump is read twice (the second time mostly from the page cache).
#pragma once

#include <string>
#include <vector>

#include "data/dump.hpp"

namespace kvq {

// Reads `path` in a child process (this executable's `check-dump` subcommand); returns when it
// read cleanly. Throws the child's DumpError (schema problems, exit 3) or CorruptFileError (HDF5
// failed, the child crashed, or it ran past the time limit: KVQ_DUMP_CHECK_SECONDS, default 60,
// plus a second per 64 MiB of file), each one line naming the file.
void check_dump_in_child(const std::string& path, const std::vector<int>& layers = {});

// check_dump_in_child, then open_dump in this process.
DumpInfo open_dump_checked(const std::string& path, const std::vector<int>& layers = {});

// An InputError when `out` is the file `input` (any path to it: links, ./, ..): the finished output
// would replace the dump it was read from.
void refuse_output_over_input(const std::string& out, const std::string& input);

// An InputError when one dump is given twice (any path to it): each of its rows would count twice.
void refuse_repeated_dumps(const std::vector<std::string>& dumps, const std::string& command);

// What the child runs: open_dump, then every selected layer (all when `layers` is empty), whole as
// the commands read them, and the token ids.
void read_dump_fully(const std::string& path, const std::vector<int>& layers);

}  // namespace kvq
