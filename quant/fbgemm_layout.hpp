// FBGEMM's inline-row int4 KV layout (seed int4_gqa_cuda_optimizations, Opt 6): rows ordered
// [B, T, H] (BSNH), each row = n x (fp16 scale, fp16 shift) then D/2 bytes of packed codes, for
// n = 1 (int4-head-asym) or n = D/G groups in {1, 2, 4, 8}. D=128: 68 B row-wise, 80 B with 4 groups.
// Converting to and from the planar layout is lossless.
#pragma once

#include "quant/kv_tensor.hpp"

namespace kvq {

struct FbgemmRows {
  Scheme scheme;
  KvShape shape;               // logical [B, H, T, D]
  int64_t row_bytes = 0;       // D/2 + 4n
  std::vector<uint8_t> bytes;  // [B, T, H, row_bytes]
};

// Scale groups per row (n), or throws SchemeError saying why the scheme has no FBGEMM layout.
int fbgemm_groups_per_row(const Scheme& scheme, int64_t head_dim);
int64_t fbgemm_row_bytes(const Scheme& scheme, int64_t head_dim);

FbgemmRows to_fbgemm(const QuantizedKv& planar);
QuantizedKv from_fbgemm(const FbgemmRows& rows);

// Quantize straight into, and dequantize straight from, the inline-row layout.
FbgemmRows quantize_fbgemm(const KvView& x, const Scheme& scheme, const std::string& tensor_name);
std::vector<float> dequantize(const FbgemmRows& rows);

}  // namespace kvq
