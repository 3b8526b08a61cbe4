// A quantization scheme: bits x granularity x symmetry x scale dtype, and its short name
// ("int8-head", "int4-g32-asym", "int4-chan-t32", "int8-token-fp32"). The struct is plain data so
// that kernels can take it by value; parsing and printing are host-only.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "quant/errors.hpp"
#include "quant/host_device.hpp"

namespace kvq {

enum class Granularity : uint8_t {
  kTensor,   // all of K (or V) of one layer
  kToken,    // one (b, t): all heads x D
  kHead,     // one (b, h, t): D elements
  kGroup,    // one (b, h, t, d / G): G contiguous elements along D
  kChannel,  // one (b, h, d, t / N): N consecutive tokens of one channel (KIVI-style K)
};

enum class ScaleDtype : uint8_t { kFp16, kFp32 };

struct Scheme {
  int bits = 8;  // 8 or 4
  Granularity granularity = Granularity::kHead;
  int group = 0;  // G for kGroup, N (tokens) for kChannel, 0 otherwise
  bool asymmetric = false;
  ScaleDtype scale_dtype = ScaleDtype::kFp16;

  KVQ_HD int qmax() const { return (1 << (bits - 1)) - 1; }   // symmetric: 127 / 7
  KVQ_HD int levels() const { return (1 << bits) - 1; }       // asymmetric: 255 / 15
  KVQ_HD int scale_bytes() const { return scale_dtype == ScaleDtype::kFp16 ? 2 : 4; }
  // Bytes per scale group: the scale, plus the zero point when asymmetric.
  KVQ_HD int param_bytes() const { return scale_bytes() * (asymmetric ? 2 : 1); }

  bool operator==(const Scheme& o) const {
    return bits == o.bits && granularity == o.granularity && group == o.group &&
           asymmetric == o.asymmetric && scale_dtype == o.scale_dtype;
  }
  bool operator!=(const Scheme& o) const { return !(*this == o); }
};

// Bad scheme names and schemes that do not fit a tensor shape.
struct SchemeError : InputError {
  using InputError::InputError;
};

// Grammar: int{8|4}-{tensor|token|head|g<G>|chan-t<N>}[-sym|-asym][-fp16|-fp32].
// Symmetric and fp16 scales are the defaults and are omitted when printing.
Scheme parse_scheme(std::string_view name);
std::string to_string(const Scheme& s);
// tensor, token, head, group, channel
const char* granularity_name(Granularity g);
// Comma-separated list, e.g. "int8-head,int4-g32-asym".
std::vector<Scheme> parse_scheme_list(std::string_view names);

// Throws SchemeError when `s` cannot quantize a tensor with this head_dim, e.g.
// "int4-g48: group size 48 does not divide head_dim 128".
void check_scheme_fits(const Scheme& s, int head_dim);

}  // namespace kvq
