// Launch plans of the wide-group quantize variants (quantize-tokenteam, quantize-tensor2pass): which
// lane reads which 8-element chunk, and where its input and codes are. Host and device code, so the
// CPU tests check the index arithmetic (every chunk exactly once, at the right input and code
// offsets) on machines without a GPU.
#pragma once

#include "gpu/invariant_divisor.hpp"
#include "gpu/quantize.hpp"
#include "quant/groups.hpp"

namespace kvq {

inline constexpr int kWideChunk = 8;  // elements per chunk: one 16-byte load of 16-bit input

// ---- per-token --------------------------------------------------------------------------------
// Token (b, t) holds S = Hkv D / 8 chunks; chunk c is head c / (D/8), elements 8 (c % (D/8)) ..+8.
// A team of L = 2^lanes_log2 lanes owns a token; lane j takes chunks j, j + L, j + 2L, ...
struct TokenPlan {
  int64_t tokens = 0;        // B * T: the groups
  int chunks_per_token = 0;  // S
  int chunks_per_row = 0;    // D / 8
  InvariantDivisor by_row;    // c / (D / 8): a chunk's head
  InvariantDivisor by_tokens; // token / T: a token's batch entry, when narrow
  int lanes_log2 = 0;        // team size L = 1 << lanes_log2, 1..32
  int cached = 4;            // K: chunks a lane keeps in registers (4, or 8 for large 16-bit tokens)
  bool narrow = false;       // B * T < 2^31: (b, t) by by_tokens
};

// Whether every 8-element chunk of the input starts on 16 bytes (D is a multiple of 8): the base
// and every stride. Strided views that are not take the kernels' element-by-element loads.
inline bool wide_chunks_aligned(const QuantizeParams& p) {
  const int64_t per16 = p.in_dtype == InputDtype::kFp32 ? 4 : 8;  // elements in 16 bytes
  return reinterpret_cast<uintptr_t>(p.input) % 16 == 0 && p.stride_b % per16 == 0 && p.stride_h % per16 == 0 &&
         p.stride_t % per16 == 0;
}

// K = 4 chunks a lane (64 bytes of 16-bit input in flight) when a warp holds the token that way;
// larger tokens of 16-bit input take K = 8 (fp32 chunks are twice the registers: K = 8 would
// spill), and the chunks beyond 32 K are read twice. Unaligned input (`aligned` false: rare) keeps
// K = 4, which serves every token size, so that it needs no K = 8 kernels of its own. L is the
// smallest team with at most K chunks a lane, so every lane has K loads in flight whatever Hkv is.
inline TokenPlan make_token_plan(const KvShape& s, InputDtype dt, bool aligned = true) {
  TokenPlan plan;
  plan.tokens = s.batch * s.tokens;
  plan.chunks_per_row = static_cast<int>(s.head_dim / kWideChunk);
  plan.chunks_per_token = static_cast<int>(s.heads * plan.chunks_per_row);
  if (plan.chunks_per_row > 0) plan.by_row = make_invariant_divisor(plan.chunks_per_row);
  plan.narrow = plan.tokens < (int64_t{1} << 31);
  if (plan.narrow && s.tokens > 0) plan.by_tokens = make_invariant_divisor(s.tokens);
  plan.cached = plan.chunks_per_token <= 32 * 4 || dt == InputDtype::kFp32 || !aligned ? 4 : 8;
  const int64_t lanes = ceil_div(plan.chunks_per_token, plan.cached);
  while (plan.lanes_log2 < 5 && (int64_t{1} << plan.lanes_log2) < lanes) ++plan.lanes_log2;
  return plan;
}

// How many chunks lane j of a team owns.
KVQ_HD int token_lane_chunks(const TokenPlan& plan, int j) {
  const int L = 1 << plan.lanes_log2, S = plan.chunks_per_token;
  return j < S ? (S - j + L - 1) >> plan.lanes_log2 : 0;
}

struct ChunkPos {
  int h, d0;  // head, first element along D
};

// The k-th chunk of lane j.
KVQ_HD ChunkPos token_chunk(const TokenPlan& plan, int j, int k) {
  const int c = j + (k << plan.lanes_log2);
  const int h = static_cast<int>(plan.by_row.divide(static_cast<uint32_t>(c)));  // c < 2^30 (launch check)
  return {h, (c - h * plan.chunks_per_row) * kWideChunk};
}

// Where a lane's teams are: the grid walks the tokens in steps of all its teams; the loop runs on
// the warp's first team (warp_first), so that all 32 lanes reach every shuffle, and the lane's own
// token is warp_first + team_in_warp. `thread` is the global thread index, `threads` the grid's.
struct TeamWalk {
  int64_t warp_first = 0, stride = 0;
  int team_in_warp = 0, j = 0;  // j: the lane's rank in its team
};

KVQ_HD TeamWalk token_walk(const TokenPlan& plan, int64_t thread, int64_t threads) {
  const int lane = static_cast<int>(thread & 31);
  TeamWalk w;
  w.warp_first = (thread - lane) >> plan.lanes_log2;
  w.stride = threads >> plan.lanes_log2;
  w.team_in_warp = lane >> plan.lanes_log2;
  w.j = lane & ((1 << plan.lanes_log2) - 1);
  return w;
}

// Flat [B, H, T, D] index of element d0 of head h of token (b, t): the chunk's code index too. In two
// parts, so that a kernel computes the token's once and adds each chunk's (h T D + d0).
KVQ_HD int64_t token_flat_base(const KvShape& s, int64_t b, int64_t t) { return (b * s.heads * s.tokens + t) * s.head_dim; }
KVQ_HD int64_t chunk_flat_offset(const KvShape& s, const ChunkPos& at) { return at.h * s.tokens * s.head_dim + at.d0; }
KVQ_HD int64_t token_flat_index(const KvShape& s, int64_t b, int64_t t, const ChunkPos& at) {
  return token_flat_base(s, b, t) + chunk_flat_offset(s, at);
}

// (b, t) of token `token`.
KVQ_HD void token_coordinates(const TokenPlan& plan, const KvShape& s, int64_t token, int64_t& b, int64_t& t) {
  b = plan.narrow ? int64_t(plan.by_tokens.divide(uint32_t(token))) : token / s.tokens;
  t = token - b * s.tokens;
}

// ---- per-tensor -------------------------------------------------------------------------------
// Chunks in logical [B, H, T, D] order: chunk c holds flat elements 8c .. 8c+7, and its codes start
// at byte c * bits of the planar code array.
struct TensorPlan {
  int64_t chunks = 0;       // numel / 8
  int chunks_per_row = 0;   // D / 8
  bool contiguous = false;  // BNSH without gaps: chunk c starts at input element 8c
  int partials = 0;         // pass 1 blocks, each writing p.partials[block]
};

inline TensorPlan make_tensor_plan(const QuantizeParams& p) {
  const KvShape& s = p.shape;
  TensorPlan plan;
  plan.chunks = s.numel() / kWideChunk;
  plan.chunks_per_row = static_cast<int>(s.head_dim / kWideChunk);
  plan.contiguous = p.stride_t == s.head_dim && p.stride_h == s.tokens * s.head_dim &&
                    p.stride_b == s.heads * s.tokens * s.head_dim;
  return plan;
}

// Input element offset of chunk c.
KVQ_HD int64_t tensor_chunk_offset(const QuantizeParams& p, const TensorPlan& plan, int64_t c) {
  if (plan.contiguous) return c * kWideChunk;
  const KvShape& s = p.shape;
  const int64_t r = c / plan.chunks_per_row, d0 = (c - r * plan.chunks_per_row) * kWideChunk;
  const int64_t t = r % s.tokens, bh = r / s.tokens;
  return (bh / s.heads) * p.stride_b + (bh % s.heads) * p.stride_h + t * p.stride_t + d0;
}

}  // namespace kvq
