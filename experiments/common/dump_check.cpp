#include "experiments/common/dump_check.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

namespace kvq {
namespace {

using Clock = std::chrono::steady_clock;

double time_limit_seconds(const std::string& path) {
  double base = 60.0;
  if (const char* env = std::getenv("KVQ_DUMP_CHECK_SECONDS")) {
    char* end = nullptr;
    base = std::strtod(env, &end);
    if (end == env || *end != '\0' || !(base > 0))
      throw InputError(fmt::format("KVQ_DUMP_CHECK_SECONDS='{}': expected a positive number of seconds", env));
  }
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  return base + (ec ? 0.0 : static_cast<double>(bytes) / (64.0 * (1 << 20)));
}

// The child's own one-line message ("kvq: error: ..."), or "" when it printed none.
std::string kvq_message(const std::string& output) {
  std::istringstream lines(output);
  std::string line, found;
  while (std::getline(lines, line))
    if (line.rfind("kvq: ", 0) == 0) found = line;
  return found;
}

// A sanitizer report whose innermost frame (past the interceptors) is in libhdf5 is HDF5 crashing
// on the file; any other report is a bug in kvq, which the sanitizer lane must see as one.
bool sanitizer_report(const std::string& output) {
  return output.find("Sanitizer") != std::string::npos || output.find("runtime error:") != std::string::npos;
}

bool report_is_in_hdf5(const std::string& output) {
  if (output.find("runtime error:") != std::string::npos) return false;  // UBSan: kvq's code only
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t frame = line.find("    #");
    if (frame == std::string::npos) continue;
    if (line.find("asan_") != std::string::npos || line.find("interceptor") != std::string::npos ||
        line.find("libasan") != std::string::npos)
      continue;
    return line.find("libhdf5") != std::string::npos;
  }
  return false;
}

}  // namespace

void check_dump_in_child(const std::string& path, const std::vector<int>& layers) {
  const double limit = time_limit_seconds(path);
  std::vector<std::string> args = {"kvq", "check-dump", path};
  if (!layers.empty()) args.insert(args.end(), {"--layers", fmt::format("{}", fmt::join(layers, ","))});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) throw Error(fmt::format("{}: cannot start the dump check: {}", path, std::strerror(errno)));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw Error(fmt::format("{}: cannot start the dump check: {}", path, std::strerror(errno)));
  if (pid == 0) {  // only async-signal-safe calls until exec
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive kvq (a hung check would run on)
    if (getppid() != parent) _exit(126);
    const int null_in = open("/dev/null", O_RDONLY);
    if (null_in >= 0) dup2(null_in, 0);
    dup2(out[1], 1);
    dup2(out[1], 2);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(out[1]);

  // The child's output until it closes it or time runs out, then its exit status.
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
  std::string output;
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    char buf[4096];
    const ssize_t n = read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (output.size() < (1 << 20)) output.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  int status = 0;
  while (!timed_out && waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() >= deadline) timed_out = true;
    else std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (timed_out) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    throw CorruptFileError(fmt::format(
        "{}: reading it did not finish within {:.0f} s, so the file is taken as corrupt (HDF5 can loop forever on "
        "corrupt metadata); on slow storage raise KVQ_DUMP_CHECK_SECONDS", path, limit));
  }

  const std::string message = kvq_message(output);
  if (WIFSIGNALED(status))
    throw CorruptFileError(fmt::format("{}: the HDF5 library crashed reading it ({}), so the file is corrupt", path,
                                       strsignal(WTERMSIG(status))));
  const int code = WEXITSTATUS(status);
  if (code == 0) return;
  if (sanitizer_report(output)) {
    if (report_is_in_hdf5(output))
      throw CorruptFileError(fmt::format("{}: the HDF5 library crashed reading it (a sanitizer report), so the file is "
                                         "corrupt", path));
    throw Error(fmt::format("{}: the dump check failed in kvq's own code (a sanitizer report; run `kvq check-dump {}` "
                            "to see it)", path, path));
  }
  const std::string error_prefix = "kvq: error: ";
  if ((code == 3 || code == 4) && message.rfind(error_prefix, 0) == 0) {
    const std::string what = message.substr(error_prefix.size());
    if (code == 4) throw CorruptFileError(what);
    throw DumpError(what);
  }
  if (code == 126 || code == 127) throw Error(fmt::format("{}: cannot run the dump check (/proc/self/exe)", path));
  throw CorruptFileError(fmt::format("{}: reading it failed in the dump check (exit status {}{}), so the file is taken "
                                     "as corrupt", path, code, message.empty() ? "" : ": " + message));
}

DumpInfo open_dump_checked(const std::string& path, const std::vector<int>& layers) {
  check_dump_in_child(path, layers);
  return open_dump(path);
}

void read_dump_fully(const std::string& path, const std::vector<int>& layers) {
  const DumpInfo info = open_dump(path);
  for (size_t i : select_layers(info, layers)) read_layer(info, i);  // whole, as the commands read them
  if (info.has_tokens) read_tokens(info);
}

void refuse_repeated_dumps(const std::vector<std::string>& dumps, const std::string& command) {
  for (size_t i = 0; i < dumps.size(); ++i)
    for (size_t j = 0; j < i; ++j) {
      std::error_code error;
      if (dumps[i] == dumps[j] || std::filesystem::equivalent(dumps[i], dumps[j], error))
        throw InputError(fmt::format("{}: {} is given twice (as {}): its rows would count twice", command, dumps[i],
                                     dumps[j]));
    }
}

void refuse_output_over_input(const std::string& out, const std::string& input) {
  std::error_code error;
  if (std::filesystem::equivalent(out, input, error))
    throw InputError(fmt::format("{}: --out {} is the input dump, which the output would replace; write it elsewhere",
                                 input, out));
}

}  // namespace kvq
