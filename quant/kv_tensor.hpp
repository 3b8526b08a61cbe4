// Host views of K/V tensors and their quantized form.
#pragma once

#include <string>
#include <vector>

#include "quant/codec.hpp"
#include "quant/groups.hpp"
#include "quant/planar_codes.hpp"

namespace kvq {

// A read-only fp32 view of K or V with logical shape [B, H, T, D]; D is contiguous and the other
// strides are explicit, so BNSH [B,H,T,D] and BSNH [B,T,H,D] buffers are both viewed in place.
// fp32 holds fp16 / bf16 inputs and dequantized values exactly.
struct KvView {
  const float* data = nullptr;
  KvShape shape;
  int64_t stride_b = 0, stride_h = 0, stride_t = 0;

  static KvView bnsh(const float* data, KvShape s) {
    return {data, s, s.heads * s.tokens * s.head_dim, s.tokens * s.head_dim, s.head_dim};
  }
  static KvView bsnh(const float* data, KvShape s) {
    return {data, s, s.tokens * s.heads * s.head_dim, s.head_dim, s.heads * s.head_dim};
  }
  const float* row(int64_t b, int64_t h, int64_t t) const {
    return data + b * stride_b + h * stride_h + t * stride_t;
  }
  float at(int64_t b, int64_t h, int64_t t, int64_t d) const { return row(b, h, t)[d]; }
};

// A quantized K or V in the planar layout.
struct QuantizedKv {
  Scheme scheme;
  KvShape shape;
  // int8: [B, H, T, D] bytes; int4: [B, H, T, D/2] packed nibbles; 5-bit (q5_0, q5_1): [B, H, T, 5D/8],
  // each row the D/2 bytes of low nibbles as int4 then D/8 bytes of the fifth bits (element d: bit d%8
  // of byte D/2 + d/8).
  std::vector<uint8_t> codes;
  std::vector<float> scales;   // [num_groups(scheme, shape)], values exact in scheme.scale_dtype
  std::vector<float> zeros;    // [num_groups] for asymmetric schemes (q4_1 / q5_1: the min), empty otherwise
  float tensor_scale = 0.0f;   // nvfp4: the fp32 per-tensor scale s_t; 0 otherwise
  // +wW: tokens t >= quantized_tokens[b] keep their input values (rotated when +had) in
  // window_values and have code 0. Both empty without a window.
  std::vector<int32_t> quantized_tokens;  // [B]
  std::vector<float> window_values;       // [B, H, T, D], 0 where quantized

  bool quantized_at(int64_t b, int64_t t) const { return quantized_tokens.empty() || t < quantized_tokens[b]; }
  int code(int64_t b, int64_t h, int64_t t, int64_t d) const {
    const int64_t row = (b * shape.heads + h) * shape.tokens + t;
    return planar_code(scheme, codes.data() + row * code_bytes_per_row(scheme, shape.head_dim), shape.head_dim, d);
  }
  // Scale and zero point of a group, for decode(). No reciprocal is computed (that would put a
  // division per element into dequantize); encode() with these params divides instead, exactly.
  GroupParams params(int64_t group) const {
    if (scheme.scale_free) return unit_params();
    GroupParams p;
    p.scale = scales[group];
    p.zero = scheme.asymmetric ? zeros[group] : 0.0f;
    return p;
  }
};

// "[b, h, t, d]" for messages.
std::string index_string(int64_t b, int64_t h, int64_t t, int64_t d);

// Throws InputError naming `tensor_name` and the first (in [B, H, T, D] order) non-finite element;
// `why` ends the message.
void check_finite(const KvView& x, const std::string& tensor_name,
                  const char* why = "quantizers accept finite input only");

}  // namespace kvq
