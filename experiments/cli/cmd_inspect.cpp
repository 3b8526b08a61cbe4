// kvq inspect: what a dump holds, and per-layer K/V statistics including the K outlier channels
// that decide between per-token and per-channel K quantization.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include "data/dump.hpp"
#include "experiments/cli/commands.hpp"
#include "experiments/common/dump_check.hpp"

namespace kvq {
namespace {

struct TensorStats {
  double min = INFINITY, max = -INFINITY, sum_abs = 0, sum_sq = 0;
  int64_t count = 0, non_finite = 0;
  std::vector<double> channel_max_abs;  // [D]
};

// Over valid positions (t < seq_len) only: padding may hold anything.
TensorStats stats_of(const std::vector<float>& x, const KvShape& s, const std::vector<int32_t>& seq_lens) {
  TensorStats st;
  st.channel_max_abs.assign(s.head_dim, 0.0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t t = 0; t < seq_lens[b]; ++t)
        for (int64_t d = 0; d < s.head_dim; ++d) {
          const double v = x[((b * s.heads + h) * s.tokens + t) * s.head_dim + d];
          if (!std::isfinite(v)) {
            ++st.non_finite;
            continue;
          }
          st.min = std::min(st.min, v), st.max = std::max(st.max, v);
          st.sum_abs += std::abs(v), st.sum_sq += v * v;
          st.channel_max_abs[d] = std::max(st.channel_max_abs[d], std::abs(v));
          ++st.count;
        }
  return st;
}

void print_stats_row(const std::string& layer, const char* name, const TensorStats& s) {
  const double n = s.count ? static_cast<double>(s.count) : 1.0;
  fmt::print("{:>5}  {:<3} {:>11.4g} {:>11.4g} {:>11.4g} {:>11.4g} {:>10}\n", layer, name, s.min, s.max, s.sum_abs / n,
             std::sqrt(s.sum_sq / n), s.non_finite);
}

int run(const std::string& path) {
  const DumpInfo info = open_dump_checked(path);
  const auto [min_len, max_len] = std::minmax_element(info.seq_lens.begin(), info.seq_lens.end());
  fmt::print("file        {}\nschema      {}\nsource      {}\ncreated_by  {}\nrope        {} (K is {})\n", path,
             info.schema, info.source, info.created_by, info.rope,
             info.rope == "post" ? "post-RoPE" : info.rope == "pre" ? "pre-RoPE" : "without RoPE");
  if (!info.rope_pairs.empty())
    fmt::print("rope pairs  {}\n", info.rope_pairs == "half" ? "half: channels (i, i + D/2), Hugging Face / vLLM order"
                                                            : "adjacent: channels (2i, 2i + 1), llama.cpp order");
  fmt::print("B x T       {} x {}   seq_lens {}   token ids {}\n\n", info.batch, info.tokens,
             info.has_seq_lens ? fmt::format("{}..{}", *min_len, *max_len) : "all T (none stored)",
             info.has_tokens ? "yes" : "no");
  fmt::print("{:>5}  {:<18} {:<9} {:>4} {:>4} {:>4}  {:<12} {:<6} {}\n", "layer", "K/V shape", "dtype", "Hq", "Hkv",
             "D", "Q", "alibi", "softmax scale");
  for (const LayerInfo& l : info.layers)
    fmt::print("{:>5}  {:<18} {:<9} {:>4} {:>4} {:>4}  {:<12} {:<6} {}\n", l.index, fmt::format("[{}]", fmt::join(l.k.shape, ", ")),
               to_string(l.k.dtype), l.num_q_heads, l.num_kv_heads, l.head_dim,
               l.q ? fmt::format("Tq={}", l.q->shape[2]) : "none", l.alibi ? "yes" : "no",
               l.softmax_scale > 0 ? fmt::format("{:.6g}", l.softmax_scale) : "1/sqrt(D)");

  fmt::print("\nstatistics over valid positions (K, V: t < seq_len; Q: every row)\n");
  fmt::print("{:>5}  {:<3} {:>11} {:>11} {:>11} {:>11} {:>10}\n", "layer", "", "min", "max", "mean |x|", "rms", "non-finite");
  std::vector<std::string> outliers;
  for (size_t i = 0; i < info.layers.size(); ++i) {
    const KvLayer layer = read_layer(info, i);  // one layer in memory at a time
    const TensorStats k = stats_of(layer.k, layer.kv_shape, layer.seq_lens);
    const TensorStats v = stats_of(layer.v, layer.kv_shape, layer.seq_lens);
    print_stats_row(std::to_string(layer.layer), "K", k);
    print_stats_row("", "V", v);
    if (layer.has_queries())  // every query row (sweep and reference reject a non-finite one)
      print_stats_row("", "Q", stats_of(layer.q, layer.q_shape,
                                        std::vector<int32_t>(layer.q_shape.batch, static_cast<int32_t>(layer.q_shape.tokens))));

    std::vector<int64_t> order(k.channel_max_abs.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return k.channel_max_abs[a] > k.channel_max_abs[b]; });
    std::vector<double> sorted = k.channel_max_abs;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    const double median = sorted[sorted.size() / 2];
    std::string line = fmt::format("{:>5}  ", layer.layer);
    for (size_t j = 0; j < std::min<size_t>(5, order.size()); ++j) {
      const double m = k.channel_max_abs[order[j]];
      line += fmt::format("  d={} {:.4g} ({:.1f}x)", order[j], m, median > 0 ? m / median : 0.0);
    }
    outliers.push_back(line);
  }
  fmt::print("\ntop-5 K channels by max |K| (x: ratio to the median channel's max |K|)\n");
  for (const std::string& line : outliers) fmt::print("{}\n", line);
  return 0;
}

}  // namespace

Command add_inspect_command(CLI::App& parent) {
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = parent.add_subcommand("inspect", "Show a dump's layers, shapes, dtypes, source and K/V statistics");
  cmd->add_option("file", *path, "HDF5 dump (schema v1)")->required();
  return {cmd, [path] { return run(*path); }};
}

}  // namespace kvq
