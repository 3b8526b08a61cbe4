// Tensor-core decode kernels with K stored as int8 (every V storage); the kernel is in
// decode_tc_kernel.cuh, its dispatch in decode_tc_launch.cuh. One file per K storage.
#include "gpu/decode_tc_launch.cuh"

namespace kvq::detail {
template TcEntry tc_entry_for_v<KvFormat::kInt8>(KvFormat v);
}  // namespace kvq::detail
