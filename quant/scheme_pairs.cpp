#include "quant/scheme_pairs.hpp"

#include <string>

namespace kvq {

std::vector<SchemePair> cross_pairs(const std::vector<Scheme>& k, const std::vector<Scheme>& v) {
  std::vector<SchemePair> pairs;
  for (const Scheme& ks : k)
    for (const Scheme& vs : v) pairs.push_back({ks, vs});
  return pairs;
}

std::vector<SchemePair> default_pairs(int64_t head_dim) {
  std::vector<SchemePair> pairs;
  for (int bits : {8, 4}) {
    std::vector<std::string> grans = {"tensor", "token", "head"};
    for (int g : {64, 32, 16, 8})
      if (g < head_dim && head_dim % g == 0) grans.push_back("g" + std::to_string(g));
    for (const std::string& gran : grans)
      for (const char* sym : {"", "-asym"}) {
        const Scheme s = parse_scheme("int" + std::to_string(bits) + "-" + gran + sym);
        pairs.push_back({s, s});
      }
    pairs.push_back({parse_scheme("int" + std::to_string(bits) + "-chan-t32-asym"),
                     parse_scheme("int" + std::to_string(bits) + "-token-asym")});
  }
  return pairs;
}

}  // namespace kvq
