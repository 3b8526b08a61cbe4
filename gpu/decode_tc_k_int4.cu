// Tensor-core decode kernels with K stored as int4 (every V storage); the template is in
// decode_tc_kernel.cuh. One file per K storage so that the kernels compile in parallel.
#include "gpu/decode_tc_kernel.cuh"

namespace kvq::detail {
template TcEntry tc_entry_for_v<KvFormat::kInt4>(KvFormat v);
}  // namespace kvq::detail
