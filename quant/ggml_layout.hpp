// ggml's inline block layout of the block formats: each (b, t, h) row of D elements is D/32 block
// structs as a llama.cpp K (or V) cache row holds them, rows ordered [B, T, H] as in the cache
// tensor [kv_size][n_head_kv * D] (ggml/src/ggml-common.h):
//   block_q8_0   fp16 d, int8 qs[32]                           34 B per 32
//   block_q4_0   fp16 d, qs[16]                                18 B
//   block_q4_1   fp16 d, fp16 m, qs[16]                        20 B
//   block_q5_0   fp16 d, qh[4], qs[16]                         22 B
//   block_q5_1   fp16 d, fp16 m, qh[4], qs[16]                 24 B
//   block_iq4_nl fp16 d, qs[16]                                18 B
//   block_mxfp4  e8m0 e, qs[16]                                17 B
//   block_nvfp4  4 x e4m3 d (one per 16), qs[32]               36 B per 64 (D a multiple of 64)
// Nibbles pair element j with element j + 16 (nvfp4: j + 8 within each 16) in byte j, low first; qh
// holds the fifth bits, element j at bit j of a little-endian uint32. nvfp4's per-tensor scale is
// not in ggml's block: it travels beside the bytes. Converting to and from kvq's planar layout is
// lossless, byte for byte.
#pragma once

#include "quant/kv_tensor.hpp"

namespace kvq {

struct GgmlRows {
  Scheme scheme;
  KvShape shape;               // logical [B, H, T, D]
  int64_t row_bytes = 0;       // D / ggml_block_elements * ggml_block_bytes
  std::vector<uint8_t> bytes;  // [B, T, H, row_bytes]
  float tensor_scale = 0.0f;   // nvfp4's s_t; 0 otherwise
};

// Elements and bytes of one ggml block struct (nvfp4: 64 and 36), or throws SchemeError for a scheme
// that has no ggml blocks (not a block format, or a +wW window, whose raw tokens blocks cannot hold).
int ggml_block_elements(const Scheme& scheme);
int ggml_block_bytes(const Scheme& scheme);
// Also checks that the block divides head_dim.
int64_t ggml_row_bytes(const Scheme& scheme, int64_t head_dim);

GgmlRows to_ggml(const QuantizedKv& planar);
// Throws InputError for a byte count that does not fit the shape, and for a stored scale or min that
// is not finite (or an e4m3 scale with its sign bit set), naming the block.
QuantizedKv from_ggml(const GgmlRows& rows);

}  // namespace kvq
