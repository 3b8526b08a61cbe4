// Decode kernels for the int8 storage format(s); the template is in decode_kernel.cuh.
#include "gpu/decode_kernel.cuh"

namespace kvq::detail {
template struct DecodeFormatKernels<KvFormat::kInt8>;
}  // namespace kvq::detail
