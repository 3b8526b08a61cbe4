// A quantization scheme: code format x granularity x symmetry x scale dtype, plus the modifiers
// (+had: Hadamard rotation along D, +wW: full-precision window of the last W tokens), and its short
// name ("int8-head", "int4-g32-asym", "int4-chan-t32", "fp8-e4m3-head", "int4-g32-asym+had",
// "int4-chan-t32-asym+w128"). The struct is plain data so that kernels can take it by value; parsing
// and printing are host-only.
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

// How one code byte (or nibble) encodes a value: an integer times the scale (plus the zero point), or
// an OCP FP8 number times the scale (DESIGN.md: e4m3fn, bias 7, max 448; e5m2, bias 15, max 57344).
enum class CodeFormat : uint8_t { kInt, kFp8E4M3, kFp8E5M2 };

struct Scheme {
  int bits = 8;  // 8 or 4 (FP8: 8)
  Granularity granularity = Granularity::kHead;
  int group = 0;  // G for kGroup, N (tokens) for kChannel, 0 otherwise
  bool asymmetric = false;
  ScaleDtype scale_dtype = ScaleDtype::kFp16;
  CodeFormat format = CodeFormat::kInt;
  // Scale-free FP8 (`fp8-e4m3`): no scale is stored, codes are fp8(x). Granularity is then kTensor
  // nominally and there are no groups.
  bool scale_free = false;
  bool hadamard = false;  // +had: rotate along D (K: and Q) before quantization
  int window = -1;        // +wW: W >= 0 tokens kept in full precision; -1: no window

  KVQ_HD bool fp8() const { return format != CodeFormat::kInt; }
  KVQ_HD bool has_window() const { return window >= 0; }

  KVQ_HD int qmax() const { return (1 << (bits - 1)) - 1; }   // symmetric: 127 / 7
  KVQ_HD int levels() const { return (1 << bits) - 1; }       // asymmetric: 255 / 15
  KVQ_HD int scale_bytes() const { return scale_dtype == ScaleDtype::kFp16 ? 2 : 4; }
  // Bytes per scale group: the scale, plus the zero point when asymmetric.
  KVQ_HD int param_bytes() const { return scale_bytes() * (asymmetric ? 2 : 1); }

  bool operator==(const Scheme& o) const {
    return bits == o.bits && granularity == o.granularity && group == o.group &&
           asymmetric == o.asymmetric && scale_dtype == o.scale_dtype && format == o.format &&
           scale_free == o.scale_free && hadamard == o.hadamard && window == o.window;
  }
  bool operator!=(const Scheme& o) const { return !(*this == o); }
};

// Bad scheme names and schemes that do not fit a tensor shape.
struct SchemeError : InputError {
  using InputError::InputError;
};

// Grammar: BASE[+had][+w<W>], BASE one of
//   int{8|4}-{tensor|token|head|g<G>|chan-t<N>}[-sym|-asym][-fp16|-fp32]
//   fp8-{e4m3|e5m2}-{tensor|token|head|g<G>}[-sym][-fp16|-fp32]     (symmetric only, no chan-tN)
//   fp8-{e4m3|e5m2}                                                  (scale-free)
// Symmetric and fp16 scales are the defaults and are omitted when printing; modifiers print as
// +had then +wW.
Scheme parse_scheme(std::string_view name);
std::string to_string(const Scheme& s);
// tensor, token, head, group, channel
const char* granularity_name(Granularity g);
// Comma-separated list, e.g. "int8-head,int4-g32-asym".
std::vector<Scheme> parse_scheme_list(std::string_view names);

// Throws SchemeError when `s` cannot quantize a tensor with this head_dim, e.g.
// "int4-g48: group size 48 does not divide head_dim 128", "int4-head+had: ... power of two".
void check_scheme_fits(const Scheme& s, int head_dim);


}  // namespace kvq
