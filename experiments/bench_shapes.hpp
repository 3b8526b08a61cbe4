// What kvq bench (and the sweep's latency columns) time: the DESIGN.md decode shapes, the K/V
// storages, and rotating sets of device caches filled by the GPU quantizer.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu/decode.hpp"
#include "gpu/device.hpp"
#include "gpu/quantize.hpp"

namespace kvq {

struct BenchShape {
  std::string name;
  int64_t batch, q_heads, kv_heads, tokens;
  int head_dim;
};

// seed000 T=8192 Hq=8 Hkv=1 D=128 B in {32..512}; seed002 B=1 T=1024 Hq=32 Hkv=8; llama8b Hq=32
// Hkv=8 D=128, B in {1, 8, 64} x T in {1K, 8K, 32K} (without B=64 T=32K); names matching `regex`.
std::vector<BenchShape> bench_shapes(const std::string& regex = ".");

// A K/V storage: bf16 / fp16, or a scheme (the same for K and V) in the planar or FBGEMM layout.
struct BenchStorage {
  std::string name;  // as written on the command line: "bf16", "int8-head", "int4-g32-asym:fbgemm"
  KvFormat format = KvFormat::kBf16;
  std::optional<Scheme> k, v;
};

inline constexpr const char* kBenchStorages =
    "bf16,int8-tensor,int8-token,int8-head,int8-g32,int4-head-asym,int4-g32-asym,int4-head-asym:fbgemm,"
    "int4-g32-asym:fbgemm";

// Throws InputError / SchemeError naming the bad entry.
std::vector<BenchStorage> parse_bench_storages(const std::string& list);
BenchStorage bench_storage(const Scheme& k, const Scheme& v, bool fbgemm);

// Caches of one shape and storage, as many as make >= 4x L2 (at most half the device memory),
// each quantized on the GPU from the same pseudo-random bf16 K/V.
class BenchCaches {
 public:
  BenchCaches(const BenchShape& shape, const BenchStorage& storage, const DeviceInfo& dev);
  int sets() const { return static_cast<int>(k_.size()); }
  const KvOperand& k(int set) const { return k_[set]; }
  const KvOperand& v(int set) const { return v_[set]; }

 private:
  std::vector<DeviceBuffer<uint8_t>> raw_;                   // bf16 / fp16 caches
  std::vector<std::unique_ptr<QuantizeWorkspace>> quantized_;  // quantized caches
  std::vector<KvOperand> k_, v_;
};

}  // namespace kvq
