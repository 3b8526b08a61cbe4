// A quantization scheme: code format x granularity x symmetry x scale dtype, plus the modifiers
// (+had: Hadamard rotation along D, +wW: full-precision window of the last W tokens), and its short
// name ("int8-head", "int4-g32-asym", "int4-chan-t32", "fp8-e4m3-head", "int4-g32-asym+had",
// "int4-chan-t32-asym+w128", "q4_0", "mxfp4+had"). The struct is plain data so that kernels can take
// it by value; parsing and printing are host-only.
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

// kE8M0: a power of two 2^(e-127) in one byte (mxfp4); kE4M3: an unsigned OCP e4m3 byte (nvfp4).
enum class ScaleDtype : uint8_t { kFp16, kFp32, kE8M0, kE4M3 };

// How one code byte (or nibble) encodes a value: an integer times the scale (plus the zero point), or
// an OCP FP8 number times the scale (DESIGN.md: e4m3fn, bias 7, max 448; e5m2, bias 15, max 57344).
// The block formats after them quantize blocks of 32 (nvfp4: 16) elements along D by their own
// reference rules (quant/block_formats.hpp, docs/schemes.md): llama.cpp's KV cache types, named as
// llama.cpp names them, and the FP4 microscaling formats.
enum class CodeFormat : uint8_t {
  kInt,
  kFp8E4M3,
  kFp8E5M2,
  kQ8_0,    // fp16 d, int8 codes
  kQ4_0,    // fp16 d, 4-bit codes - 8
  kQ4_1,    // fp16 d and min, 4-bit codes
  kQ5_0,    // fp16 d, 5-bit codes - 16
  kQ5_1,    // fp16 d and min, 5-bit codes
  kIq4Nl,   // fp16 d, 4-bit indices into a non-linear table
  kMxfp4,   // e8m0 scale, e2m1 codes
  kNvfp4,   // e4m3 scale per 16, e2m1 codes, an fp32 scale per tensor
};

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
  // +had<N>: the rotation in independent blocks of N elements along D (llama.cpp rotates V in
  // blocks of 64); 0: one rotation of the whole row.
  int hadamard_block = 0;
  int window = -1;        // +wW: W >= 0 tokens kept in full precision; -1: no window

  KVQ_HD bool fp8() const { return format == CodeFormat::kFp8E4M3 || format == CodeFormat::kFp8E5M2; }
  // llama.cpp's types and the FP4 microscaling formats: kGroup granularity, group = the block size.
  KVQ_HD bool block_format() const { return format >= CodeFormat::kQ8_0; }
  KVQ_HD bool has_window() const { return window >= 0; }
  // Elements per rotation block of a head_dim row (+had: the whole row).
  KVQ_HD int64_t rotation_block(int64_t head_dim) const { return hadamard_block > 0 ? hadamard_block : head_dim; }
  // Codes read as two's complement (symmetric int, q8_0) rather than as unsigned bytes / nibbles.
  KVQ_HD bool signed_codes() const {
    return format == CodeFormat::kInt ? !asymmetric : format == CodeFormat::kQ8_0;
  }

  KVQ_HD int qmax() const { return (1 << (bits - 1)) - 1; }   // symmetric: 127 / 7
  KVQ_HD int levels() const { return (1 << bits) - 1; }       // asymmetric: 255 / 15
  KVQ_HD int scale_bytes() const {
    return scale_dtype == ScaleDtype::kFp16 ? 2 : scale_dtype == ScaleDtype::kFp32 ? 4 : 1;
  }
  // Bytes per scale group: the scale, plus the zero point when asymmetric.
  KVQ_HD int param_bytes() const { return scale_bytes() * (asymmetric ? 2 : 1); }

  bool operator==(const Scheme& o) const {
    return bits == o.bits && granularity == o.granularity && group == o.group &&
           asymmetric == o.asymmetric && scale_dtype == o.scale_dtype && format == o.format &&
           scale_free == o.scale_free && hadamard == o.hadamard && hadamard_block == o.hadamard_block &&
           window == o.window;
  }
  bool operator!=(const Scheme& o) const { return !(*this == o); }
};

// Bad scheme names and schemes that do not fit a tensor shape.
struct SchemeError : InputError {
  using InputError::InputError;
};

// Grammar: BASE[+had[<N>]][+w<W>], BASE one of
//   int{8|4}-{tensor|token|head|g<G>|chan-t<N>}[-sym|-asym][-fp16|-fp32]
//   fp8-{e4m3|e5m2}-{tensor|token|head|g<G>}[-sym][-fp16|-fp32]     (symmetric only, no chan-tN)
//   fp8-{e4m3|e5m2}                                                  (scale-free)
//   q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | iq4_nl | mxfp4 | nvfp4        (block formats, no suffixes)
// Symmetric and fp16 scales are the defaults and are omitted when printing; modifiers print as
// +had (or +had<N>: blocks of N elements, a power of two) then +wW.
Scheme parse_scheme(std::string_view name);
std::string to_string(const Scheme& s);
// tensor, token, head, group, channel
const char* granularity_name(Granularity g);
// float16, float32, e8m0, e4m3
const char* scale_dtype_name(ScaleDtype dt);
// How codes encode values: int, fp8-e4m3, fp8-e5m2, or the block format's name (q8_0 ... nvfp4).
std::string format_name(const Scheme& s);
// Comma-separated list, e.g. "int8-head,int4-g32-asym"; a scheme named twice (by any spelling) is an error.
std::vector<Scheme> parse_scheme_list(std::string_view names);

// Throws SchemeError when `s` cannot quantize a tensor with this head_dim, e.g.
// "int4-g48: group size 48 does not divide head_dim 128", "q4_0: block size 32 does not divide
// head_dim 48", "int4-head+had: ... power of two".
void check_scheme_fits(const Scheme& s, int head_dim);

}  // namespace kvq
