#include "experiments/sweep/sweep_checkpoint.hpp"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "quant/errors.hpp"

namespace kvq {
namespace {

nlohmann::json number(double x) {
  if (std::isfinite(x)) return x;
  return std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf";
}

double number(const nlohmann::json& j) {
  if (j.is_number()) return j.get<double>();
  const std::string s = j.get<std::string>();
  if (s == "inf") return INFINITY;
  if (s == "-inf") return -INFINITY;
  if (s == "nan") return NAN;
  throw InputError(fmt::format("sweep checkpoint: '{}' is not a number", s));
}

}  // namespace

std::string sweep_settings(const std::vector<SchemePair>& pairs, const SweepOptions& options) {
  std::string s = fmt::format("top_k={};pairs=", options.top_k);
  for (const SchemePair& p : pairs) s += to_string(p.k) + "/" + to_string(p.v) + ",";
  return s;
}

nlohmann::json to_json(const SweepRow& r) {
  nlohmann::json heads = nlohmann::json::array();
  for (const HeadError& h : r.heads) heads.push_back({number(h.rel_l2), number(h.cosine), number(h.max_abs), h.empty});
  const OutputError& o = r.output;
  const ProbabilityError& p = r.probabilities;
  return {{"source", r.source},
          {"layer", r.layer},
          {"k_scheme", to_string(r.schemes.k)},
          {"v_scheme", to_string(r.schemes.v)},
          {"reconstruction", {number(r.k_sqnr_db), number(r.k_max_abs), number(r.v_sqnr_db), number(r.v_max_abs)}},
          {"has_attention", r.has_attention},
          {"output", {number(o.rel_l2_mean), number(o.rel_l2_max), number(o.max_abs), number(o.cosine_mean),
                      number(o.cosine_min)}},
          {"heads", heads},
          {"q_heads", r.q_heads},
          {"probabilities", {number(p.kl_mean), number(p.kl_max), number(p.topk_overlap_mean), number(p.topk_overlap_min)}},
          {"memory", {number(r.k_bytes_per_token_head), number(r.v_bytes_per_token_head), number(r.kv_bits_per_element)}},
          {"group_elems", {r.k_group_elems, r.v_group_elems}}};
}

SweepRow sweep_row_from_json(const nlohmann::json& j) {
  SweepRow r;
  r.source = j.at("source").get<std::string>();
  r.layer = j.at("layer").get<int>();
  r.schemes = {parse_scheme(j.at("k_scheme").get<std::string>()), parse_scheme(j.at("v_scheme").get<std::string>())};
  const nlohmann::json& rec = j.at("reconstruction");
  r.k_sqnr_db = number(rec.at(0)), r.k_max_abs = number(rec.at(1)), r.v_sqnr_db = number(rec.at(2));
  r.v_max_abs = number(rec.at(3));
  r.has_attention = j.at("has_attention").get<bool>();
  const nlohmann::json& o = j.at("output");
  r.output = {number(o.at(0)), number(o.at(1)), number(o.at(2)), number(o.at(3)), number(o.at(4))};
  for (const nlohmann::json& h : j.at("heads"))
    r.heads.push_back({number(h.at(0)), number(h.at(1)), number(h.at(2)), h.at(3).get<bool>()});
  r.q_heads = j.at("q_heads").get<int64_t>();
  const nlohmann::json& p = j.at("probabilities");
  r.probabilities = {number(p.at(0)), number(p.at(1)), number(p.at(2)), number(p.at(3))};
  const nlohmann::json& m = j.at("memory");
  r.k_bytes_per_token_head = number(m.at(0)), r.v_bytes_per_token_head = number(m.at(1));
  r.kv_bits_per_element = number(m.at(2));
  r.k_group_elems = j.at("group_elems").at(0).get<int64_t>(), r.v_group_elems = j.at("group_elems").at(1).get<int64_t>();
  return r;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    out.flush();
    if (!out) throw InputError(fmt::format("cannot write '{}'", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw InputError(fmt::format("cannot rename '{}' to '{}': {}", tmp, path, ec.message()));
}

std::string SweepCheckpoint::file_of(const SweepUnitKey& key) const {
  return fmt::format("{}/{}-layer{}.json", dir_, key.dump_sha256.substr(0, 16), key.layer);
}

SweepCheckpoint::Found SweepCheckpoint::find(const SweepUnitKey& key, std::vector<SweepRow>* rows) const {
  std::ifstream in(file_of(key));
  if (!in) return Found::kNone;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.at("sha256") != key.dump_sha256 || j.at("layer") != key.layer || j.at("settings") != key.settings)
      return Found::kStale;
    rows->clear();
    for (const nlohmann::json& r : j.at("rows")) rows->push_back(sweep_row_from_json(r));
    return Found::kMatch;
  } catch (const std::exception&) {  // unreadable (e.g. an older format): recompute the unit
    return Found::kStale;
  }
}

void SweepCheckpoint::save(const SweepUnitKey& key, const std::string& dump_path, const std::vector<SweepRow>& rows) const {
  std::filesystem::create_directories(dir_);
  nlohmann::json j = {{"dump", dump_path}, {"sha256", key.dump_sha256}, {"layer", key.layer},
                      {"settings", key.settings}, {"rows", nlohmann::json::array()}};
  for (const SweepRow& r : rows) j["rows"].push_back(to_json(r));
  write_file_atomically(file_of(key), j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void SweepCheckpoint::remove_all() const {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace kvq
