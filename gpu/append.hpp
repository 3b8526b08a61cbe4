// Quantize-on-append's last step on the GPU: the rows of a freshly quantized chunk of new tokens
// (planar codes [B, H, t, row bytes], parameters in group order) written into a cache at each
// sequence's own positions: a contiguous planar cache, or a paged one through its block table. One
// launch for codes, scales and zero points, in place of the index arithmetic and copies of a torch
// scatter; the bytes are the quantizer's, moved unchanged.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "quant/scheme.hpp"

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

// chan-t<N>[+wW] appends: a token group is quantized once its N tokens are in and the window (W >= 0;
// a plain chan-t<N> cache is read as +w0) has passed them, as kvq.AppendQuantizer does. Until then
// the tokens wait raw in the window store. After each call's rows are written (append_rows), this
// quantizes every group that the call completes, from the window store's bf16 values, into the codes
// and per-channel parameters. The grid is fixed by the call's shape (a CUDA graph can hold it): per
// (b, h) at most ceil(t / N) + 1 groups complete, and one more block per (b, h) checks the new tokens
// for non-finite values.
struct ChannelFlushParams {
  Scheme scheme;  // chan-t<N> with its window (+w0 for a plain chan-t<N> cache)
  int batch = 0, heads = 0, head_dim = 0, tokens = 0;  // tokens: t new per sequence
  const uint16_t* x = nullptr;  // the new tokens, bf16 [B, H, t, D] contiguous (checked for finiteness)
  const int32_t* positions = nullptr;  // [B]: the call's first slot per sequence
  int64_t capacity = 0;                // slots per sequence
  // Paged caches: codes and parameters through block_table, raw tokens through window_table (one
  // stride, entries per sequence); nullptr: contiguous caches.
  const int32_t *block_table = nullptr, *window_table = nullptr;
  int64_t table_stride = 0, pages = 0, window_pages = 0;
  int page_tokens = 0;
  // Raw token (b, h, slot) at raw + b*stride_b (paged: page*stride_page) + h*stride_h + slot*stride_t
  // (paged: slot % P), in elements; codes alike in bytes; parameters (planar per channel) at
  // params + b*stride_b (page) + h*stride_h + group*stride_group + d, in elements, group counted from
  // the sequence's (page's) first token.
  struct Strides {
    int64_t b = 0, h = 0, t = 0, page = 0;
  };
  const uint16_t* raw = nullptr;
  Strides raw_strides;
  uint8_t* codes = nullptr;
  Strides code_strides;
  void *scales = nullptr, *zeros = nullptr;
  Strides param_strides;  // t: one token group's stride
  // [3] as kvq.gpu.new_status: first non-finite new element, first overflowing group, first token
  // whose group lay outside the cache (b * t + i)
  unsigned long long* status = nullptr;
};

void launch_flush_channel_groups(const ChannelFlushParams& p, cudaStream_t stream);

}  // namespace kvq
