// Decode kernels for the bf16 storage format(s); the template is in decode_kernel.cuh.
#include "gpu/decode_kernel.cuh"

namespace kvq::detail {
template struct DecodeFormatKernels<KvFormat::kBf16>;
template struct DecodeFormatKernels<KvFormat::kFp16>;
}  // namespace kvq::detail
