#include "gpu/append.hpp"
#include "gpu/cuda_check.hpp"

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

}  // namespace

void launch_append_rows(const AppendParams& p, cudaStream_t stream) {
  const int rows = p.batch * p.tokens;
  if (rows == 0) return;
  constexpr int kThreads = 128;
  const int blocks = (rows * 32 + kThreads - 1) / kThreads;
  append_rows_kernel<<<blocks, kThreads, 0, stream>>>(p);
  KVQ_CHECK_LAUNCH();
}

}  // namespace kvq
