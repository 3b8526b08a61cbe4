// GPU timing as DESIGN.md prescribes: CUDA events around CUDA-graph replays, rotating input sets,
// warm-up, median and p10/p90 of many replays; and the device-to-device copy bandwidth that every
// bandwidth figure is compared with in the same process.
#pragma once

#include <cuda_runtime.h>

#include <functional>

namespace kvq {

struct GpuTiming {
  double median_us = 0, p10_us = 0, p90_us = 0;
  int reps = 0;
};

// `launch(stream, set)` enqueues the work for input set `set` (0..sets-1). Each graph captures
// `calls_per_graph` calls on consecutive sets (so the graph launch is amortized for short kernels),
// the replays rotate through the graphs (choose sets so they total >= 4x L2), and the times are
// per call.
GpuTiming time_graph_replays(const std::function<void(cudaStream_t, int)>& launch, int sets, int reps = 50,
                             int warmup = 5, int calls_per_graph = 1);

// Bytes read plus bytes written per second of a device-to-device copy of `bytes`, in GB/s (1e9).
double copy_bandwidth_gbps(size_t bytes, int reps = 30);

// Bytes read per second by a kernel that only reads `bytes` (16-byte loads, a reduction), in GB/s:
// the ceiling of a decode kernel, which reads K/V and writes almost nothing.
double read_bandwidth_gbps(size_t bytes, int reps = 30);

// Per-call time of an empty kernel launched `calls_per_graph` times per graph, as the decode calls
// are timed: the fixed cost every kernel of a call pays, the latency floor's other half.
double empty_kernel_us(int calls_per_graph, int reps = 50);

}  // namespace kvq
