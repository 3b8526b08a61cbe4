// Timing of the fp64 CPU reference on the DESIGN.md decode shapes (a benchmark, not a test).
#pragma once

#include <string>
#include <vector>

namespace kvq {

struct DecodeShape {
  std::string group;  // seed000, seed002, llama8b
  int64_t batch, q_heads, kv_heads, tokens, head_dim;
  std::string label() const;  // "seed000/B32/T8192"
};

// seed000 T=8192 Hq=8 Hkv=1 D=128 B in {32..512}; seed002 B=1 T=1024 Hq=32 Hkv=8; Llama-3-8B-like
// Hq=32 Hkv=8 D=128, B in {1, 8, 64} x T in {1K, 8K, 32K} without B=64 T=32K (34 GB of fp32 K/V).
std::vector<DecodeShape> design_decode_shapes();

struct CpuTiming {
  DecodeShape shape;
  int reps = 0;
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  double gflops = 0;   // 4 B Hq T D flops (QK and PV) / median
  double kv_gbps = 0;  // fp32 K and V bytes / median
};

// Times attention() on seeded random fp32 data: one warm-up, then at least `min_reps` runs and
// at least `min_seconds` in total.
CpuTiming time_reference(const DecodeShape& shape, int min_reps, double min_seconds);

}  // namespace kvq
