#include "gpu/append.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/quantize_common.cuh"

namespace kvq {
namespace {

// One warp per new token (b, i): it finds the token's slot (and page) once, then copies every head's
// row of each array, a word per lane where the row allows it.
__global__ void append_rows_kernel(AppendParams p) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= p.batch * p.tokens) return;
  const int b = warp / p.tokens, i = warp % p.tokens;
  const int64_t slot = static_cast<int64_t>(p.positions[b]) + i;
  int64_t page = 0;
  bool ok = slot >= 0 && slot < p.capacity;
  if (ok && p.block_table) {
    page = p.block_table[b * p.table_stride + slot / p.page_tokens];
    ok = page >= 0 && page < p.pages;
  }
  if (!ok) {
    if (lane == 0) atomicMin(p.out_of_range, static_cast<unsigned long long>(warp));
    return;
  }
  const int64_t row_in_page = p.block_table ? slot % p.page_tokens : slot;
  for (const AppendArray& a : p.arrays) {
    if (a.row_bytes == 0) continue;
    const int64_t base = p.block_table ? page * a.stride_page : b * a.stride_b;
    for (int h = 0; h < a.heads; ++h) {
      const uint8_t* src = a.src + ((static_cast<int64_t>(b) * a.heads + h) * p.tokens + i) * a.row_bytes;
      uint8_t* dst = a.dst + base + h * a.stride_h + row_in_page * a.stride_t;
      if (a.row_bytes % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 4 == 0) {
        for (int w = lane; w < a.row_bytes / 4; w += 32)
          reinterpret_cast<uint32_t*>(dst)[w] = reinterpret_cast<const uint32_t*>(src)[w];
      } else {
        for (int e = lane; e < a.row_bytes; e += 32) dst[e] = src[e];
      }
    }
  }
}

// Block (b * H + h, j): the j-th token group that this call completes in sequence b, KV head h;
// each thread two neighbouring channels (a code byte of 4-bit rows). The last j checks x instead.
__global__ void flush_channel_groups_kernel(ChannelFlushParams p) {
  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const int D = p.head_dim;
  if (blockIdx.y == gridDim.y - 1) {  // the new tokens of (b, h): finite, as quantize would require
    const int64_t first = (static_cast<int64_t>(b) * p.heads + h) * p.tokens * D;
    unsigned long long bad = detail::kNoIndex;
    for (int64_t e = threadIdx.x; e < static_cast<int64_t>(p.tokens) * D; e += blockDim.x)
      if (!is_finite_float(bf16_bits_to_fp32(p.x[first + e]))) bad = min(bad, static_cast<unsigned long long>(first + e));
    if (bad != detail::kNoIndex) atomicMin(p.status, bad);
    return;
  }
  const int N = p.scheme.group;
  const int64_t start = p.positions[b], end = start + p.tokens;
  // groups [q0 / N, q1 / N) are quantized by this call (quantized_length: whole groups W behind the end)
  const int64_t q0 = quantized_length(p.scheme, start > 0 ? start : 0, 0), q1 = quantized_length(p.scheme, end, 0);
  const int64_t g = q0 / N + blockIdx.y, slot0 = g * N;
  if (start < 0 || slot0 + N > q1) return;
  const bool paged = p.block_table != nullptr;
  int64_t code_base = b * p.code_strides.b, raw_base = b * p.raw_strides.b, param_base = b * p.param_strides.b;
  int64_t in_seq = slot0, group = g;  // the group's first slot and index in its sequence (paged: its page)
  bool ok = slot0 + N <= p.capacity;
  if (ok && paged) {
    const int64_t index = slot0 / p.page_tokens;  // N divides P: the group lies in one page
    const int64_t page = p.block_table[b * p.table_stride + index], wpage = p.window_table[b * p.table_stride + index];
    ok = page >= 0 && page < p.pages && wpage >= 0 && wpage < p.window_pages;
    code_base = page * p.code_strides.page, param_base = page * p.param_strides.page, raw_base = wpage * p.raw_strides.page;
    in_seq = slot0 % p.page_tokens, group = in_seq / N;
  }
  if (!ok) {  // the group's last token is this call's token slot0 + N - 1 - start
    if (threadIdx.x == 0) atomicMin(p.status + 2, static_cast<unsigned long long>(b * p.tokens + slot0 + N - 1 - start));
    return;
  }
  const uint16_t* raw = p.raw + raw_base + h * p.raw_strides.h + in_seq * p.raw_strides.t;
  uint8_t* codes = p.codes + code_base + h * p.code_strides.h + in_seq * p.code_strides.t;
  const int64_t param0 = param_base + h * p.param_strides.h + group * p.param_strides.t;
  const Scheme& s = p.scheme;
  for (int pair = threadIdx.x; 2 * pair < D; pair += blockDim.x) {
    const int d = 2 * pair, lanes = d + 1 < D ? 2 : 1;
    GroupParams gp[2];
    for (int c = 0; c < lanes; ++c) {  // the codec's statistics, parameters and stored values
      GroupStats st;
      for (int n = 0; n < N; ++n) st.add(bf16_bits_to_fp32(raw[n * p.raw_strides.t + d + c]));
      const GroupParams fresh = group_params(st, s);
      if (fresh.overflow)  // the cache's chan-t<N> group order: [B, H, groups, D]
        atomicMin(p.status + 1, static_cast<unsigned long long>(((b * p.heads + h) * ((p.capacity + N - 1) / N) + g) * D + d + c));
      detail::store_param(p.scales, param0 + d + c, fresh.scale, s.scale_dtype);
      if (s.asymmetric) detail::store_param(p.zeros, param0 + d + c, fresh.zero, s.scale_dtype);
      gp[c] = stored_params(detail::load_param(p.scales, param0 + d + c, s.scale_dtype),
                            s.asymmetric ? detail::load_param(p.zeros, param0 + d + c, s.scale_dtype) : 0.0f);
    }
    for (int n = 0; n < N; ++n) {
      const int code0 = encode(bf16_bits_to_fp32(raw[n * p.raw_strides.t + d]), gp[0], s);
      const int code1 = lanes == 2 ? encode(bf16_bits_to_fp32(raw[n * p.raw_strides.t + d + 1]), gp[1], s) : 0;
      uint8_t* row = codes + n * p.code_strides.t;
      if (s.bits == 8) {
        row[d] = code_to_byte(code0);
        if (lanes == 2) row[d + 1] = code_to_byte(code1);
      } else {
        row[pair] = pack_nibbles(code0, code1);
      }
    }
  }
}

}  // namespace

void launch_flush_channel_groups(const ChannelFlushParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.heads == 0 || p.tokens == 0) return;
  const int groups = (p.tokens + p.scheme.group - 1) / p.scheme.group + 1;
  const dim3 grid(static_cast<unsigned>(p.batch * p.heads), static_cast<unsigned>(groups + 1));
  flush_channel_groups_kernel<<<grid, 128, 0, stream>>>(p);
  KVQ_CHECK_LAUNCH();
}

void launch_append_rows(const AppendParams& p, cudaStream_t stream) {
  const int rows = p.batch * p.tokens;
  if (rows == 0) return;
  constexpr int kThreads = 128;
  const int blocks = (rows * 32 + kThreads - 1) / kThreads;
  append_rows_kernel<<<blocks, kThreads, 0, stream>>>(p);
  KVQ_CHECK_LAUNCH();
}

}  // namespace kvq
