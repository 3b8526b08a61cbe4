// kvq quantize: write codes, scales, zero points (planar layout) and dequantized K/V of a dump.
#include <fmt/format.h>

#include <memory>

#include "data/dump.hpp"
#include "data/h5_writer.hpp"
#include "experiments/cli/commands.hpp"
#include "experiments/common/dump_check.hpp"
#include "experiments/common/run_info.hpp"
#include "experiments/sweep/sweep.hpp"
#include "quant/block_quantize.hpp"
#include "quant/quantize.hpp"
#include "reference/metrics.hpp"

namespace kvq {
namespace {

struct QuantizeArgs {
  std::string in, out, k_scheme, v_scheme;
  std::vector<int> layers;
};

// /layers/<L>/<name>/{codes, scales, zero_points, dequantized} and the scheme as attributes.
// (+had: codes and dequantized values are in the rotated basis, the SQNR against the rotated input.)
// mxfp4 / nvfp4 scales are their e8m0 / e4m3 bytes; nvfp4's tensor scale is the attribute tensor_scale.
// `valid`: the input with its padding zeroed (ValidTokens::zeroed); the SQNR is over valid tokens.
double write_tensor(H5Writer& f, const std::string& group, const QuantizedKv& q, const std::vector<float>& valid,
                    const std::vector<int32_t>& seq_lens) {
  const Scheme& s = q.scheme;
  const KvShape& x = q.shape;
  std::vector<float> values = dequantize(q);
  f.write_bytes(group + "/codes", {x.batch, x.heads, x.tokens, code_bytes_per_row(s, x.head_dim)}, q.codes,
                s.bits == 8 && s.signed_codes());
  const StoredDtype scale_dtype = s.scale_dtype == ScaleDtype::kFp16 ? StoredDtype::kFp16 : StoredDtype::kFp32;
  if (s.scale_dtype == ScaleDtype::kE8M0 || s.scale_dtype == ScaleDtype::kE4M3) {
    std::vector<uint8_t> bytes;
    for (float v : q.scales) bytes.push_back(scale_byte(s.scale_dtype, v));
    f.write_bytes(group + "/scales", scale_shape(s, x), bytes, false);
  } else if (!s.scale_free) {  // exact: values are in the scale dtype
    f.write_floats(group + "/scales", scale_shape(s, x), q.scales, scale_dtype);
  }
  if (s.asymmetric) f.write_floats(group + "/zero_points", scale_shape(s, x), q.zeros, scale_dtype);
  if (s.has_window()) f.write_int32(group + "/quantized_tokens", {x.batch}, q.quantized_tokens);
  f.write_floats(group + "/dequantized", {x.batch, x.heads, x.tokens, x.head_dim}, values, StoredDtype::kFp32);
  std::vector<float> reference = valid;
  if (s.hadamard) rotate_rows(reference, x.head_dim, s.rotation_block(x.head_dim));  // zero rows stay zero
  zero_padding(values, x, seq_lens);  // after /dequantized is written: the file keeps every position
  const double sqnr = sqnr_db(reference, values);
  f.set_attr(group, "scheme", to_string(s));
  f.set_attr(group, "bits", static_cast<int64_t>(s.bits));
  f.set_attr(group, "granularity", granularity_name(s.granularity));
  f.set_attr(group, "group", static_cast<int64_t>(s.group));
  f.set_bool_attr(group, "asymmetric", s.asymmetric);
  f.set_attr(group, "scale_dtype", s.scale_free ? "none" : scale_dtype_name(s.scale_dtype));
  f.set_attr(group, "format", format_name(s));
  if (s.format == CodeFormat::kNvfp4) f.set_attr(group, "tensor_scale", static_cast<double>(q.tensor_scale));
  f.set_bool_attr(group, "hadamard", s.hadamard);
  f.set_attr(group, "hadamard_block", s.hadamard ? s.rotation_block(x.head_dim) : int64_t{0});
  f.set_attr(group, "window", static_cast<int64_t>(s.window));
  f.set_attr(group, "layout", "planar");
  f.set_attr(group, "sqnr_db", sqnr);
  return sqnr;
}

int run(const QuantizeArgs& a) {
  refuse_output_over_input(a.out, a.in);
  const Scheme k_scheme = parse_scheme(a.k_scheme), v_scheme = parse_scheme(a.v_scheme);
  const DumpInfo info = open_dump_checked(a.in, a.layers);
  const std::vector<size_t> layers = select_layers(info, a.layers);
  for (size_t i : layers) {  // before the output file exists; only the layers asked for (D may differ)
    const LayerInfo& l = info.layers[i];
    try {
      check_scheme_fits(k_scheme, static_cast<int>(l.head_dim));
      check_scheme_fits(v_scheme, static_cast<int>(l.head_dim));
    } catch (const SchemeError& e) {
      throw SchemeError(fmt::format("{}: /layers/{}: {}", a.in, l.name, e.what()));
    }
  }
  H5Writer f(a.out);
  f.set_attr("/", "kvq_quantized", int64_t{1});
  f.set_attr("/", "source", info.source);
  f.set_attr("/", "input", a.in);
  f.set_attr("/", "rope", info.rope);
  f.set_attr("/", "created_by", "kvq quantize " + kvq_version() + " (" + kvq_commit() + ")");
  f.set_attr("/", "k_scheme", to_string(k_scheme));
  f.set_attr("/", "v_scheme", to_string(v_scheme));
  fmt::print("{:>5}  {:<23} {:>8}  {:<23} {:>8}\n", "layer", "K scheme", "SQNR dB", "V scheme", "SQNR dB");
  for (size_t i : layers) {
    const int index = info.layers[i].index;
    const KvLayer layer = read_layer(info, i);
    const std::string group = "/layers/" + std::to_string(index);
    const std::string where = a.in + " layer " + std::to_string(index);
    const int32_t* lens = layer.seq_lens.empty() ? nullptr : layer.seq_lens.data();
    // Padding may hold anything (NaN too): it must neither fail the run nor move a scale.
    const ValidTokens k(layer.k, layer.kv_shape, layer.seq_lens), v(layer.v, layer.kv_shape, layer.seq_lens);
    const double ks = write_tensor(
        f, group + "/k", quantize(KvView::bnsh(k.filled().data(), layer.kv_shape), k_scheme, where + " K", lens),
        k.zeroed(), layer.seq_lens);
    const double vs = write_tensor(
        f, group + "/v", quantize(KvView::bnsh(v.filled().data(), layer.kv_shape), v_scheme, where + " V", lens),
        v.zeroed(), layer.seq_lens);
    fmt::print("{:>5}  {:<23} {:>8.2f}  {:<23} {:>8.2f}\n", index, to_string(k_scheme), ks, to_string(v_scheme), vs);
  }
  f.close();
  fmt::print("wrote {}\n", a.out);
  return 0;
}

}  // namespace

Command add_quantize_command(CLI::App& parent) {
  auto a = std::make_shared<QuantizeArgs>();
  CLI::App* cmd = parent.add_subcommand(
      "quantize", "Quantize a dump's K and V: codes, scales, zero points (planar layout) and dequantized values");
  cmd->add_option("input", a->in, "HDF5 dump (schema v1)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--k", a->k_scheme, "K scheme, e.g. int4-g32-asym, fp8-e4m3-head, int4-chan-t32-asym+w128")->required();
  cmd->add_option("--v", a->v_scheme, "V scheme, e.g. int8-head")->required();
  cmd->add_option("--out", a->out, "Output HDF5 file")->required();
  cmd->add_option("--layers", a->layers, "Layer indices (default: all)")->delimiter(',');
  return {cmd, [a] { return run(*a); }};
}

}  // namespace kvq
