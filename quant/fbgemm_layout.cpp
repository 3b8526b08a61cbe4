#include "quant/fbgemm_layout.hpp"

#include <fmt/format.h>

#include "quant/float_formats.hpp"
#include "quant/quantize.hpp"

#include <algorithm>

namespace kvq {

int fbgemm_groups_per_row(const Scheme& scheme, int64_t head_dim) {
  check_scheme_fits(scheme, static_cast<int>(head_dim));
  const std::string name = to_string(scheme);
  if (scheme.bits != 4 || !scheme.asymmetric || scheme.scale_dtype != ScaleDtype::kFp16)
    throw SchemeError(fmt::format("{}: the FBGEMM inline-row layout holds int4 asymmetric codes with fp16 "
                                  "scales only", name));
  if (scheme.has_window())  // its rows have no room for the window's full-precision values
    throw SchemeError(fmt::format("{}: the FBGEMM inline-row layout holds no full-precision window (+w)", name));
  if (scheme.granularity == Granularity::kHead) return 1;
  if (scheme.granularity == Granularity::kGroup) {
    const int64_t n = head_dim / scheme.group;
    if (n == 1 || n == 2 || n == 4 || n == 8) return static_cast<int>(n);
    throw SchemeError(fmt::format("{}: the FBGEMM inline-row layout needs 1, 2, 4 or 8 groups per row, "
                                  "head_dim {} gives {}", name, head_dim, n));
  }
  throw SchemeError(fmt::format("{}: the FBGEMM inline-row layout needs head or g<G> granularity", name));
}

int64_t fbgemm_row_bytes(const Scheme& scheme, int64_t head_dim) {
  return head_dim / 2 + 4 * fbgemm_groups_per_row(scheme, head_dim);
}

FbgemmRows to_fbgemm(const QuantizedKv& planar) {
  const KvShape& s = planar.shape;
  const int n = fbgemm_groups_per_row(planar.scheme, s.head_dim);
  FbgemmRows out{planar.scheme, s, fbgemm_row_bytes(planar.scheme, s.head_dim), {}};
  out.bytes.resize(static_cast<size_t>(s.rows() * out.row_bytes));
  const int64_t code_bytes = s.head_dim / 2;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < s.rows(); ++r) {  // r: planar row (b, h, t)
    const int64_t b = r / (s.heads * s.tokens), h = (r / s.tokens) % s.heads, t = r % s.tokens;
    uint8_t* dst = out.bytes.data() + ((b * s.tokens + t) * s.heads + h) * out.row_bytes;
    for (int i = 0; i < n; ++i) {  // planar groups of one row are consecutive
      store_fp16_le(dst + 4 * i, planar.scales[r * n + i]);
      store_fp16_le(dst + 4 * i + 2, planar.zeros[r * n + i]);
    }
    std::copy_n(planar.codes.data() + r * code_bytes, code_bytes, dst + 4 * n);
  }
  return out;
}

QuantizedKv from_fbgemm(const FbgemmRows& rows) {
  const KvShape& s = rows.shape;
  const int n = fbgemm_groups_per_row(rows.scheme, s.head_dim);
  const int64_t code_bytes = s.head_dim / 2;
  if (rows.row_bytes != code_bytes + 4 * n || static_cast<int64_t>(rows.bytes.size()) != s.rows() * rows.row_bytes)
    throw InputError(fmt::format("FBGEMM rows for {}: expected {} rows of {} bytes, got {} bytes with row_bytes {}",
                                 to_string(rows.scheme), s.rows(), code_bytes + 4 * n, rows.bytes.size(),
                                 rows.row_bytes));
  QuantizedKv q;
  q.scheme = rows.scheme;
  q.shape = s;
  q.codes.resize(static_cast<size_t>(s.rows() * code_bytes));
  q.scales.resize(static_cast<size_t>(s.rows() * n));
  q.zeros.resize(q.scales.size());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < s.rows(); ++r) {
    const int64_t b = r / (s.heads * s.tokens), h = (r / s.tokens) % s.heads, t = r % s.tokens;
    const uint8_t* src = rows.bytes.data() + ((b * s.tokens + t) * s.heads + h) * rows.row_bytes;
    for (int i = 0; i < n; ++i) {
      q.scales[r * n + i] = load_fp16_le(src + 4 * i);
      q.zeros[r * n + i] = load_fp16_le(src + 4 * i + 2);
    }
    std::copy_n(src + 4 * n, code_bytes, q.codes.data() + r * code_bytes);
  }
  return q;
}

FbgemmRows quantize_fbgemm(const KvView& x, const Scheme& scheme, const std::string& tensor_name) {
  fbgemm_groups_per_row(scheme, x.shape.head_dim);  // reject unsupported schemes before the work
  return to_fbgemm(quantize(x, scheme, tensor_name));
}

std::vector<float> dequantize(const FbgemmRows& rows) { return dequantize(from_fbgemm(rows)); }

}  // namespace kvq
