// Tensor-core decode kernels with K stored as 4-bit table indices (iq4_nl, mxfp4, nvfp4) (every V storage but FP8);
// the kernel is in decode_tc_kernel.cuh, its dispatch in decode_tc_launch.cuh. One file per K storage.
#include "gpu/decode_tc_launch.cuh"

namespace kvq::detail {
template TcEntry tc_entry_for_v<KvFormat::kLut4>(KvFormat v);
}  // namespace kvq::detail
