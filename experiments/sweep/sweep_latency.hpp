// kvq sweep's latency columns: with a GPU, each scheme pair's decode time (the default decode
// variant, gpu/registry.cpp) at a reference decode shape. Built as a no-op without CUDA.
#pragma once

#include <string>
#include <vector>

#include "experiments/sweep/sweep.hpp"

namespace kvq {

// Fills row.latency for every pair a decode kernel reads, at `shape` ("seed000:128" = the bench
// shape named seed000 with B=128; see experiments/bench/bench_shapes.hpp). Without a CUDA build or a
// device it leaves the rows as they are (the CSV then has no latency columns).
void attach_decode_latency(std::vector<SweepRow>& rows, const std::string& shape);

}  // namespace kvq
