// Quantize-on-append's last step on the GPU: the rows of a freshly quantized chunk of new tokens
// (planar codes [B, H, t, row bytes], parameters in group order) written into a cache at each
// sequence's own positions: a contiguous planar cache, or a paged one through its block table. One
// launch for codes, scales and zero points, in place of the index arithmetic and copies of a torch
// scatter; the bytes are the quantizer's, moved unchanged.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvq {

// One array of the cache (codes, scales or zero points): element (b, h, slot) starts at
//   contiguous: data + b*stride_b + h*stride_h + slot*stride_t
//   paged:      data + page*stride_page + h*stride_h + (slot % P)*stride_t, page = table[b][slot / P]
// and holds row_bytes bytes; the chunk's (b, h, i) row at src + ((b*heads + h)*tokens + i)*row_bytes.
struct AppendArray {
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  int64_t stride_b = 0, stride_h = 0, stride_t = 0, stride_page = 0;  // bytes
  int heads = 0;      // H, or 1 for per-token parameters
  int row_bytes = 0;  // 0: the array is absent
};

struct AppendParams {
  AppendArray arrays[3];  // codes, scales, zero points
  int batch = 0, tokens = 0;              // B and t (new tokens per sequence)
  const int32_t* positions = nullptr;     // [B]: sequence b's new tokens go to slots positions[b] + i
  int64_t capacity = 0;                   // slots per sequence (T, or table_stride * P)
  const int32_t* block_table = nullptr;   // [B, table_stride]; nullptr: a contiguous cache
  int64_t table_stride = 0, pages = 0;
  int page_tokens = 0;
  // min b * t + i of a row whose slot or page lies outside the cache (that row is not written);
  // ~0 while none
  unsigned long long* out_of_range = nullptr;
};

void launch_append_rows(const AppendParams& p, cudaStream_t stream);

}  // namespace kvq
