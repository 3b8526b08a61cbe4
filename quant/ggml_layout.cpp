#include "quant/ggml_layout.hpp"

#include <fmt/format.h>

#include <vector>

#include "quant/block_quantize.hpp"
#include "quant/float_formats.hpp"

namespace kvq {
namespace {

// Byte offsets inside one block struct.
struct BlockLayout {
  int scale = 0, min = -1, qh = -1, qs = 0;  // -1: absent
};

BlockLayout block_layout(CodeFormat f) {
  switch (f) {
    case CodeFormat::kQ4_1: return {0, 2, -1, 4};
    case CodeFormat::kQ5_0: return {0, -1, 2, 6};
    case CodeFormat::kQ5_1: return {0, 2, 4, 8};
    case CodeFormat::kMxfp4: return {0, -1, -1, 1};
    case CodeFormat::kNvfp4: return {0, -1, -1, 4};
    default: return {0, -1, -1, 2};  // q8_0, q4_0, iq4_nl
  }
}

// The element in the low (hi = false) or high nibble of byte j of a block's qs: j and j + 16, or for
// nvfp4 (4 sub-blocks of 16, 8 bytes each) 16s + i and 16s + i + 8.
int nibble_element(CodeFormat f, int j, bool hi) {
  if (f == CodeFormat::kNvfp4) return 16 * (j / 8) + j % 8 + (hi ? 8 : 0);
  return j + (hi ? 16 : 0);
}

std::string block_where(const GgmlRows& rows, int64_t row, int64_t block) {
  const KvShape& s = rows.shape;
  const int64_t h = row % s.heads, t = (row / s.heads) % s.tokens, b = row / (s.heads * s.tokens);
  return fmt::format("{}: ggml block {} of row [b {}, t {}, h {}]", to_string(rows.scheme), block, b, t, h);
}

}  // namespace

int ggml_block_elements(const Scheme& scheme) {
  if (!scheme.block_format())
    throw SchemeError(fmt::format("{}: ggml blocks hold the block formats only (q8_0, q4_0, q4_1, q5_0, q5_1, "
                                  "iq4_nl, mxfp4, nvfp4)", to_string(scheme)));
  if (scheme.has_window())
    throw SchemeError(fmt::format("{}: ggml blocks hold no full-precision window (+w)", to_string(scheme)));
  return scheme.format == CodeFormat::kNvfp4 ? 64 : 32;
}

int ggml_block_bytes(const Scheme& scheme) {
  const int n = ggml_block_elements(scheme);
  const int scale_bytes = scheme.format == CodeFormat::kNvfp4 ? 4 : scheme.scale_bytes();
  return scale_bytes * (scheme.asymmetric ? 2 : 1) + n * scheme.bits / 8;
}

int64_t ggml_row_bytes(const Scheme& scheme, int64_t head_dim) {
  check_scheme_fits(scheme, static_cast<int>(head_dim));
  const int n = ggml_block_elements(scheme);
  if (head_dim % n != 0)
    throw SchemeError(fmt::format("{}: ggml's block holds {} elements, which does not divide head_dim {}",
                                  to_string(scheme), n, head_dim));
  return head_dim / n * ggml_block_bytes(scheme);
}

GgmlRows to_ggml(const QuantizedKv& planar) {
  const Scheme& sc = planar.scheme;
  const KvShape& s = planar.shape;
  GgmlRows out{sc, s, ggml_row_bytes(sc, s.head_dim), {}, planar.tensor_scale};
  out.bytes.assign(static_cast<size_t>(s.rows() * out.row_bytes), 0);
  const int n = ggml_block_elements(sc), block_bytes = ggml_block_bytes(sc), group = sc.group;
  const BlockLayout L = block_layout(sc.format);
  const int64_t row_code_bytes = code_bytes_per_row(sc, s.head_dim);
#pragma omp parallel
  {
    std::vector<uint8_t> codes(static_cast<size_t>(s.head_dim));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < s.rows(); ++r) {  // r: planar row (b, h, t)
      const int64_t b = r / (s.heads * s.tokens), h = (r / s.tokens) % s.heads, t = r % s.tokens;
      uint8_t* row = out.bytes.data() + ((b * s.tokens + t) * s.heads + h) * out.row_bytes;
      unpack_codes_row(planar.codes.data() + r * row_code_bytes, s.head_dim, sc.bits, codes.data());
      for (int64_t k = 0; k < s.head_dim / n; ++k) {
        uint8_t* blk = row + k * block_bytes;
        const uint8_t* c = codes.data() + k * n;
        for (int i = 0; i < n / group; ++i) {  // planar scale groups in this block (nvfp4: 4)
          const int64_t g = r * (s.head_dim / group) + k * (n / group) + i;
          if (sc.scale_dtype == ScaleDtype::kFp16) store_fp16_le(blk + L.scale, planar.scales[g]);
          else blk[L.scale + i] = scale_byte(sc.scale_dtype, planar.scales[g]);
          if (L.min >= 0) store_fp16_le(blk + L.min, planar.zeros[g]);
        }
        if (sc.bits == 8) {
          std::copy(c, c + n, blk + L.qs);
          continue;
        }
        for (int j = 0; j < n / 2; ++j)
          blk[L.qs + j] = static_cast<uint8_t>((c[nibble_element(sc.format, j, false)] & 0xf) |
                                               (c[nibble_element(sc.format, j, true)] & 0xf) << 4);
        if (L.qh >= 0)
          for (int j = 0; j < n; ++j) blk[L.qh + j / 8] |= static_cast<uint8_t>(((c[j] >> 4) & 1) << (j % 8));
      }
    }
  }
  return out;
}

QuantizedKv from_ggml(const GgmlRows& rows) {
  const Scheme& sc = rows.scheme;
  const KvShape& s = rows.shape;
  const int64_t row_bytes = ggml_row_bytes(sc, s.head_dim);
  if (static_cast<int64_t>(rows.bytes.size()) != s.rows() * row_bytes)
    throw InputError(fmt::format("{}: ggml blocks of [B, H, T, D] = [{}, {}, {}, {}] are {} bytes ([B, T, H, {}]), "
                                 "got {}", to_string(sc), s.batch, s.heads, s.tokens, s.head_dim, s.rows() * row_bytes,
                                 row_bytes, rows.bytes.size()));
  if (sc.format == CodeFormat::kNvfp4 && !(is_finite_float(rows.tensor_scale) && rows.tensor_scale >= 0.0f))
    throw InputError(fmt::format("nvfp4: tensor scale {} must be finite and >= 0", rows.tensor_scale));
  QuantizedKv q;
  q.scheme = sc;
  q.shape = s;
  q.tensor_scale = sc.format == CodeFormat::kNvfp4 ? rows.tensor_scale : 0.0f;
  const int n = ggml_block_elements(sc), block_bytes = ggml_block_bytes(sc), group = sc.group;
  const BlockLayout L = block_layout(sc.format);
  const int64_t row_code_bytes = code_bytes_per_row(sc, s.head_dim), per_row = s.head_dim / group;
  q.codes.assign(static_cast<size_t>(s.rows() * row_code_bytes), 0);
  q.scales.assign(static_cast<size_t>(s.rows() * per_row), 0.0f);
  if (sc.asymmetric) q.zeros.assign(q.scales.size(), 0.0f);
  std::vector<uint8_t> codes(static_cast<size_t>(s.head_dim));
  for (int64_t r = 0; r < s.rows(); ++r) {  // r: ggml row (b, t, h)
    const int64_t h = r % s.heads, t = (r / s.heads) % s.tokens, b = r / (s.heads * s.tokens);
    const int64_t planar_row = (b * s.heads + h) * s.tokens + t;
    const uint8_t* row = rows.bytes.data() + r * row_bytes;
    for (int64_t k = 0; k < s.head_dim / n; ++k) {
      const uint8_t* blk = row + k * block_bytes;
      uint8_t* c = codes.data() + k * n;
      for (int i = 0; i < n / group; ++i) {
        const int64_t g = planar_row * per_row + k * (n / group) + i;
        if (sc.scale_dtype == ScaleDtype::kFp16) {
          q.scales[g] = load_fp16_le(blk + L.scale);
          if (L.min >= 0) q.zeros[g] = load_fp16_le(blk + L.min);
        } else {
          const uint8_t byte = blk[L.scale + i];
          const bool bad = sc.scale_dtype == ScaleDtype::kE8M0 ? byte == 0xff : (byte & 0x80) || byte == 0x7f;
          if (bad)
            throw InputError(fmt::format("{}: scale byte {:#04x} is not a finite {} scale", block_where(rows, r, k),
                                         byte, sc.scale_dtype == ScaleDtype::kE8M0 ? "e8m0" : "unsigned e4m3"));
          q.scales[g] = scale_from_byte(sc.scale_dtype, byte);
        }
        if (!is_finite_float(q.scales[g]) || (sc.asymmetric && !is_finite_float(q.zeros[g])))
          throw InputError(fmt::format("{}: its fp16 scale or min is not finite", block_where(rows, r, k)));
      }
      if (sc.bits == 8) {
        std::copy(blk + L.qs, blk + L.qs + n, c);
        continue;
      }
      for (int j = 0; j < n / 2; ++j) {
        c[nibble_element(sc.format, j, false)] = blk[L.qs + j] & 0xf;
        c[nibble_element(sc.format, j, true)] = blk[L.qs + j] >> 4;
      }
      if (L.qh >= 0)
        for (int j = 0; j < n; ++j) c[j] |= static_cast<uint8_t>(((blk[L.qh + j / 8] >> (j % 8)) & 1) << 4);
    }
    pack_codes_row(codes.data(), s.head_dim, sc.bits, q.codes.data() + planar_row * row_code_bytes);
  }
  return q;
}

}  // namespace kvq
