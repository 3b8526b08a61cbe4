// Tensor-core decode kernels for the bf16 storage format(s); the template is in decode_tc_kernel.cuh.
#include "gpu/decode_tc_kernel.cuh"

namespace kvq::detail {
template struct DecodeTcKernels<KvFormat::kBf16>;
template struct DecodeTcKernels<KvFormat::kFp16>;
}  // namespace kvq::detail
