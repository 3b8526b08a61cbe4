// One decode problem on the device: Q, sequence lengths, ALiBi slopes, outputs and split-K
// partials around a K/V cache that the caller placed on the device (raw or quantized). Shared by
// the gate (kvq validate), the benchmark (kvq bench) and the sweep's latency columns.
#pragma once

#include <cstdint>
#include <vector>

#include "experiments/common/decode_shapes.hpp"
#include "gpu/device.hpp"
#include "gpu/registry.hpp"

namespace kvq {

class DecodeRun {
 public:
  // q: [B, Hq, D] values (rounded to bf16 here); seq_lens empty = all T; softmax_scale 0 = 1/sqrt(D).
  DecodeRun(const DecodeShape& shape, const std::vector<float>& q, const std::vector<int32_t>& seq_lens, bool alibi,
            double softmax_scale = 0.0);
  // K/V operands (device memory owned by the caller) and their storage kind.
  void set_cache(KvFormat k_format, const KvOperand& k, KvFormat v_format, const KvOperand& v);
  // +wW: where the raw tokens of K and V are (no window: a default KvWindow).
  void set_windows(const KvWindow& k, const KvWindow& v);
  // A paged cache: the block table [B, table_stride] on the device (owned by the caller), P tokens a page.
  void set_pages(const int32_t* block_table, int64_t table_stride, int page_tokens);
  // Paged +wW windows: their raw tokens' table (DecodeParams::window_block_table), same stride.
  void set_window_pages(const int32_t* window_block_table);
  // The launch shape `variant` picks here (forced_splits > 0: that many, split-K variants only);
  // allocates the partials it needs.
  DecodeParams plan(const DecodeVariant& variant, int sm_count, int forced_splits = 0);
  // Poisons O and LSE (so an unwritten value shows), launches, waits.
  void run(const DecodeParams& planned);
  std::vector<float> output() const;  // [B, Hq, D] as floats (exact bf16 values)
  std::vector<float> lse() const;     // [B, Hq]
  const DecodeShape& shape() const { return shape_; }
  const std::vector<int32_t>& seq_lens() const { return seq_lens_host_; }

 private:
  DecodeShape shape_;
  DecodeParams base_;
  std::vector<int32_t> seq_lens_host_;
  DeviceBuffer<uint16_t> q_, out_;
  DeviceBuffer<int32_t> seq_lens_;
  DeviceBuffer<float> slopes_, lse_, partial_o_, partial_lse_;
};

}  // namespace kvq
