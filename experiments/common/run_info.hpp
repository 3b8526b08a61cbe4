// What a results file records about the run that made it: kvq version and commit, the machine.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kvq {

std::string kvq_version();
std::string kvq_commit();
// {"kvq_version", "kvq_commit", "hostname", "cpu", "threads", "time_utc"}
nlohmann::json run_info();

// Hex SHA-256 of a file's bytes (OpenSSL), to record exactly which input a result came from.
std::string file_sha256(const std::string& path);

}  // namespace kvq
