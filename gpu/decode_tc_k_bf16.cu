// Tensor-core decode kernels with K stored as bf16 (every V storage); the kernel is in
// decode_tc_kernel.cuh, its dispatch in decode_tc_launch.cuh. One file per K storage.
#include "gpu/decode_tc_launch.cuh"

namespace kvq::detail {
template TcEntry tc_entry_for_v<KvFormat::kBf16>(KvFormat v);
}  // namespace kvq::detail
