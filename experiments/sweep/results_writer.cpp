#include "experiments/sweep/results_writer.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "experiments/common/run_info.hpp"
#include "quant/errors.hpp"

namespace kvq {
namespace {

std::ofstream open_for_writing(const std::string& path) {
  std::ofstream out(path);
  if (!out) throw InputError(fmt::format("cannot write '{}'", path));
  return out;
}

void finish(std::ofstream& out, const std::string& path) {
  out.flush();
  if (!out) throw InputError(fmt::format("error while writing '{}'", path));
}

// bits, granularity, asym, elements per group of one scheme.
std::string scheme_columns(const Scheme& s, int64_t group_elems) {
  return fmt::format("{},{},{},{}", s.bits, s.scale_free ? "none" : granularity_name(s.granularity), s.asymmetric ? 1 : 0,
                     group_elems);
}

}  // namespace

std::string csv_quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

void write_sweep_csv(const std::vector<SweepRow>& rows, const std::string& path) {
  std::ofstream out = open_for_writing(path);
  out << "source,dump,layer,k_scheme,v_scheme,k_bits,k_granularity,k_asym,k_group_elems,v_bits,v_granularity,v_asym,"
         "v_group_elems,k_bytes_per_token_head,v_bytes_per_token_head,kv_bits_per_element,k_sqnr_db,k_max_abs,"
         "v_sqnr_db,v_max_abs,out_rel_l2_mean,out_rel_l2_max,out_max_abs,out_cosine_mean,out_cosine_min,attn_kl_mean,"
         "attn_kl_max,attn_topk_overlap_mean,attn_topk_overlap_min";
  // Latency columns only when a GPU measured them (a CPU sweep's file keeps its schema).
  const bool latency = std::any_of(rows.begin(), rows.end(), [](const SweepRow& r) { return r.latency.has_value(); });
  out << (latency ? ",decode_variant,latency_shape,latency_us,latency_gbps\n" : "\n");
  for (const SweepRow& r : rows) {
    out << fmt::format("{},{},{},{},{},{},{},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g}",
                       csv_quoted(r.source), r.dump, r.layer, to_string(r.schemes.k), to_string(r.schemes.v),
                       scheme_columns(r.schemes.k, r.k_group_elems), scheme_columns(r.schemes.v, r.v_group_elems),
                       r.k_bytes_per_token_head, r.v_bytes_per_token_head, r.kv_bits_per_element, r.k_sqnr_db,
                       r.k_max_abs, r.v_sqnr_db, r.v_max_abs);
    if (r.has_attention) {
      const OutputError& o = r.output;
      const ProbabilityError& p = r.probabilities;
      out << fmt::format(",{:.9g},{:.9g},{:.9g},{:.12g},{:.12g},{:.9g},{:.9g},{:.9g},{:.9g}", o.rel_l2_mean,
                         o.rel_l2_max, o.max_abs, o.cosine_mean, o.cosine_min, p.kl_mean, p.kl_max,
                         p.topk_overlap_mean, p.topk_overlap_min);
    } else {
      out << ",,,,,,,,,";
    }
    if (latency && r.latency)
      out << fmt::format(",{},{},{:.3f},{:.1f}", r.latency->variant, csv_quoted(r.latency->shape), r.latency->us,
                         r.latency->gbps);
    else if (latency)
      out << ",,,,";
    out << "\n";
  }
  finish(out, path);
}

void write_head_csv(const std::vector<SweepRow>& rows, const std::string& path) {
  std::ofstream out = open_for_writing(path);
  out << "source,dump,layer,k_scheme,v_scheme,batch,q_head,rel_l2,cosine,max_abs\n";
  for (const SweepRow& r : rows)
    for (size_t i = 0; i < r.heads.size(); ++i) {
      const HeadError& h = r.heads[i];
      out << fmt::format("{},{},{},{},{},{},{},", csv_quoted(r.source), r.dump, r.layer, to_string(r.schemes.k),
                         to_string(r.schemes.v), i / r.q_heads, i % r.q_heads);
      out << (h.empty ? std::string(",,") : fmt::format("{:.9g},{:.12g},", h.rel_l2, h.cosine));
      out << fmt::format("{:.9g}\n", h.max_abs);
    }
  finish(out, path);
}

void write_json(const nlohmann::json& document, const std::string& path) {
  std::ofstream out = open_for_writing(path);
  out << document.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";  // U+FFFD for bad UTF-8
  finish(out, path);
}

void write_sweep_results(const std::string& dir, const std::vector<SweepRow>& rows, const nlohmann::json& sources,
                         int64_t top_k, bool complete) {
  std::filesystem::create_directories(dir);
  auto atomically = [](const std::string& path, auto&& write) {
    write(path + ".tmp");
    std::filesystem::rename(path + ".tmp", path);
  };
  atomically(dir + "/sweep.csv", [&](const std::string& p) { write_sweep_csv(rows, p); });
  atomically(dir + "/sweep_heads.csv", [&](const std::string& p) { write_head_csv(rows, p); });
  // One flat record per source, so that pandas.read_json reads the file as a table.
  nlohmann::json records = nlohmann::json::array();
  for (nlohmann::json source : sources) {
    source["dump"] = records.size();  // what the CSVs' dump column points at
    source.update(run_info());
    source.update({{"command", "sweep"}, {"result_rows", rows.size()}, {"top_k", top_k}, {"csv", "sweep.csv"},
                   {"heads_csv", "sweep_heads.csv"}, {"complete", complete}});
    records.push_back(source);
  }
  atomically(dir + "/sweep.json", [&](const std::string& p) { write_json(records, p); });
}

void print_sweep_table(const std::vector<SweepRow>& rows, std::FILE* out) {
  fmt::print(out, "{:>5}  {:<23} {:<20} {:>6} {:>8} {:>8} {:>10} {:>10} {:>9} {:>9} {:>6}\n", "layer", "K scheme",
             "V scheme", "bits", "K SQNR", "V SQNR", "rel-L2", "rel-L2", "cosine", "KL", "top-k");
  fmt::print(out, "{:>5}  {:<23} {:<20} {:>6} {:>8} {:>8} {:>10} {:>10} {:>9} {:>9} {:>6}\n", "", "", "", "/elem",
             "dB", "dB", "mean", "max", "min", "mean", "mean");
  for (const SweepRow& r : rows) {
    fmt::print(out, "{:>5}  {:<23} {:<20} {:>6.2f} {:>8.2f} {:>8.2f}", r.layer, to_string(r.schemes.k),
               to_string(r.schemes.v), r.kv_bits_per_element, r.k_sqnr_db, r.v_sqnr_db);
    if (r.has_attention)
      fmt::print(out, " {:>10.3e} {:>10.3e} {:>9.6f} {:>9.2e} {:>6.3f}\n", r.output.rel_l2_mean, r.output.rel_l2_max,
                 r.output.cosine_min, r.probabilities.kl_mean, r.probabilities.topk_overlap_mean);
    else
      fmt::print(out, " {:>10} {:>10} {:>9} {:>9} {:>6}\n", "-", "-", "-", "-", "-");
  }
}

}  // namespace kvq
