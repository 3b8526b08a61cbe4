#include "experiments/common/run_info.hpp"

#include <omp.h>
#include <unistd.h>

#include <fmt/format.h>
#include <openssl/evp.h>

#include <ctime>
#include <fstream>
#include <memory>
#include <vector>

#include "quant/errors.hpp"

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

std::string file_sha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open the file to hash it", path));
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) throw Error("OpenSSL: cannot start SHA-256");
  std::vector<char> buf(1 << 20);
  while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0)
    EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(in.gcount()));
  if (in.bad()) throw InputError(fmt::format("{}: read error while hashing the file", path));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

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
