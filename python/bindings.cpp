// kvq._core: the CPU codec, the fp64 reference attention and the error metrics for Python
// (nanobind). Every result comes from the C++ functions the kvq tools use, so it is bit for bit
// theirs; this file converts arrays and maps kvq's errors to Python exceptions, nothing more.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <variant>

#include "python/arrays.hpp"
#include "python/errors.hpp"
#include "quant/fbgemm_layout.hpp"
#include "quant/block_quantize.hpp"
#include "quant/ggml_layout.hpp"
#include "quant/hadamard.hpp"
#include "quant/quantize.hpp"
#include "quant/scheme_pairs.hpp"
#include "reference/attention.hpp"
#include "reference/metrics.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvq {
namespace {

using SchemeArg = std::variant<std::string, Scheme>;
using Shape4 = std::array<int64_t, 4>;

Scheme to_scheme(const SchemeArg& s) {
  return std::holds_alternative<Scheme>(s) ? std::get<Scheme>(s) : parse_scheme(std::get<std::string>(s));
}

KvShape to_kv_shape(const Shape4& s) { return {s[0], s[1], s[2], s[3]}; }

// A quantized tensor: the planar codes, scales and zero points, and the dequantized values.
// Arrays are read-only views of this object (no copies); scales and zero points are given in
// the scheme's scale dtype, exactly as `kvq quantize` stores them (e8m0 / e4m3: the bytes).
struct QuantizeResult {
  QuantizedKv q;
  std::vector<float> dequantized;
  std::vector<uint16_t> scale_bits, zero_bits;  // fp16 schemes: the stored halves
  std::vector<uint8_t> scale_bytes;             // e8m0 / e4m3 scales (mxfp4, nvfp4)

  explicit QuantizeResult(QuantizedKv quantized) : q(std::move(quantized)) {
    dequantized = dequantize(q);
    const ScaleDtype dt = q.scheme.scale_dtype;
    if (dt == ScaleDtype::kFp16) {
      for (float s : q.scales) scale_bits.push_back(fp32_to_fp16_bits(s));
      for (float z : q.zeros) zero_bits.push_back(fp32_to_fp16_bits(z));
    } else if (dt == ScaleDtype::kE8M0 || dt == ScaleDtype::kE4M3) {
      for (float s : q.scales) scale_bytes.push_back(scale_byte(dt, s));
    }
  }
  Shape4 shape() const { return {q.shape.batch, q.shape.heads, q.shape.tokens, q.shape.head_dim}; }
};

nb::object params_view(const QuantizeResult& r, const std::vector<float>& values, const std::vector<uint16_t>& bits,
                       nb::handle owner) {
  const std::vector<int64_t> shape = scale_shape(r.q.scheme, r.q.shape);
  if (r.q.scheme.scale_dtype == ScaleDtype::kE8M0 || r.q.scheme.scale_dtype == ScaleDtype::kE4M3)
    return readonly_view(r.scale_bytes.data(), shape, nb::dtype<uint8_t>(), owner);
  if (r.q.scheme.scale_dtype == ScaleDtype::kFp16) return readonly_view(bits.data(), shape, kFloat16, owner);
  return readonly_view(values.data(), shape, nb::dtype<float>(), owner);
}

// "[2, 3, 4]", as shape_string() writes an array's shape.
std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// e8m0 / e4m3 scales as their uint8 bytes (mxfp4, nvfp4), checked to be finite scales.
std::vector<float> byte_scales(const AnyArray& scales, const Scheme& scheme, const std::vector<int64_t>& want) {
  if (scales.dtype() != nb::dtype<uint8_t>() || shape_string(scales) != shape_text(want))
    throw InputError(fmt::format("{}: scales: expected the {} bytes as uint8 {}, got {} {}", to_string(scheme),
                                 scale_dtype_name(scheme.scale_dtype), shape_text(want), dtype_name(scales.dtype()),
                                 shape_string(scales)));
  std::vector<float> values;
  for (uint8_t byte : contiguous_bytes(scales, "scales")) {
    const float v = scale_from_byte(scheme.scale_dtype, byte);
    if (!is_finite_float(v) || (scheme.scale_dtype == ScaleDtype::kE4M3 && (byte & 0x80)))
      throw InputError(fmt::format("{}: scales[{}] = {:#04x} is not a finite {} scale", to_string(scheme),
                                   values.size(), byte, scale_dtype_name(scheme.scale_dtype)));
    values.push_back(v);
  }
  return values;
}

// nvfp4's tensor scale: required there, refused elsewhere.
float tensor_scale_for(const Scheme& scheme, std::optional<float> tensor_scale) {
  if (scheme.format == CodeFormat::kNvfp4 && !tensor_scale)
    throw InputError("nvfp4: tensor_scale (the per-tensor fp32 scale) must be given with the codes and scales");
  if (scheme.format != CodeFormat::kNvfp4 && tensor_scale)
    throw InputError(fmt::format("{}: tensor_scale is given, but only nvfp4 has one", to_string(scheme)));
  if (tensor_scale && !(is_finite_float(*tensor_scale) && *tensor_scale >= 0.0f))
    throw InputError(fmt::format("nvfp4: tensor_scale {} must be finite and >= 0", *tensor_scale));
  return tensor_scale.value_or(0.0f);
}

// Builds a QuantizedKv from arrays (e.g. read back from `kvq quantize` output), checking every
// shape against the scheme.
QuantizedKv quantized_from_arrays(const AnyArray& codes, const AnyArray& scales, const std::optional<AnyArray>& zeros,
                                  const Scheme& scheme, std::optional<float> tensor_scale) {
  QuantizedKv q;
  q.scheme = scheme;
  if (scheme.has_window())  // the window's full-precision values are not among these arrays
    throw InputError(fmt::format("{}: a +w<W> result cannot be rebuilt from codes and scales alone", to_string(scheme)));
  if (codes.ndim() != 4)
    throw InputError(fmt::format("codes: expected 4 axes [B, H, T, D{}], got {}",
                                 scheme.bits == 4 ? "/2" : scheme.bits == 5 ? "*5/8" : "", shape_string(codes)));
  const nb::dlpack::dtype dt = codes.dtype();
  if (dt != nb::dtype<uint8_t>() && dt != nb::dtype<int8_t>())
    throw InputError(fmt::format("codes: expected uint8 or int8, got {}", dtype_name(dt)));
  const int64_t row_bytes = static_cast<int64_t>(codes.shape(3));
  q.shape = {static_cast<int64_t>(codes.shape(0)), static_cast<int64_t>(codes.shape(1)),
             static_cast<int64_t>(codes.shape(2)), row_bytes * 8 / scheme.bits};
  check_scheme_fits(scheme, static_cast<int>(q.shape.head_dim));
  if (code_bytes_per_row(scheme, q.shape.head_dim) != row_bytes)
    throw InputError(fmt::format("{}: codes: {} bytes per row is not a whole number of elements", to_string(scheme),
                                 row_bytes));
  q.codes = contiguous_bytes(codes, "codes");
  q.tensor_scale = tensor_scale_for(scheme, tensor_scale);
  const std::vector<int64_t> want = scale_shape(scheme, q.shape);
  const bool byte_dtype = scheme.scale_dtype == ScaleDtype::kE8M0 || scheme.scale_dtype == ScaleDtype::kE4M3;
  q.scales = byte_dtype ? byte_scales(scales, scheme, want) : float_values(scales, "scales", want);
  if (scheme.asymmetric != zeros.has_value())
    throw InputError(fmt::format("{}: zero_points must be given for asymmetric schemes only", to_string(scheme)));
  if (zeros) q.zeros = float_values(*zeros, "zero_points", want);
  for (const auto& [name, values] : {std::pair{"scales", &q.scales}, std::pair{"zero_points", &q.zeros}})
    for (size_t i = 0; i < values->size(); ++i) {
      const float x = (*values)[i];
      if (!byte_dtype && (!is_finite_float(x) || round_to_scale_dtype(x, scheme.scale_dtype) != x))
        throw InputError(fmt::format("{}: {}[{}] = {} is not a finite {} value", to_string(scheme), name, i, x,
                                     scale_dtype_name(scheme.scale_dtype)));
    }
  return q;
}

nb::tuple attention_py(const AnyArray& q_in, const AnyArray& k_in, const AnyArray& v_in,
                       const std::optional<AnyArray>& seq_lens_in, double softmax_scale, bool alibi,
                       const std::string& precision, const std::string& layout, bool probabilities) {
  const Fp32Tensor q = fp32_tensor(q_in, "q", "bnsh");
  const Fp32Tensor k = fp32_tensor(k_in, "k", layout), v = fp32_tensor(v_in, "v", layout);
  const std::vector<float> q_values = q.contiguous();  // the reference reads Q as [B, Hq, Tq, D]
  std::vector<int32_t> seq_lens;
  if (seq_lens_in) seq_lens = int32_values(*seq_lens_in, "seq_lens", {q.view.shape.batch});
  AttentionProblem p;
  p.batch = q.view.shape.batch;
  p.q_heads = q.view.shape.heads;
  p.q_len = q.view.shape.tokens;
  p.head_dim = q.view.shape.head_dim;
  p.kv_heads = k.view.shape.heads;
  p.q = q_values.data();
  p.k = k.view;
  p.v = v.view;
  p.seq_lens = seq_lens_in ? seq_lens.data() : nullptr;
  p.softmax_scale = softmax_scale;
  p.alibi = alibi;
  check_problem(p);
  const PrecisionProfile profile = PrecisionProfile::parse(precision);
  std::vector<double> probs;
  AttentionOutput out;
  {
    nb::gil_scoped_release release;
    out = attention(p, profile, {}, probabilities ? &probs : nullptr);
  }
  const std::vector<int64_t> o_shape = {p.batch, p.q_heads, p.q_len, p.head_dim};
  nb::object o = owned_array(std::move(out.o), o_shape), lse = owned_array(std::move(out.lse), {p.batch, p.q_heads, p.q_len});
  if (!probabilities) return nb::make_tuple(o, lse);
  return nb::make_tuple(o, lse, owned_array(std::move(probs), {p.batch, p.q_heads, p.q_len, p.tokens()}));
}

// Per-head values: the last two axes (Tq x D) unless given.
int64_t values_per_head(const AnyArray& a, std::optional<int64_t> given) {
  if (given) return *given;
  if (a.ndim() < 2) throw InputError(fmt::format("o: expected at least 2 axes, got {}", shape_string(a)));
  return static_cast<int64_t>(a.shape(a.ndim() - 1) * a.shape(a.ndim() - 2));
}

std::pair<std::vector<double>, std::vector<double>> same_shape_doubles(const AnyArray& test, const AnyArray& ref,
                                                                        const char* test_name, const char* ref_name) {
  if (shape_string(test) != shape_string(ref))
    throw InputError(fmt::format("{} has shape {}, {} has {}: expected equal shapes", test_name, shape_string(test),
                                 ref_name, shape_string(ref)));
  return {double_values(test, test_name), double_values(ref, ref_name)};
}

void bind_scheme(nb::module_& m) {
  nb::class_<Scheme>(m, "Scheme", "A quantization scheme: bits x granularity x symmetry x scale dtype.")
      .def(nb::init<>())
      .def_prop_ro("name", [](const Scheme& s) { return to_string(s); }, "Short name, e.g. 'int4-g32-asym'")
      .def_ro("bits", &Scheme::bits)
      .def_prop_ro("granularity", [](const Scheme& s) { return std::string(granularity_name(s.granularity)); },
                   "tensor, token, head, group or channel")
      .def_ro("group", &Scheme::group, "G for g<G>, N (tokens) for chan-t<N>, else 0")
      .def_ro("asymmetric", &Scheme::asymmetric)
      .def_prop_ro("format", [](const Scheme& s) { return format_name(s); },
                   "int, fp8-e4m3, fp8-e5m2, or the block format's name (q8_0 ... nvfp4)")
      .def_prop_ro("block_format", [](const Scheme& s) { return s.block_format(); },
                   "llama.cpp's types and mxfp4 / nvfp4: blocks of group elements along D, each by its reference rule")
      .def_ro("scale_free", &Scheme::scale_free, "scale-free FP8 (no scale stored)")
      .def_ro("hadamard", &Scheme::hadamard, "+had: rotated along D before quantization")
      .def_prop_ro("hadamard_block", [](const Scheme& s) { return s.hadamard && s.hadamard_block > 0 ? std::optional<int>(s.hadamard_block) : std::nullopt; },
                   "+had<N>: the rotation's block of N elements along D; None for the whole row (+had) or no rotation")
      .def("rotation_block", [](const Scheme& s, int64_t head_dim) { return s.hadamard ? s.rotation_block(head_dim) : int64_t{0}; },
           "head_dim"_a, "elements per rotation block of a head_dim row (0 without +had)")
      .def_prop_ro("window", [](const Scheme& s) { return s.has_window() ? std::optional<int>(s.window) : std::nullopt; },
                   "+w<W>: the last W tokens kept in full precision, else None")
      .def_prop_ro("without_window", [](const Scheme& s) { Scheme r = s; r.window = -1; return r; },
                   "the scheme a +w<W> storage quantizes its tokens with (the window only decides when); itself "
                   "without a window")
      .def_prop_ro("scale_dtype", [](const Scheme& s) { return scale_dtype_name(s.scale_dtype); },
                   "float16, float32, e8m0 (mxfp4) or e4m3 (nvfp4)")
      .def("fits", [](const Scheme& s, int head_dim) { check_scheme_fits(s, head_dim); }, "head_dim"_a,
           "Raises SchemeError when the scheme cannot quantize tensors with this head_dim")
      .def("__str__", [](const Scheme& s) { return to_string(s); })
      .def("__repr__", [](const Scheme& s) { return fmt::format("Scheme('{}')", to_string(s)); })
      .def("__eq__", [](const Scheme& a, const Scheme& b) { return a == b; })
      .def("__hash__", [](const Scheme& s) { return nb::hash(nb::str(to_string(s).c_str())); });
  m.def("parse_scheme", [](const std::string& name) { return parse_scheme(name); }, "name"_a,
        "Parses a scheme name, e.g. 'int4-g32-asym'; raises SchemeError with kvq's message");
  m.def("parse_scheme_list", [](const std::string& names) { return parse_scheme_list(names); }, "names"_a);
  m.def(
      "llamacpp_rotation_block",
      [](const std::string& side, int64_t head_dim) {
        if (side != "k" && side != "v") throw InputError(fmt::format("side '{}': expected 'k' or 'v'", side));
        return llamacpp_rotation_block(side == "k", head_dim);
      },
      "side"_a, "head_dim"_a,
      "llama.cpp's rotation block for a quantized cache side ('k': the largest power of two >= 64 dividing "
      "head_dim; 'v': 64), 0 where head_dim % 64 != 0");
  m.def(
      "llamacpp_cache_scheme",
      [](const std::string& type, const std::string& side, int64_t head_dim) {
        if (side != "k" && side != "v") throw InputError(fmt::format("side '{}': expected 'k' or 'v'", side));
        return llamacpp_cache_scheme(type, side == "k", head_dim);
      },
      "type"_a, "side"_a, "head_dim"_a,
      "a llama.cpp quantized cache type (q8_0, q4_0, ...) as today's llama.cpp keeps it on that side: +had or "
      "+had<N> where it rotates");
  m.def(
      "default_pairs",
      [](int64_t head_dim) {
        std::vector<std::pair<Scheme, Scheme>> out;
        for (const SchemePair& p : default_pairs(head_dim)) out.emplace_back(p.k, p.v);
        return out;
      },
      "head_dim"_a, "The sweep's default (K scheme, V scheme) pairs for this head_dim");
  m.def("scale_shape", [](const SchemeArg& s, const Shape4& shape) { return scale_shape(to_scheme(s), to_kv_shape(shape)); },
        "scheme"_a, "shape"_a, "Shape of the scale (and zero-point) array for a [B, H, T, D] tensor");
  m.def(
      "quantized_length",
      [](const SchemeArg& s, int64_t length) {
        if (length < 0) throw InputError(fmt::format("quantized_length: length {} is negative", length));
        return quantized_length(to_scheme(s), length, length);
      },
      "scheme"_a, "length"_a,
      "How many leading tokens of a sequence of `length` the scheme quantizes: all of them, or with +w<W> "
      "max(0, length - W), rounded down to whole groups for chan-t<N> (the rest stay raw)");
}

void bind_codec(nb::module_& m) {
  nb::class_<QuantizeResult>(m, "QuantizeResult", "A quantized K or V tensor in kvq's planar layout")
      .def(
          "__init__",
          [](QuantizeResult* self, const AnyArray& codes, const AnyArray& scales, std::optional<AnyArray> zero_points,
             const SchemeArg& scheme, std::optional<float> tensor_scale) {
            new (self) QuantizeResult(quantized_from_arrays(codes, scales, zero_points, to_scheme(scheme), tensor_scale));
          },
          "codes"_a, "scales"_a, "zero_points"_a = nb::none(), nb::kw_only(), "scheme"_a, "tensor_scale"_a = nb::none(),
          "From stored arrays (e.g. `kvq quantize` output read with h5py); shapes are checked against the scheme. "
          "nvfp4 also takes its per-tensor scale")
      .def_prop_ro("scheme", [](const QuantizeResult& r) { return r.q.scheme; })
      .def_prop_ro(
          "shape",
          [](const QuantizeResult& r) {
            const Shape4 s = r.shape();
            return nb::make_tuple(s[0], s[1], s[2], s[3]);
          },
          "(B, H, T, D) of the quantized tensor")
      .def_prop_ro(
          "codes",
          [](nb::handle self) {
            const QuantizeResult& r = nb::cast<const QuantizeResult&>(self);
            const Scheme& s = r.q.scheme;
            const bool signed_codes = s.bits == 8 && !s.asymmetric && !s.fp8();
            const KvShape& x = r.q.shape;
            return readonly_view(r.q.codes.data(), {x.batch, x.heads, x.tokens, x.head_dim * s.bits / 8},
                                 signed_codes ? nb::dtype<int8_t>() : nb::dtype<uint8_t>(), self);
          },
          "int8 [B,H,T,D] (int8 symmetric, q8_0), uint8 [B,H,T,D] (int8 asymmetric; FP8 bytes), packed uint8 "
          "[B,H,T,D/2] (int4 and the 4-bit block formats: element 2i in the low nibble) or uint8 [B,H,T,5D/8] (q5_0, "
          "q5_1: the low nibbles as int4, then the fifth bits, element d at bit d%8 of byte D/2 + d/8)")
      .def_prop_ro(
          "scales",
          [](nb::handle self) {
            const QuantizeResult& r = nb::cast<const QuantizeResult&>(self);
            return params_view(r, r.q.scales, r.scale_bits, self);
          },
          "Scale per group (kvq.scale_shape), in the scheme's scale dtype")
      .def_prop_ro(
          "zero_points",
          [](nb::handle self) -> nb::object {
            const QuantizeResult& r = nb::cast<const QuantizeResult&>(self);
            if (!r.q.scheme.asymmetric) return nb::none();
            return params_view(r, r.q.zeros, r.zero_bits, self);
          },
          "Zero point per group (asymmetric schemes; q4_1 / q5_1: the block's min), else None")
      .def_prop_ro(
          "tensor_scale",
          [](const QuantizeResult& r) -> std::optional<float> {
            if (r.q.scheme.format != CodeFormat::kNvfp4) return std::nullopt;
            return r.q.tensor_scale;
          },
          "nvfp4: the fp32 per-tensor scale s_t (amax / (6 * 448) unless given), else None")
      .def_prop_ro(
          "dequantized",
          [](nb::handle self) {
            const QuantizeResult& r = nb::cast<const QuantizeResult&>(self);
            const KvShape& x = r.q.shape;
            return readonly_view(r.dequantized.data(), {x.batch, x.heads, x.tokens, x.head_dim}, nb::dtype<float>(),
                                 self);
          },
          "float32 [B, H, T, D]: q*s (symmetric) or fma(q, s, z) (asymmetric)")
      .def("__repr__", [](const QuantizeResult& r) {
        const KvShape& x = r.q.shape;
        return fmt::format("QuantizeResult('{}', shape=[{}, {}, {}, {}])", to_string(r.q.scheme), x.batch, x.heads,
                           x.tokens, x.head_dim);
      });

  m.def(
      "quantize",
      [](const AnyArray& x, const SchemeArg& scheme, const std::string& name, const std::string& layout,
         std::optional<float> tensor_scale, const std::optional<AnyArray>& seq_lens_in) {
        const Scheme s = to_scheme(scheme);
        const Fp32Tensor t = fp32_tensor(x, name, layout);
        std::vector<int32_t> seq_lens;
        if (seq_lens_in) {
          seq_lens = int32_values(*seq_lens_in, "seq_lens", {t.view.shape.batch});
          for (size_t b = 0; b < seq_lens.size(); ++b)
            if (seq_lens[b] < 0 || seq_lens[b] > t.view.shape.tokens)
              throw InputError(fmt::format("seq_lens[{}] = {}: expected 0 .. T = {}", b, seq_lens[b], t.view.shape.tokens));
        }
        nb::gil_scoped_release release;
        return QuantizeResult(quantize(t.view, s, name, seq_lens_in ? seq_lens.data() : nullptr, tensor_scale));
      },
      "x"_a, "scheme"_a, nb::kw_only(), "name"_a = "x", "layout"_a = "bnsh", "tensor_scale"_a = nb::none(),
      "seq_lens"_a = nb::none(),
      "Quantizes x [B, H, T, D] (layout 'bnsh'; 'bsnh' for [B, T, H, D]) with a scheme. float32 input is read in "
      "place; float16, bfloat16 (torch) are converted exactly, float64 is rounded to float32 (the codec's input). "
      "Raises InputError for non-finite values or a scale beyond the scale dtype, naming `name` and the index. "
      "tensor_scale: a calibrated tensor-wide scale instead of the one computed from x: nvfp4's s_t (default: amax / "
      "(6 * 448) of x) or a symmetric per-tensor scheme's scale (e.g. fp8-e4m3-tensor; stored in the scale dtype, "
      "codes saturate). seq_lens [B]: each sequence's length, which places a +w<W> window (its last W tokens, kept "
      "out of the codes; default: every sequence T long).");
  m.def(
      "to_ggml_blocks",
      [](const QuantizeResult& r) {
        const GgmlRows rows = to_ggml(r.q);  // SchemeError when the scheme has no ggml blocks
        return owned_array(rows.bytes, {rows.shape.batch, rows.shape.tokens, rows.shape.heads, rows.row_bytes});
      },
      "result"_a,
      "A block-format result (q8_0 ... nvfp4) as ggml's block structs, as a llama.cpp cache row holds them: uint8 "
      "[B, T, H, D/32 * sizeof(block)] (nvfp4: ggml's block_nvfp4 of 64; its tensor scale is result.tensor_scale)");
  m.def(
      "from_ggml_blocks",
      [](const AnyArray& blocks, const SchemeArg& scheme, const Shape4& shape, std::optional<float> tensor_scale) {
        GgmlRows rows;
        rows.scheme = to_scheme(scheme);
        rows.shape = to_kv_shape(shape);
        rows.row_bytes = ggml_row_bytes(rows.scheme, rows.shape.head_dim);
        const std::string want = shape_text({rows.shape.batch, rows.shape.tokens, rows.shape.heads, rows.row_bytes});
        if (blocks.dtype() != nb::dtype<uint8_t>() || shape_string(blocks) != want)
          throw InputError(fmt::format("blocks: expected uint8 [B, T, H, row bytes] = {}, got {} {}", want,
                                       dtype_name(blocks.dtype()), shape_string(blocks)));
        rows.bytes = contiguous_bytes(blocks, "blocks");
        rows.tensor_scale = tensor_scale_for(rows.scheme, tensor_scale);
        return QuantizeResult(from_ggml(rows));
      },
      "blocks"_a, "scheme"_a, "shape"_a, nb::kw_only(), "tensor_scale"_a = nb::none(),
      "The inverse of to_ggml_blocks: ggml block bytes [B, T, H, row bytes] of a [B, H, T, D] tensor as a "
      "QuantizeResult (nvfp4 needs its tensor_scale)");
  m.def(
      "fbgemm_rows",
      [](const QuantizeResult& r) {
        const FbgemmRows rows = to_fbgemm(r.q);  // SchemeError when the scheme has no FBGEMM layout
        return owned_array(rows.bytes, {rows.shape.batch, rows.shape.tokens, rows.shape.heads, rows.row_bytes});
      },
      "result"_a,
      "The result in FBGEMM's inline-row layout (DESIGN.md Storage): uint8 [B, T, H, D/2 + 4n], each row n x "
      "(fp16 scale, fp16 shift) then the packed codes; int4 asymmetric head or g<G> schemes with D/G in {1, 2, 4, 8}");
  m.def(
      "dequantize", [](const QuantizeResult& r) { return owned_array(dequantize(r.q), {r.q.shape.batch, r.q.shape.heads, r.q.shape.tokens, r.q.shape.head_dim}); },
      "result"_a, "Decodes codes, scales and zero points again: float32 [B, H, T, D]");
}

void bind_reference(nb::module_& m) {
  m.def("attention", &attention_py, "q"_a, "k"_a, "v"_a, nb::kw_only(), "seq_lens"_a = nb::none(),
        "softmax_scale"_a = 0.0, "alibi"_a = false, "precision"_a = "fp64", "layout"_a = "bnsh",
        "probabilities"_a = false,
        "Exact attention (kvq's reference): q [B, Hq, Tq, D], k and v [B, Hkv, T, D] ('bsnh': [B, T, Hkv, D]); "
        "query row i sits at position seq_len - Tq + i and attends causally. Returns (O [B,Hq,Tq,D], LSE [B,Hq,Tq]) "
        "in float64, and P [B,Hq,Tq,T] with probabilities=True. softmax_scale 0: 1/sqrt(D). precision: 'fp64' or a "
        "kernel profile such as 'fp32-pbf16-obf16'.");
  m.def("alibi_slopes", &alibi_slopes, "n"_a);
}

// A float tensor rounded to fp16 / bf16 / fp32 (round to nearest even, through float32, with the
// codec's own conversions), returned as float32: a cache stored in that format.
nb::object round_to_format(const AnyArray& x, const std::string& format) {
  if (format != "fp16" && format != "bf16" && format != "fp32")
    throw InputError(fmt::format("format '{}' is not fp16, bf16 or fp32", format));
  std::vector<float> values = float_values(x, "x");
  for (float& v : values) v = format == "fp16" ? round_to_fp16(v) : format == "bf16" ? round_to_bf16(v) : v;
  std::vector<int64_t> shape;
  for (size_t i = 0; i < x.ndim(); ++i) shape.push_back(static_cast<int64_t>(x.shape(i)));
  return owned_array(std::move(values), shape);
}

nb::object hadamard_rotate_back_py(const AnyArray& x, int64_t block) {
  const int64_t d = x.ndim() > 0 ? static_cast<int64_t>(x.shape(x.ndim() - 1)) : 0;
  if (block == 0) block = d;
  if (!is_power_of_two(block) || d % block != 0)
    throw InputError(fmt::format("hadamard_rotate_back: the last axis of x {} must be {}", shape_string(x),
                                 block == d ? "a power of two" : fmt::format("a multiple of the block {} (a power of two)", block)));
  std::vector<double> values = double_values(x, "x");
  for (size_t i = 0; i < values.size(); i += static_cast<size_t>(d)) hadamard_rotate_back(values.data() + i, d, block);
  std::vector<int64_t> shape;
  for (size_t i = 0; i < x.ndim(); ++i) shape.push_back(static_cast<int64_t>(x.shape(i)));
  return owned_array(std::move(values), shape);
}

void bind_metrics(nb::module_& m) {
  nb::class_<HeadError>(m, "HeadError")
      .def_ro("rel_l2", &HeadError::rel_l2)
      .def_ro("cosine", &HeadError::cosine)
      .def_ro("max_abs", &HeadError::max_abs)
      .def_ro("empty", &HeadError::empty);
  nb::class_<OutputError>(m, "OutputError")
      .def_ro("rel_l2_mean", &OutputError::rel_l2_mean)
      .def_ro("rel_l2_max", &OutputError::rel_l2_max)
      .def_ro("max_abs", &OutputError::max_abs)
      .def_ro("cosine_mean", &OutputError::cosine_mean)
      .def_ro("cosine_min", &OutputError::cosine_min)
      .def("__repr__", [](const OutputError& e) {
        return fmt::format("OutputError(rel_l2_mean={:g}, rel_l2_max={:g}, max_abs={:g}, cosine_mean={:g}, cosine_min={:g})",
                           e.rel_l2_mean, e.rel_l2_max, e.max_abs, e.cosine_mean, e.cosine_min);
      });
  nb::class_<ProbabilityError>(m, "ProbabilityError")
      .def_ro("kl_mean", &ProbabilityError::kl_mean)
      .def_ro("kl_max", &ProbabilityError::kl_max)
      .def_ro("topk_overlap_mean", &ProbabilityError::topk_overlap_mean)
      .def_ro("topk_overlap_min", &ProbabilityError::topk_overlap_min)
      .def("__repr__", [](const ProbabilityError& e) {
        return fmt::format("ProbabilityError(kl_mean={:g}, kl_max={:g}, topk_overlap_mean={:g}, topk_overlap_min={:g})",
                           e.kl_mean, e.kl_max, e.topk_overlap_mean, e.topk_overlap_min);
      });

  m.def(
      "sqnr_db",
      [](const AnyArray& x, const AnyArray& x_hat) {
        if (shape_string(x) != shape_string(x_hat))
          throw InputError(fmt::format("x has shape {}, x_hat has {}: expected equal shapes", shape_string(x),
                                       shape_string(x_hat)));
        return sqnr_db(float_values(x, "x"), float_values(x_hat, "x_hat"));
      },
      "x"_a, "x_hat"_a, "10 log10(sum x^2 / sum (x - x_hat)^2) in dB (values taken as float32); inf when equal");
  // head_errors and output_error take the same arguments: [heads, values_per_head] outputs
  auto per_head = [](auto metric) {
    return [metric](const AnyArray& o_test, const AnyArray& o_ref, std::optional<int64_t> values) {
      auto [test, ref] = same_shape_doubles(o_test, o_ref, "o_test", "o_ref");
      return metric(test, ref, values_per_head(o_ref, values));
    };
  };
  m.def("head_errors", per_head([](const auto&... a) { return head_errors(a...); }), "o_test"_a, "o_ref"_a,
        "values_per_head"_a = nb::none(),
        "Error of each head (one (b, query head): values_per_head values, default the last two axes)");
  m.def("output_error", per_head([](const auto&... a) { return output_error(a...); }), "o_test"_a, "o_ref"_a,
        "values_per_head"_a = nb::none(),
        "Attention output vs a reference: rel-L2 mean and max over heads, max abs, cosine (kvq sweep's columns)");
  m.def(
      "probability_error",
      [](const AnyArray& p_test, const AnyArray& p_ref, std::optional<int64_t> row_length, int64_t k) {
        auto [test, ref] = same_shape_doubles(p_test, p_ref, "p_test", "p_ref");
        const int64_t n = row_length ? *row_length : static_cast<int64_t>(p_ref.ndim() ? p_ref.shape(p_ref.ndim() - 1) : 0);
        if (n <= 0 || test.size() % static_cast<size_t>(n) != 0)
          throw InputError(fmt::format("row_length {} does not divide {} values", n, test.size()));
        return probability_error(test, ref, n, k);
      },
      "p_test"_a, "p_ref"_a, "row_length"_a = nb::none(), "k"_a = 8,
      "KL(P_ref || P_test) per row (mean, max, nats) and top-k overlap; rows of the last axis by default");
  m.def("bytes_per_token_per_head", [](const SchemeArg& s, const Shape4& shape) {
    return bytes_per_token_per_head(to_scheme(s), to_kv_shape(shape)); }, "scheme"_a, "shape"_a,
        "Bytes per token per KV head, codes plus scales / zero points, for a [B, H, T, D] tensor");
  m.def("bits_per_element", [](const SchemeArg& s, const Shape4& shape) {
    return bits_per_element(to_scheme(s), to_kv_shape(shape)); }, "scheme"_a, "shape"_a);
  m.def("elements_per_group", [](const SchemeArg& s, const Shape4& shape) {
    return elements_per_group(to_scheme(s), to_kv_shape(shape)); }, "scheme"_a, "shape"_a);
}

// kvq.Error (RuntimeError) > kvq.InputError (also a ValueError) > kvq.SchemeError, raised with
// kvq's own one-line messages.
void bind_errors(nb::module_& m) {
  static PyObject* error = PyErr_NewException("kvq.Error", PyExc_RuntimeError, nullptr);
  static PyObject* input_error = PyErr_NewException("kvq.InputError", nb::make_tuple(nb::handle(error),
                                                    nb::handle(PyExc_ValueError)).ptr(), nullptr);
  static PyObject* scheme_error = PyErr_NewException("kvq.SchemeError", input_error, nullptr);
  m.attr("Error") = nb::handle(error);
  m.attr("InputError") = nb::handle(input_error);
  m.attr("SchemeError") = nb::handle(scheme_error);
  translate_kvq_errors(error, input_error, scheme_error);
}

}  // namespace
}  // namespace kvq

NB_MODULE(_core, m) {
  m.doc() = "kvq's CPU codec, fp64 reference attention and error metrics (the C++ library, bound with nanobind)";
  m.attr("__version__") = KVQ_VERSION;
  kvq::bind_errors(m);
  kvq::bind_scheme(m);
  kvq::bind_codec(m);
  kvq::bind_reference(m);
  kvq::bind_metrics(m);
  m.def("round_to_format", &kvq::round_to_format, "x"_a, "format"_a);
  m.def("hadamard_rotate_back", &kvq::hadamard_rotate_back_py, "x"_a, "block"_a = 0,
        "x [..., D] from the +had basis back to the input basis, in float64: the whole row (block 0; D a power "
        "of two) or blocks of `block` elements (+had<N>: scheme.rotation_block(D))");
}
