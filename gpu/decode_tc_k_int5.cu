// Tensor-core decode kernels with K stored as 5-bit codes (q5_0, q5_1) (every V storage but FP8);
// the template is in decode_tc_kernel.cuh. One file per K storage so that the kernels compile in parallel.
#include "gpu/decode_tc_kernel.cuh"

namespace kvq::detail {
template TcEntry tc_entry_for_v<KvFormat::kInt5>(KvFormat v);
}  // namespace kvq::detail
