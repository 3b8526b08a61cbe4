// Tensor-core decode kernels for the int4 storage format(s); the template is in decode_tc_kernel.cuh.
#include "gpu/decode_tc_kernel.cuh"

namespace kvq::detail {
template struct DecodeTcKernels<KvFormat::kInt4>;
template struct DecodeTcKernels<KvFormat::kInt4Fbgemm>;
}  // namespace kvq::detail
