#include "experiments/results_writer.hpp"

#include <fmt/format.h>

#include <fstream>

#include "quant/errors.hpp"

namespace kvq {
namespace {

std::ofstream open_for_writing(const std::string& path) {
  std::ofstream out(path);
  if (!out) throw InputError(fmt::format("cannot write '{}'", path));
  return out;
}

std::string quoted(const std::string& s) {  // CSV field quoting (sources contain commas)
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

void write_sweep_csv(const std::vector<SweepRow>& rows, const std::string& path) {
  std::ofstream out = open_for_writing(path);
  out << "source,layer,k_scheme,v_scheme,k_bytes_per_token_head,v_bytes_per_token_head,kv_bits_per_element,"
         "k_sqnr_db,k_max_abs,v_sqnr_db,v_max_abs,out_rel_l2_mean,out_rel_l2_max,out_max_abs,out_cosine_mean,"
         "out_cosine_min,attn_kl_mean,attn_kl_max,attn_topk_overlap_mean,attn_topk_overlap_min\n";
  for (const SweepRow& r : rows) {
    out << fmt::format("{},{},{},{},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g}", quoted(r.source), r.layer,
                       to_string(r.schemes.k), to_string(r.schemes.v), r.k_bytes_per_token_head,
                       r.v_bytes_per_token_head, r.kv_bits_per_element, r.k_sqnr_db, r.k_max_abs, r.v_sqnr_db,
                       r.v_max_abs);
    if (r.has_attention) {
      const OutputError& o = r.output;
      const ProbabilityError& p = r.probabilities;
      out << fmt::format(",{:.9g},{:.9g},{:.9g},{:.12g},{:.12g},{:.9g},{:.9g},{:.9g},{:.9g}\n", o.rel_l2_mean,
                         o.rel_l2_max, o.max_abs, o.cosine_mean, o.cosine_min, p.kl_mean, p.kl_max,
                         p.topk_overlap_mean, p.topk_overlap_min);
    } else {
      out << ",,,,,,,,,\n";
    }
  }
  if (!out) throw InputError(fmt::format("error while writing '{}'", path));
}

void write_json(const nlohmann::json& document, const std::string& path) {
  std::ofstream out = open_for_writing(path);
  out << document.dump(2) << "\n";
  if (!out) throw InputError(fmt::format("error while writing '{}'", path));
}

void print_sweep_table(const std::vector<SweepRow>& rows, std::FILE* out) {
  fmt::print(out, "{:>5}  {:<20} {:<18} {:>6} {:>8} {:>8} {:>10} {:>10} {:>9} {:>9} {:>6}\n", "layer", "K scheme",
             "V scheme", "bits", "K SQNR", "V SQNR", "rel-L2", "rel-L2", "cosine", "KL", "top-8");
  fmt::print(out, "{:>5}  {:<20} {:<18} {:>6} {:>8} {:>8} {:>10} {:>10} {:>9} {:>9} {:>6}\n", "", "", "", "/elem",
             "dB", "dB", "mean", "max", "min", "mean", "mean");
  for (const SweepRow& r : rows) {
    fmt::print(out, "{:>5}  {:<20} {:<18} {:>6.2f} {:>8.2f} {:>8.2f}", r.layer, to_string(r.schemes.k),
               to_string(r.schemes.v), r.kv_bits_per_element, r.k_sqnr_db, r.v_sqnr_db);
    if (r.has_attention)
      fmt::print(out, " {:>10.3e} {:>10.3e} {:>9.6f} {:>9.2e} {:>6.3f}\n", r.output.rel_l2_mean, r.output.rel_l2_max,
                 r.output.cosine_min, r.probabilities.kl_mean, r.probabilities.topk_overlap_mean);
    else
      fmt::print(out, "   (attention metrics need decode queries Q)\n");
  }
}

}  // namespace kvq
