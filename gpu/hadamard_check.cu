// quant/hadamard.hpp compiled for the device: one thread per row, the same fp32 butterflies and
// norm as on the host (kvq_gpu builds with --fmad=false, so nothing is contracted).
#include "gpu/device.hpp"
#include "gpu/hadamard_check.hpp"
#include "quant/hadamard.hpp"

namespace kvq {
namespace {

__global__ void hadamard_rows_kernel(float* rows, int64_t n_rows, int64_t head_dim) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < n_rows; r += int64_t(gridDim.x) * blockDim.x)
    hadamard_rotate(rows + r * head_dim, head_dim);
}

}  // namespace

std::vector<float> hadamard_rotate_on_device(const std::vector<float>& rows, int64_t head_dim) {
  require_device();
  if (!is_power_of_two(head_dim) || rows.size() % static_cast<size_t>(head_dim) != 0)
    throw InputError("hadamard_rotate_on_device: head_dim must be a power of two dividing the row data");
  DeviceBuffer<float> buf(rows);
  const int64_t n_rows = static_cast<int64_t>(rows.size()) / head_dim;
  if (n_rows > 0) {
    hadamard_rows_kernel<<<static_cast<int>((n_rows + 127) / 128), 128>>>(buf.data(), n_rows, head_dim);
    KVQ_CHECK_LAUNCH();
  }
  return buf.download();
}

}  // namespace kvq
