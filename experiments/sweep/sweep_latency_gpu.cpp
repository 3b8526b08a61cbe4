#include <fmt/format.h>

#include <map>

#include "experiments/bench/bench_shapes.hpp"
#include "experiments/sweep/sweep_latency.hpp"
#include "quant/errors.hpp"

namespace kvq {
namespace {

DecodeShape parse_shape(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  int64_t batch = -1;
  try {
    batch = colon == std::string::npos ? -1 : std::stoll(spec.substr(colon + 1));
  } catch (const std::exception&) {
  }
  for (const DecodeShape& s : design_decode_shapes())
    if (s.group == name && (batch < 0 || s.batch == batch)) return s;
  throw InputError(fmt::format("--latency-shape '{}': expected NAME:B of a bench shape, e.g. seed000:128 or llama8b:8",
                               spec));
}

}  // namespace

void attach_decode_latency(std::vector<SweepRow>& rows, const std::string& spec) {
  const DecodeShape shape = parse_shape(spec);
  if (!cuda_device_available()) return;
  const DeviceInfo dev = device_info();
  const std::string where = fmt::format("{} B={} Hq={} Hkv={} T={} D={}", shape.group, shape.batch, shape.q_heads,
                                        shape.kv_heads, shape.tokens, shape.head_dim);
  std::map<std::string, std::optional<DecodeLatency>> measured;  // by "K/V" scheme names
  for (SweepRow& row : rows) {
    const std::string key = to_string(row.schemes.k) + "/" + to_string(row.schemes.v);
    auto it = measured.find(key);
    if (it == measured.end()) {
      std::optional<DecodeLatency> lat;
      auto why = [&](const Scheme& s) { return decode_unsupported_reason(s, shape.head_dim, false); };
      const std::string why_k = why(row.schemes.k), why_v = why(row.schemes.v);
      if (why_k.empty() && why_v.empty()) {
        const BenchStorage st = bench_storage(row.schemes.k, row.schemes.v, false);
        const BenchCaches caches(shape, st, dev);
        for (const DecodeVariant* variant : adopted_decode_variants()) {  // the first adopted one that runs it
          const DecodeTiming t = time_decode(*variant, shape, st, caches, dev, 50, 8);
          if (!t.skipped.empty()) continue;
          lat = DecodeLatency{variant->name, where, t.time.median_us,
                              static_cast<double>(t.bytes) / (t.time.median_us * 1e3)};
          fmt::print("latency {} on {} ({}): {:.1f} us\n", key, where, variant->name, t.time.median_us);
          break;
        }
        if (!lat) fmt::print("latency {}: no adopted decode variant runs it at {}\n", key, where);
      } else {
        fmt::print("latency {}: no decode kernel ({})\n", key, !why_k.empty() ? why_k : why_v);
      }
      it = measured.emplace(key, lat).first;
    }
    row.latency = it->second;
  }
}

}  // namespace kvq
