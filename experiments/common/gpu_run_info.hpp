// What a GPU results file records about the device and the run.
#pragma once

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "experiments/common/run_info.hpp"
#include "gpu/device.hpp"

namespace kvq {

// The kernel driver's version ("580.95.05") from /proc/driver/nvidia/version, else from
// KVQ_DRIVER (the device script sets it from nvidia-smi, for sandboxes without /proc/driver).
inline std::string nvidia_driver_version() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string word, prev;
  while (in >> word) {
    if (prev == "Module" && !word.empty() && std::isdigit(static_cast<unsigned char>(word[0]))) return word;
    prev = word;
  }
  const char* env = std::getenv("KVQ_DRIVER");
  return env && *env ? env : "unknown";
}

inline nlohmann::json gpu_run_info(const DeviceInfo& d) {
  nlohmann::json j = run_info();
  j.update({{"gpu", d.name}, {"sm_count", d.sm_count}, {"compute_capability", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor)},
            {"l2_bytes", d.l2_bytes}, {"memory_bytes", d.global_bytes}, {"sm_clock_mhz", d.sm_clock_khz / 1000},
            {"memory_clock_mhz", d.memory_clock_khz / 1000}, {"memory_bus_bits", d.memory_bus_bits},
            {"driver", nvidia_driver_version()}, {"cuda_driver", d.driver_string()}, {"cuda_runtime", d.runtime_string()}});
  return j;
}

}  // namespace kvq
