// Built without CUDA: the sweep has no latency columns.
#include "experiments/sweep/sweep_latency.hpp"

namespace kvq {

void attach_decode_latency(std::vector<SweepRow>&, const std::string&) {}

}  // namespace kvq
