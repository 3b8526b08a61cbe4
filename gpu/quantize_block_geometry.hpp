// Where the block formats' quantize kernel (gpu/quantize_blocks.cu) finds block g of a [B, H, T, D]
// tensor. Host and device code, so that the CPU tests check the division-free form against the
// divisions (tests/test_gpu_quantize_plan.cpp).
#pragma once

#include <cstdint>

#include "gpu/invariant_divisor.hpp"
#include "quant/groups.hpp"

namespace kvq {

// Where block g lies: its (b, h, t) row and its first element along D.
struct BlockAt {
  int64_t b, h, t, row, d0;
};

// The divisors that place a block, fixed at launch: when every block index fits 31 bits, block_at
// takes a wide multiply and a shift for each instead of a 64-bit division (a call of ~25-70
// instructions; three a block were a large share of the FP4 kernels' instructions).
struct BlockGeometry {
  int64_t per_row = 1;  // blocks in a (b, h, t) row
  bool narrow = false;  // rows * per_row < 2^31
  InvariantDivisor by_per_row, by_tokens, by_heads;
};

inline BlockGeometry block_geometry(const KvShape& s, int elems) {
  BlockGeometry geo;
  geo.per_row = s.head_dim / elems;
  geo.narrow = geo.per_row > 0 && s.tokens > 0 && s.heads > 0 && s.rows() * geo.per_row < (int64_t{1} << 31);
  if (geo.narrow) {
    geo.by_per_row = make_invariant_divisor(geo.per_row);
    geo.by_tokens = make_invariant_divisor(s.tokens);
    geo.by_heads = make_invariant_divisor(s.heads);
  }
  return geo;
}

// Block g counted in [B, H, T] row order (the input's), or with token_major in [B, T, H] order (FBGEMM
// rows': a warp's stores then lie together). `row` is the block's [B, H, T] row either way.
KVQ_HD BlockAt block_at(const KvShape& s, int64_t g, const BlockGeometry& geo, int elems, bool token_major = false) {
  if (token_major) {  // q counts [B, T, H] rows
    if (geo.narrow) {
      const uint32_t n = static_cast<uint32_t>(g), q = geo.by_per_row.divide(n), bt = geo.by_heads.divide(q);
      const uint32_t b = geo.by_tokens.divide(bt), h = q - bt * uint32_t(s.heads), t = bt - b * uint32_t(s.tokens);
      return {b, h, t, (int64_t(b) * s.heads + h) * s.tokens + t, int64_t(n - q * uint32_t(geo.per_row)) * elems};
    }
    const int64_t q = g / geo.per_row, b = q / (s.tokens * s.heads), h = q % s.heads, t = (q / s.heads) % s.tokens;
    return {b, h, t, (b * s.heads + h) * s.tokens + t, (g % geo.per_row) * elems};
  }
  if (geo.narrow) {
    const uint32_t n = static_cast<uint32_t>(g), r = geo.by_per_row.divide(n), bh = geo.by_tokens.divide(r);
    const uint32_t b = geo.by_heads.divide(bh);
    return {b, bh - b * uint32_t(s.heads), r - bh * uint32_t(s.tokens), r, int64_t(n - r * uint32_t(geo.per_row)) * elems};
  }
  const int64_t r = g / geo.per_row;
  return {r / (s.tokens * s.heads), (r / s.tokens) % s.heads, r % s.tokens, r, (g % geo.per_row) * elems};
}

}  // namespace kvq
