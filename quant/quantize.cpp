#include "quant/quantize.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <limits>

#include "quant/block_quantize.hpp"
#include "quant/hadamard.hpp"

namespace kvq {

#pragma omp declare reduction(merge_stats : GroupStats : omp_out.merge(omp_in))

namespace {
// Below this many elements a loop runs on one thread: starting a parallel region costs more than
// the work (and far more on a busy machine), and callers such as a quantize-on-append cache make
// many calls of one token each. Results do not depend on the thread count.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;
}  // namespace

std::string index_string(int64_t b, int64_t h, int64_t t, int64_t d) {
  return fmt::format("[{}, {}, {}, {}]", b, h, t, d);
}

void check_finite(const KvView& x, const std::string& tensor_name, const char* why) {
  const KvShape& s = x.shape;
  int64_t first_bad = std::numeric_limits<int64_t>::max();  // flat [B, H, T, D] index
#pragma omp parallel for reduction(min : first_bad) schedule(static) if (s.numel() >= kParallelMinElements)
  for (int64_t r = 0; r < s.rows(); ++r) {
    const float* row = x.row(r / (s.heads * s.tokens), (r / s.tokens) % s.heads, r % s.tokens);
    for (int64_t d = 0; d < s.head_dim; ++d) {
      if (!is_finite_float(row[d])) {
        first_bad = std::min(first_bad, r * s.head_dim + d);
        break;
      }
    }
  }
  if (first_bad == std::numeric_limits<int64_t>::max()) return;
  const int64_t d = first_bad % s.head_dim, r = first_bad / s.head_dim;
  const int64_t t = r % s.tokens, h = (r / s.tokens) % s.heads, b = r / (s.tokens * s.heads);
  throw InputError(non_finite_message(tensor_name, x.at(b, h, t, d), b, h, t, d, why));
}

std::string non_finite_message(const std::string& tensor_name, float value, int64_t b, int64_t h, int64_t t, int64_t d,
                               const char* why) {
  return fmt::format("{}: non-finite value {} at {} ({})", tensor_name, value, index_string(b, h, t, d), why);
}

std::string overflow_message(const std::string& tensor_name, const Scheme& scheme, int64_t group, const GroupBox& box,
                             const GroupStats& stats) {
  return fmt::format(
      "{}: {} group {} starting at {} (min {}, max {}) needs a scale or zero point beyond the range of its scale "
      "dtype; {}",
      tensor_name, to_string(scheme), group, index_string(box.b0, box.h0, box.t0, box.d0), stats.lo(), stats.hi(),
      scheme.block_format() ? "this block format stores fp16 (largest 65504)" : "use -fp32 scales");
}

namespace {

// The box clipped to the quantized tokens of each batch entry (+wW); `qlen` empty: all tokens.
int64_t token_end(const GroupBox& box, const std::vector<int32_t>& qlen, int64_t b) {
  return qlen.empty() ? box.t1 : std::min<int64_t>(box.t1, qlen[b]);
}

GroupStats box_stats_serial(const KvView& x, const GroupBox& box, const std::vector<int32_t>& qlen) {
  GroupStats st;
  for (int64_t b = box.b0; b < box.b1; ++b)
    for (int64_t h = box.h0; h < box.h1; ++h)
      for (int64_t t = box.t0; t < token_end(box, qlen, b); ++t) {
        const float* row = x.row(b, h, t);
        for (int64_t d = box.d0; d < box.d1; ++d) st.add(row[d]);
      }
  return st;
}

// For a few huge groups (per-tensor, per-token): split the group's rows across threads.
GroupStats box_stats_parallel(const KvView& x, const GroupBox& box, const std::vector<int32_t>& qlen) {
  const int64_t nh = box.h1 - box.h0, nt = box.t1 - box.t0;
  const int64_t rows = (box.b1 - box.b0) * nh * nt;
  GroupStats st;
#pragma omp parallel for reduction(merge_stats : st) schedule(static) if (box.size() >= kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = box.b0 + r / (nh * nt), t = box.t0 + r % nt;
    if (t >= token_end(box, qlen, b)) continue;
    const float* row = x.row(b, box.h0 + (r / nt) % nh, t);
    for (int64_t d = box.d0; d < box.d1; ++d) st.add(row[d]);
  }
  return st;
}

// A BNSH fp32 copy of x rotated along D in blocks of `block` elements (+had, +had<N>).
std::vector<float> rotated_copy(const KvView& x, int64_t block) {
  const KvShape& s = x.shape;
  std::vector<float> out(static_cast<size_t>(s.numel()));
#pragma omp parallel for schedule(static) if (s.numel() >= kParallelMinElements)
  for (int64_t r = 0; r < s.rows(); ++r) {
    const float* in = x.row(r / (s.heads * s.tokens), (r / s.tokens) % s.heads, r % s.tokens);
    float* o = out.data() + r * s.head_dim;
    std::copy(in, in + s.head_dim, o);
    hadamard_rotate(o, s.head_dim, block);
  }
  return out;
}

}  // namespace

std::vector<GroupStats> group_stats(const KvView& x, const Scheme& scheme, const std::vector<int32_t>& quantized_tokens) {
  const int64_t n = num_groups(scheme, x.shape);
  std::vector<GroupStats> stats(static_cast<size_t>(n));
  if (n < 4 * static_cast<int64_t>(omp_get_max_threads())) {
    for (int64_t g = 0; g < n; ++g) stats[g] = box_stats_parallel(x, group_box(scheme, x.shape, g), quantized_tokens);
  } else {
#pragma omp parallel for schedule(static) if (x.shape.numel() >= kParallelMinElements)
    for (int64_t g = 0; g < n; ++g) stats[g] = box_stats_serial(x, group_box(scheme, x.shape, g), quantized_tokens);
  }
  return stats;
}

std::vector<int32_t> window_boundaries(const Scheme& scheme, const KvShape& shape, const int32_t* seq_lens) {
  if (!scheme.has_window()) return {};
  std::vector<int32_t> qlen(static_cast<size_t>(shape.batch));
  for (int64_t b = 0; b < shape.batch; ++b) {
    const int64_t len = seq_lens ? seq_lens[b] : shape.tokens;
    if (len < 0 || len > shape.tokens)
      throw InputError(fmt::format("{}: seq_lens[{}] = {} is outside [0, {}] (the tensor's tokens)", to_string(scheme),
                                   b, len, shape.tokens));
    qlen[b] = static_cast<int32_t>(quantized_length(scheme, len, shape.tokens));
  }
  return qlen;
}

bool takes_tensor_scale(const Scheme& s) {
  return s.format == CodeFormat::kNvfp4 || (s.granularity == Granularity::kTensor && !s.asymmetric && !s.scale_free);
}

void check_tensor_scale_taken(const Scheme& s) {
  if (!takes_tensor_scale(s))
    throw InputError(fmt::format("{}: a tensor scale is given, but only nvfp4 and the symmetric per-tensor schemes "
                                 "(int8-tensor, fp8-e4m3-tensor, ...) take one",
                                 to_string(s)));
}

void check_given_tensor_scale(const Scheme& s, float scale, const std::string& tensor_name) {
  check_tensor_scale_taken(s);
  if (s.format == CodeFormat::kNvfp4) {
    if (!(is_finite_float(scale) && scale >= 0.0f))
      throw InputError(fmt::format("{}: nvfp4 tensor scale {} must be finite and >= 0", tensor_name, scale));
    return;
  }
  const float stored = round_to_scale_dtype(scale, s.scale_dtype);
  if (!(is_finite_float(scale) && scale > 0.0f && is_finite_float(stored) && stored > 0.0f))
    throw InputError(fmt::format("{}: {}: the given tensor scale {} must be finite and > 0, also as its {} ({})",
                                 tensor_name, to_string(s), scale, scale_dtype_name(s.scale_dtype), stored));
}

QuantizedKv quantize(const KvView& input, const Scheme& scheme, const std::string& tensor_name, const int32_t* seq_lens,
                     std::optional<float> tensor_scale) {
  if (tensor_scale) check_tensor_scale_taken(scheme);
  check_scheme_fits(scheme, static_cast<int>(input.shape.head_dim));
  check_finite(input, tensor_name);
  if (tensor_scale) check_given_tensor_scale(scheme, *tensor_scale, tensor_name);  // after the input, as on the GPU
  const KvShape& s = input.shape;
  std::vector<float> rotated;
  if (scheme.hadamard) rotated = rotated_copy(input, scheme.rotation_block(s.head_dim));
  const KvView x = scheme.hadamard ? KvView::bnsh(rotated.data(), s) : input;

  QuantizedKv q;
  q.scheme = scheme;
  q.shape = s;
  q.quantized_tokens = window_boundaries(scheme, s, seq_lens);
  if (scheme.block_format()) {
    quantize_blocks(x, q, tensor_name, tensor_scale);
    return q;
  }
  const std::vector<GroupStats> stats = group_stats(x, scheme, q.quantized_tokens);
  const int64_t n = static_cast<int64_t>(stats.size());
  q.scales.resize(n);
  if (scheme.asymmetric) q.zeros.resize(n);
  std::vector<GroupParams> params(static_cast<size_t>(std::max<int64_t>(n, 1)), unit_params());  // [0]: scale-free
  for (int64_t g = 0; g < n; ++g) {
    const GroupParams p = params[g] = tensor_scale ? given_scale_params(*tensor_scale, scheme)  // per-tensor: n = 1
                                                   : group_params(stats[g], scheme);
    if (p.overflow) throw InputError(overflow_message(tensor_name, scheme, g, group_box(scheme, s, g), stats[g]));
    q.scales[g] = p.scale;
    if (scheme.asymmetric) q.zeros[g] = p.zero;
  }

  const int64_t row_bytes = code_bytes_per_row(scheme, s.head_dim);
  q.codes.assign(static_cast<size_t>(s.rows() * row_bytes), 0);
  if (scheme.has_window()) q.window_values.assign(static_cast<size_t>(s.numel()), 0.0f);
#pragma omp parallel for schedule(static) if (s.numel() >= kParallelMinElements)
  for (int64_t r = 0; r < s.rows(); ++r) {
    const int64_t b = r / (s.heads * s.tokens), h = (r / s.tokens) % s.heads, t = r % s.tokens;
    const float* in = x.row(b, h, t);
    if (!q.quantized_at(b, t)) {  // window token: code 0, value kept
      std::copy(in, in + s.head_dim, q.window_values.data() + r * s.head_dim);
      continue;
    }
    uint8_t* out = q.codes.data() + r * row_bytes;
    auto code_at = [&](int64_t d) { return encode(in[d], params[group_of(scheme, s, b, h, t, d)], scheme); };
    if (scheme.bits == 8) {
      for (int64_t d = 0; d < s.head_dim; ++d) out[d] = code_to_byte(code_at(d));
    } else {
      for (int64_t i = 0; i < s.head_dim / 2; ++i) out[i] = pack_nibbles(code_at(2 * i), code_at(2 * i + 1));
    }
  }
  return q;
}

namespace {
// Element (b, h, t, d) of a quantized token: planar_codes.hpp's arithmetic, as the GPU's dequantize.
float element_value(const QuantizedKv& q, int64_t b, int64_t h, int64_t t, int64_t d) {
  const Scheme& s = q.scheme;
  if (s.scale_free) return dequantized_value(s, q.code(b, h, t, d), 1.0f, 0.0f, 0.0f);
  const int64_t g = group_of(s, q.shape, b, h, t, d);  // the block formats: g<block>
  return dequantized_value(s, q.code(b, h, t, d), q.scales[g], s.asymmetric ? q.zeros[g] : 0.0f, q.tensor_scale);
}
}  // namespace

std::vector<float> dequantize(const QuantizedKv& q) {
  const KvShape& s = q.shape;
  std::vector<float> out(static_cast<size_t>(s.numel()));
#pragma omp parallel for schedule(static) if (s.numel() >= kParallelMinElements)
  for (int64_t r = 0; r < s.rows(); ++r) {
    const int64_t b = r / (s.heads * s.tokens), h = (r / s.tokens) % s.heads, t = r % s.tokens;
    for (int64_t d = 0; d < s.head_dim; ++d)
      out[r * s.head_dim + d] = q.quantized_at(b, t) ? element_value(q, b, h, t, d) : q.window_values[r * s.head_dim + d];
  }
  return out;
}

}  // namespace kvq
