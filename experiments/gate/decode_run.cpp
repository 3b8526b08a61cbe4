#include "experiments/gate/decode_run.hpp"

#include <cmath>

#include "quant/float_formats.hpp"
#include "reference/attention.hpp"

namespace kvq {

DecodeRun::DecodeRun(const DecodeShape& shape, const std::vector<float>& q, const std::vector<int32_t>& seq_lens,
                     bool alibi, double softmax_scale)
    : shape_(shape), seq_lens_host_(seq_lens), q_(static_cast<size_t>(shape.batch * shape.q_heads * shape.head_dim)),
      out_(q_.size()), seq_lens_(seq_lens), lse_(static_cast<size_t>(shape.batch * shape.q_heads)) {
  std::vector<uint16_t> bits(q.size());
  for (size_t i = 0; i < q.size(); ++i) bits[i] = fp32_to_bf16_bits(q[i]);
  q_.upload(bits);
  base_.batch = shape.batch, base_.q_heads = shape.q_heads, base_.kv_heads = shape.kv_heads;
  base_.tokens = shape.tokens, base_.head_dim = static_cast<int>(shape.head_dim);
  base_.q = q_.data(), base_.out = out_.data(), base_.lse = lse_.data();
  base_.seq_lens = seq_lens.empty() ? nullptr : seq_lens_.data();
  base_.softmax_scale = static_cast<float>(softmax_scale > 0 ? softmax_scale
                                                             : 1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
  if (alibi) {
    std::vector<float> slopes;
    for (double m : alibi_slopes(shape.q_heads)) slopes.push_back(static_cast<float>(m));
    slopes_ = DeviceBuffer<float>(slopes);
    base_.alibi_slopes = slopes_.data();
  }
}

void DecodeRun::set_cache(KvFormat k_format, const KvOperand& k, KvFormat v_format, const KvOperand& v) {
  base_.k_format = k_format, base_.v_format = v_format, base_.k = k, base_.v = v;
}

void DecodeRun::set_windows(const KvWindow& k, const KvWindow& v) { base_.k_window = k, base_.v_window = v; }

void DecodeRun::set_pages(const int32_t* block_table, int64_t table_stride, int page_tokens) {
  base_.block_table = block_table, base_.table_stride = table_stride, base_.page_tokens = page_tokens;
}

void DecodeRun::set_window_pages(const int32_t* window_block_table) { base_.window_block_table = window_block_table; }

DecodeParams DecodeRun::plan(const DecodeVariant& variant, int sm_count, int forced_splits) {
  DecodeParams p = variant.plan(base_, sm_count, forced_splits);
  if (static_cast<int64_t>(partial_o_.size()) < partial_o_floats(p)) partial_o_ = DeviceBuffer<float>(partial_o_floats(p));
  if (static_cast<int64_t>(partial_lse_.size()) < partial_lse_floats(p))
    partial_lse_ = DeviceBuffer<float>(partial_lse_floats(p));
  p.partial_o = partial_o_.data(), p.partial_lse = partial_lse_.data();
  return p;
}

void DecodeRun::run(const DecodeParams& planned) {
  out_.fill_bytes(0xff);  // bf16 NaN
  lse_.fill_bytes(0xff);
  launch_decode(planned, nullptr);
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
}

std::vector<float> DecodeRun::output() const {
  std::vector<float> out;
  for (uint16_t b : out_.download()) out.push_back(bf16_bits_to_fp32(b));
  return out;
}

std::vector<float> DecodeRun::lse() const { return lse_.download(); }

}  // namespace kvq
