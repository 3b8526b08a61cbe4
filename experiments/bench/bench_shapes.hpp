// What kvq bench (and the sweep's latency columns) time: the DESIGN.md decode shapes, the K/V
// storages, rotating sets of device caches filled by the GPU quantizer, and the timing itself.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "experiments/bench/bench_input.hpp"
#include "experiments/common/decode_shapes.hpp"
#include "gpu/decode.hpp"
#include "gpu/device.hpp"
#include "gpu/quantize.hpp"
#include "gpu/registry.hpp"
#include "gpu/timing.hpp"

namespace kvq {

// The DESIGN.md decode shapes (experiments/common/decode_shapes.hpp) whose label matches `regex`.
std::vector<DecodeShape> bench_shapes(const std::string& regex = ".");

// A K/V storage: each of K and V raw (bf16 / fp16) or quantized by a scheme, planar or (int4, both
// operands) in FBGEMM rows.
struct BenchStorage {
  // As written on the command line: "bf16", "int8-head", "int4-g32-asym:fbgemm", or a K/V pair
  // "int4-head-asym/int8-head", "bf16/int4-g32-asym".
  std::string name;
  KvFormat k_format = KvFormat::kBf16, v_format = KvFormat::kBf16;
  std::optional<Scheme> k, v;  // the quantized operands' schemes
};

inline constexpr const char* kBenchStorages =
    "bf16,int8-tensor,int8-token,int8-head,int8-g32,int4-head-asym,int4-g32-asym,int4-head-asym:fbgemm,"
    "int4-g32-asym:fbgemm,fp8-e4m3,fp8-e4m3-head,int8-head/int4-g32-asym,int4-g32-asym/int8-head,bf16/int4-g32-asym,"
    "fp8-e4m3-head/int4-g32-asym,int4-g32-asym+w128,q8_0,q4_0,q8_0/q4_0";

// Throws InputError / SchemeError naming the bad entry.
std::vector<BenchStorage> parse_bench_storages(const std::string& list);
BenchStorage bench_storage(const Scheme& k, const Scheme& v, bool fbgemm);
// One operand of a pair: "bf16" or "fp16" (raw), else a scheme; nullopt scheme for raw.
BenchStorage bench_storage(const std::optional<Scheme>& k, KvFormat k_raw, const std::optional<Scheme>& v,
                           KvFormat v_raw, bool fbgemm);

// `elements` pseudo-random bf16 values on the device, bench_input_pattern's repeated (rows of `row`
// elements; uniform: in about [-4, 4], never all zeros, so scales are normal numbers); the same
// `seed`, the same bytes.
DeviceBuffer<uint8_t> random_bf16(int64_t elements, uint32_t seed, BenchInput input = BenchInput::kUniform,
                                  int64_t row = 1);

// Caches of one shape and storage, as many as make >= 4x L2 (at most half the device memory),
// each quantized on the GPU from the same pseudo-random bf16 K/V.
class BenchCaches {
 public:
  BenchCaches(const DecodeShape& shape, const BenchStorage& storage, const DeviceInfo& dev);
  int sets() const { return static_cast<int>(k_.size()); }
  const KvOperand& k(int set) const { return k_[set]; }
  const KvOperand& v(int set) const { return v_[set]; }
  const KvWindow& k_window(int set) const { return k_window_[set]; }
  const KvWindow& v_window(int set) const { return v_window_[set]; }

 private:
  std::vector<DeviceBuffer<uint8_t>> raw_;                   // bf16 / fp16 caches
  std::vector<std::unique_ptr<QuantizeWorkspace>> quantized_;  // quantized caches
  std::vector<KvOperand> k_, v_;
  std::vector<KvWindow> k_window_, v_window_;
};

struct DecodeTiming {
  DecodeParams planned;  // the launch shape of set 0 (every set gets the same)
  GpuTiming time;
  int64_t bytes = 0;  // decode_bytes_moved
  std::string skipped;  // why the variant cannot run this storage (then nothing was timed)
};

// Times `variant` over the rotating `caches` (graph replays, `calls_per_graph` calls per graph);
// forced_splits > 0 replaces the split heuristic (split-K variants).
DecodeTiming time_decode(const DecodeVariant& variant, const DecodeShape& shape, const BenchStorage& storage,
                         const BenchCaches& caches, const DeviceInfo& dev, int reps, int calls_per_graph,
                         int forced_splits = 0);

}  // namespace kvq
