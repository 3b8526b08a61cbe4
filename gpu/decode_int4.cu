// Decode kernels for the int4 storage format(s); the template is in decode_kernel.cuh.
#include "gpu/decode_kernel.cuh"

namespace kvq::detail {
template struct DecodeFormatKernels<KvFormat::kInt4>;
template struct DecodeFormatKernels<KvFormat::kInt4Fbgemm>;
}  // namespace kvq::detail
