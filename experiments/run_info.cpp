#include "experiments/run_info.hpp"

#include <omp.h>
#include <unistd.h>

#include <ctime>
#include <fstream>

#include "build_info.hpp"

namespace kvq {
namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace

std::string kvq_version() { return KVQ_VERSION; }
std::string kvq_commit() { return KVQ_GIT_COMMIT; }

nlohmann::json run_info() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return {{"kvq_version", kvq_version()}, {"kvq_commit", kvq_commit()},   {"hostname", host},
          {"cpu", cpu_model()},           {"threads", omp_get_max_threads()}, {"time_utc", stamp}};
}

}  // namespace kvq
