#include "experiments/gate/decode_gate_case.hpp"

#include <cstring>
#include <random>

#include "experiments/gate/validate_quantize.hpp"
#include "quant/fbgemm_layout.hpp"
#include "quant/float_formats.hpp"
#include "quant/groups.hpp"
#include "quant/quantize.hpp"

namespace kvq::gate_case {
namespace {

// Rows [B*H, T, row] of `bytes` moved to [B*H, tokens, row + pad]; the rest 0xFF (NaN in bf16 / fp16
// and fp16 scales, garbage codes).
std::vector<uint8_t> place_rows(const std::vector<uint8_t>& bytes, int64_t rows, int64_t T, int64_t row, int64_t tokens,
                                int64_t pad) {
  std::vector<uint8_t> out(static_cast<size_t>(rows * tokens * (row + pad)), 0xFF);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(out.data() + (r * tokens + t) * (row + pad), bytes.data() + (r * T + t) * row, static_cast<size_t>(row));
  return out;
}

void restride(KvOperand& op, int64_t heads, int64_t tokens, int64_t row) {
  op.stride_t = row, op.stride_h = tokens * row, op.stride_b = heads * tokens * row;
}

}  // namespace

int64_t placed_tokens(const Case& c) {
  const DecodeShape& s = c.shape;
  if (c.placement != Placement::kHuge) return s.tokens;
  return kHugeOffset / ((s.batch * s.kv_heads - 1) * s.head_dim) + 2;
}

std::vector<float> random_normal(size_t n, uint32_t seed, int64_t head_dim, float outlier) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = normal(rng) * ((i % head_dim) % 23 == 5 ? outlier : 1.0f);
  return v;
}

int64_t seq_len(const Case& c, int64_t b) { return c.seq_lens.empty() ? c.shape.tokens : c.seq_lens[b]; }

std::vector<int64_t> lengths(const Case& c) {
  std::vector<int64_t> lens;
  for (int64_t b = 0; b < c.shape.batch; ++b) lens.push_back(seq_len(c, b));
  return lens;
}

bool has_window(const Storage& st) {
  return (st.k && st.k->has_window()) || (st.v && st.v->has_window());
}

std::vector<int64_t> first_window_tokens(const Case& c) {
  std::vector<int64_t> out;
  for (int64_t b = 0; b < c.shape.batch; ++b) {
    int64_t first = seq_len(c, b);
    for (const auto& s : {c.storage.k, c.storage.v})
      if (s && s->has_window()) first = std::min(first, quantized_length(*s, seq_len(c, b), c.shape.tokens));
    out.push_back(first);
  }
  return out;
}

DeviceOperand make_operand(const Case& c, std::vector<float> x, const std::optional<Scheme>& scheme, KvFormat format,
                           const Paging* paging, const Paging* window_paging) {
  const DecodeShape& s = c.shape;
  const KvShape kv{s.batch, s.kv_heads, s.tokens, s.head_dim};
  auto padding = [&](int64_t b, int64_t t) { return t >= seq_len(c, b); };
  // where the rows go: the placed token capacity and the gap between rows (Placement)
  const int64_t tokens = placed_tokens(c), pad = c.placement == Placement::kStrided ? kStridePad : 0;
  DeviceOperand out;
  if (!scheme) {
    const bool fp16 = format == KvFormat::kFp16;
    for (float& e : x) e = fp16 ? round_to_fp16(e) : round_to_bf16(e);
    std::vector<uint8_t> bytes(2 * x.size());
    for (int64_t b = 0; b < kv.batch; ++b)
      for (int64_t h = 0; h < kv.heads; ++h)
        for (int64_t t = 0; t < kv.tokens; ++t)
          for (int64_t d = 0; d < kv.head_dim; ++d) {
            const int64_t logical = ((b * kv.heads + h) * kv.tokens + t) * kv.head_dim + d;
            const int64_t stored = c.storage.bsnh ? ((b * kv.tokens + t) * kv.heads + h) * kv.head_dim + d : logical;
            const uint16_t bits = padding(b, t) ? uint16_t{0x7fc1}
                                  : fp16             ? fp32_to_fp16_bits(x[logical])
                                                     : fp32_to_bf16_bits(x[logical]);
            bytes[2 * stored] = bits & 0xff, bytes[2 * stored + 1] = bits >> 8;
            if (padding(b, t)) x[logical] = 0.0f;
          }
    if (paging) {
      bytes = to_pages(bytes, {kv.batch, kv.heads, kv.tokens, 2 * s.head_dim, c.storage.bsnh, false}, *paging, 0xFF);
      out.codes = DeviceBuffer<uint8_t>(bytes);
      out.op = paged_operand(raw_operand(out.codes.data(), kv.heads, tokens, s.head_dim, false), kv.heads,
                             paging->page_tokens, static_cast<int>(s.head_dim), 2 * s.head_dim);
      out.reference_values = std::move(x);
      return out;
    }
    if (c.placement != Placement::kPacked) {
      if (c.storage.bsnh) throw InputError("strided and huge placements are BNSH");
      bytes = place_rows(bytes, kv.batch * kv.heads, kv.tokens, 2 * s.head_dim, tokens, pad);
    }
    out.codes = DeviceBuffer<uint8_t>(bytes);
    out.op = raw_operand(out.codes.data(), kv.heads, tokens, s.head_dim, c.storage.bsnh);
    if (pad) restride(out.op, kv.heads, tokens, 2 * s.head_dim + pad);
    out.reference_values = std::move(x);
    return out;
  }
  if (scheme->has_window())  // the window keeps the input: bf16 values, as a model's cache holds them
    for (float& e : x) e = round_to_bf16(e);
  const QuantizedKv q = quantize(KvView::bnsh(x.data(), kv), *scheme, "K/V", c.seq_lens.empty() ? nullptr : c.seq_lens.data());
  std::vector<float> deq = dequantize(q);
  const bool fbgemm = format == KvFormat::kInt4Fbgemm;
  GpuQuantized bytes = device_bytes(q, fbgemm ? CodeLayout::kFbgemm : CodeLayout::kPlanar);
  const int64_t row = fbgemm ? fbgemm_row_bytes(*scheme, s.head_dim) : code_bytes_per_row(*scheme, s.head_dim);
  const int pbytes = scheme->scale_bytes();
  const bool per_row_params = scheme->granularity == Granularity::kHead || scheme->granularity == Granularity::kGroup;
  for (int64_t b = 0; b < kv.batch; ++b)
    for (int64_t h = 0; h < kv.heads; ++h)
      for (int64_t t = q.quantized_tokens.empty() ? seq_len(c, b) : q.quantized_tokens[b]; t < kv.tokens; ++t) {
        const int64_t r = fbgemm ? (b * kv.tokens + t) * kv.heads + h : (b * kv.heads + h) * kv.tokens + t;
        for (int64_t i = 0; i < row; ++i) bytes.codes[r * row + i] = static_cast<uint8_t>(0x7e ^ (i * 37));
        if (per_row_params && !fbgemm) {  // NaN scales (FBGEMM rows hold theirs, poisoned above) and zero points (the bytes 0x7e... are NaN in fp16 and fp32)
          const int64_t per = num_groups(*scheme, kv) / kv.rows();
          for (int64_t g = r * per; g < (r + 1) * per; ++g)
            for (int i = 0; i < pbytes; ++i) {
              bytes.scales[g * pbytes + i] = 0x7e;
              if (!bytes.zeros.empty()) bytes.zeros[g * pbytes + i] = 0x7e;
            }
        }
        if (t >= seq_len(c, b))
          for (int64_t d = 0; d < kv.head_dim; ++d) deq[((b * kv.heads + h) * kv.tokens + t) * kv.head_dim + d] = 0.0f;
      }
  if (scheme->has_window()) {
    std::vector<uint16_t> raw(static_cast<size_t>(kv.numel()), uint16_t{0x7fc1});
    for (int64_t b = 0; b < kv.batch; ++b)
      for (int64_t h = 0; h < kv.heads; ++h)
        for (int64_t t = q.quantized_tokens[b]; t < seq_len(c, b); ++t)
          for (int64_t d = 0; d < kv.head_dim; ++d) {
            const int64_t i = ((b * kv.heads + h) * kv.tokens + t) * kv.head_dim + d;
            raw[i] = fp32_to_bf16_bits(q.window_values[i]);
          }
    std::vector<uint8_t> bytes(2 * raw.size());
    std::memcpy(bytes.data(), raw.data(), bytes.size());
    if (window_paging)  // the window's pages only (from the page of its first token), 0xFF (NaN) elsewhere
      bytes = to_pages(bytes, {kv.batch, kv.heads, kv.tokens, 2 * s.head_dim, false, false}, *window_paging, 0xFF);
    out.window_values = DeviceBuffer<uint8_t>(bytes);
    KvOperand raw_op = raw_operand(out.window_values.data(), kv.heads, kv.tokens, s.head_dim, false);
    if (window_paging)
      raw_op = paged_operand(raw_op, kv.heads, window_paging->page_tokens, static_cast<int>(s.head_dim), 2 * s.head_dim);
    out.window = scheme_window(*scheme, raw_op, KvFormat::kBf16);
  }
  if (paging) {  // codes rows into their pages, per-row parameters (token, head, group) with them
    bytes.codes = to_pages(bytes.codes, {kv.batch, kv.heads, kv.tokens, row, fbgemm, false}, *paging, 0xFF);
    const bool token_params = scheme->granularity == Granularity::kToken && !scheme->scale_free;
    if ((per_row_params && !fbgemm) || token_params) {
      const int64_t heads = token_params ? 1 : kv.heads;
      const int64_t unit = num_groups(*scheme, kv) / (kv.batch * heads * kv.tokens) * pbytes;
      const PagedUnits u{kv.batch, heads, kv.tokens, unit, false, true};
      bytes.scales = to_pages(bytes.scales, u, *paging, 0x7e);
      if (!bytes.zeros.empty()) bytes.zeros = to_pages(bytes.zeros, u, *paging, 0x7e);
    } else if (scheme->granularity == Granularity::kChannel && paging->page_tokens % scheme->group == 0) {
      // a page's whole token groups, [pages, H, P / N, D] (pages that cut a group: the decode refuses them)
      Paging groups = *paging;
      groups.page_tokens = paging->page_tokens / scheme->group;
      const PagedUnits u{kv.batch, kv.heads, (kv.tokens + scheme->group - 1) / scheme->group, s.head_dim * pbytes, false,
                         true};
      bytes.scales = to_pages(bytes.scales, u, groups, 0x7e);
      if (!bytes.zeros.empty()) bytes.zeros = to_pages(bytes.zeros, u, groups, 0x7e);
    }
  } else if (c.placement != Placement::kPacked) {  // codes rows moved; a huge cache's per-row parameters too
    if (fbgemm || scheme->has_window() || !(per_row_params || scheme->scale_free))
      throw InputError(fmt::format("{}: strided and huge placements take head / group / scale-free schemes",
                                   to_string(*scheme)));
    bytes.codes = place_rows(bytes.codes, kv.batch * kv.heads, kv.tokens, row, tokens, pad);
    if (c.placement == Placement::kHuge && per_row_params) {
      const int64_t params = num_groups(*scheme, kv) / kv.rows() * pbytes;
      bytes.scales = place_rows(bytes.scales, kv.batch * kv.heads, kv.tokens, params, tokens, 0);
      if (!bytes.zeros.empty()) bytes.zeros = place_rows(bytes.zeros, kv.batch * kv.heads, kv.tokens, params, tokens, 0);
    }
  }
  out.codes = DeviceBuffer<uint8_t>(bytes.codes);
  out.scales = DeviceBuffer<uint8_t>(bytes.scales);
  out.zeros = DeviceBuffer<uint8_t>(bytes.zeros);
  out.tensor_scale = DeviceBuffer<uint8_t>(bytes.tensor_scale);  // nvfp4's fp32 s_t
  out.op = quantized_operand(*scheme, kv.batch, kv.heads, tokens, s.head_dim, fbgemm, out.codes.data(),
                             out.scales.data(), out.zeros.size() ? out.zeros.data() : nullptr,
                             out.tensor_scale.size() ? reinterpret_cast<const float*>(out.tensor_scale.data()) : nullptr);
  if (pad) restride(out.op, kv.heads, tokens, row + pad);
  if (paging) out.op = paged_operand(out.op, kv.heads, paging->page_tokens, static_cast<int>(s.head_dim), row);
  out.reference_values = std::move(deq);
  return out;
}

}  // namespace kvq::gate_case
