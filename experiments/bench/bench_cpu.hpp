// Timing of the fp64 CPU reference on the DESIGN.md decode shapes (a benchmark, not a test).
#pragma once

#include "experiments/common/decode_shapes.hpp"

namespace kvq {

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
