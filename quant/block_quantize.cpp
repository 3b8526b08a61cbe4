#include "quant/block_quantize.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <limits>

#include "quant/quantize.hpp"

namespace kvq {
namespace {

constexpr int64_t kParallelMinElements = int64_t{1} << 15;  // as quantize.cpp: below it, one thread

// amax over the quantized tokens (nvfp4's tensor statistic).
float quantized_amax(const KvView& x, const QuantizedKv& q) {
  const KvShape& s = x.shape;
  float amax = 0.0f;
#pragma omp parallel for reduction(max : amax) schedule(static) if (s.numel() >= kParallelMinElements)
  for (int64_t r = 0; r < s.rows(); ++r) {
    const int64_t b = r / (s.heads * s.tokens), h = (r / s.tokens) % s.heads, t = r % s.tokens;
    if (!q.quantized_at(b, t)) continue;
    const float* row = x.row(b, h, t);
    for (int64_t d = 0; d < s.head_dim; ++d) amax = std::max(amax, std::fabs(row[d]));
  }
  return amax;
}

}  // namespace

// Bytes (8 bits), nibbles (4 bits: element 2i low), or nibbles then the fifth bits (5 bits).
void pack_codes_row(const uint8_t* codes, int64_t head_dim, int bits, uint8_t* row) {
  if (bits == 8) {
    std::copy(codes, codes + head_dim, row);
    return;
  }
  for (int64_t i = 0; i < head_dim / 2; ++i) row[i] = pack_nibbles(codes[2 * i] & 0xf, codes[2 * i + 1] & 0xf);
  if (bits == 4) return;
  uint8_t* high = row + head_dim / 2;
  std::fill(high, high + head_dim / 8, 0);
  for (int64_t d = 0; d < head_dim; ++d) high[d / 8] |= static_cast<uint8_t>(((codes[d] >> 4) & 1) << (d % 8));
}

void unpack_codes_row(const uint8_t* row, int64_t head_dim, int bits, uint8_t* codes) {
  if (bits == 8) {
    std::copy(row, row + head_dim, codes);
    return;
  }
  for (int64_t d = 0; d < head_dim; ++d) {
    codes[d] = static_cast<uint8_t>((d % 2 ? row[d / 2] >> 4 : row[d / 2]) & 0xf);
    if (bits == 5) codes[d] |= static_cast<uint8_t>(((row[head_dim / 2 + d / 8] >> (d % 8)) & 1) << 4);
  }
}

uint8_t scale_byte(ScaleDtype dt, float value) {
  return static_cast<uint8_t>(dt == ScaleDtype::kE8M0 ? e8m0_byte(value) : fp32_to_fp8_bits(value, fp8_e4m3()));
}

float scale_from_byte(ScaleDtype dt, uint8_t byte) {
  return dt == ScaleDtype::kE8M0 ? e8m0_value(byte) : fp8_bits_to_fp32(byte, fp8_e4m3());
}

void quantize_blocks(const KvView& x, QuantizedKv& q, const std::string& tensor_name,
                     std::optional<float> tensor_scale) {
  const Scheme& s = q.scheme;
  const KvShape& shape = x.shape;
  const int n = s.group;
  const int64_t per_row = shape.head_dim / n, row_bytes = code_bytes_per_row(s, shape.head_dim);
  if (s.format == CodeFormat::kNvfp4) {
    q.tensor_scale = tensor_scale ? *tensor_scale : nvfp4_tensor_scale(quantized_amax(x, q));
  }
  // A block with no quantized token (+wW) stores zero bytes: scale 0 (mxfp4: e = 0, i.e. 2^-127).
  const float empty_scale = s.scale_dtype == ScaleDtype::kE8M0 ? e8m0_value(0) : 0.0f;
  q.scales.assign(static_cast<size_t>(shape.rows() * per_row), empty_scale);
  if (s.asymmetric) q.zeros.assign(q.scales.size(), 0.0f);
  q.codes.assign(static_cast<size_t>(shape.rows() * row_bytes), 0);
  if (s.has_window()) q.window_values.assign(static_cast<size_t>(shape.numel()), 0.0f);

  int64_t first_overflow = std::numeric_limits<int64_t>::max();  // block index
#pragma omp parallel if (shape.numel() >= kParallelMinElements)
  {
    std::vector<uint8_t> codes(static_cast<size_t>(shape.head_dim));
#pragma omp for reduction(min : first_overflow) schedule(static)
    for (int64_t r = 0; r < shape.rows(); ++r) {
      const int64_t b = r / (shape.heads * shape.tokens), h = (r / shape.tokens) % shape.heads, t = r % shape.tokens;
      const float* in = x.row(b, h, t);
      if (!q.quantized_at(b, t)) {  // window token: code 0, value kept
        std::copy(in, in + shape.head_dim, q.window_values.data() + r * shape.head_dim);
        continue;
      }
      for (int64_t i = 0; i < per_row; ++i) {
        const BlockParams p = block_params(s.format, in + i * n, q.tensor_scale);
        if (p.overflow) first_overflow = std::min(first_overflow, r * per_row + i);
        q.scales[r * per_row + i] = p.scale;
        if (s.asymmetric) q.zeros[r * per_row + i] = p.min;
        for (int j = 0; j < n; ++j)
          codes[i * n + j] = static_cast<uint8_t>(block_encode(s.format, in[i * n + j], p) & 0xff);
      }
      pack_codes_row(codes.data(), shape.head_dim, s.bits, q.codes.data() + r * row_bytes);
    }
  }
  if (first_overflow != std::numeric_limits<int64_t>::max()) {
    const GroupBox box = group_box(s, shape, first_overflow);
    GroupStats st;
    for (int64_t d = box.d0; d < box.d1; ++d) st.add(x.at(box.b0, box.h0, box.t0, d));
    throw InputError(overflow_message(tensor_name, s, first_overflow, box, st));
  }
}

}  // namespace kvq
