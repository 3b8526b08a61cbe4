// The +had rotation run on the device, for the check that it is bit-identical to the host's.
#pragma once

#include <cstdint>
#include <vector>

namespace kvq {

// Rows of `head_dim` values (a power of two), each rotated by hadamard_rotate in a device thread.
std::vector<float> hadamard_rotate_on_device(const std::vector<float>& rows, int64_t head_dim);

}  // namespace kvq
