// kvq bench: every decode variant on the DESIGN.md shapes, for each K/V storage, timed with
// CUDA-graph replays over rotating caches (>= 4x L2), beside the read and copy bandwidth of the
// same process and the peers (cuDNN, FlashAttention-2, FBGEMM's INT4 gqa_attn_splitk) timed by
// experiments/bench/bench_peers.py in the same device run. One CSV schema for kvq and peers; a
// ratio-to-cuDNN table printed last.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "experiments/bench/bench_shapes.hpp"
#include "experiments/cli/commands.hpp"
#include "experiments/cli/number_checks.hpp"
#include "experiments/cluster/bench_shards.hpp"
#include "experiments/common/csv_table.hpp"
#include "experiments/common/gpu_run_info.hpp"
#include "experiments/sweep/results_writer.hpp"
#include "quant/errors.hpp"

namespace kvq {
namespace {

struct BenchArgs {
  std::string csv = "results/bench/decode.csv", peers, variant = ".", schemes = kBenchStorages, shapes = ".";
  int reps = 50, calls_per_graph = 8, splits = 0;  // splits 0: the heuristic
  std::string plan, shard, gpu, out = "results/bench/shard";  // one shard of a study (kvq plan bench)
};

const char* kColumns =
    "shape,B,HQ,HKV,T,D,kernel,k_scheme,v_scheme,layout,splits,heads_per_cta,median_us,p10_us,p90_us,reps,calls_per_graph,"
    "input_sets,bytes,GBps,pct_of_read,read_GBps,copy_GBps,vs_cudnn,floor_us,gpu,driver,cuda,commit";

struct Row {
  Row(const DecodeShape& sh, std::string kernel_name, std::string storage_name)
      : shape(sh.group), kernel(std::move(kernel_name)), storage(std::move(storage_name)), B(sh.batch),
        HQ(sh.q_heads), HKV(sh.kv_heads), T(sh.tokens), D(sh.head_dim) {}
  std::string shape, kernel, storage;
  int64_t B, HQ, HKV, T, D;
  int splits = 0, heads_per_cta = 0, sets = 1;
  GpuTiming t;
  int64_t bytes = 0;
};

using PeerKey = std::tuple<std::string, int64_t, int64_t, std::string>;  // shape, B, T, peer

// The peers bench_peers.py writes, by kernel name; `layout` is the suffix of the kvq storage that
// holds the same bytes (FBGEMM's INT4 rows are kvq's `<scheme>:fbgemm`); `ratio` puts the peer in
// the ratio table beside kvq's storages (cuDNN and FlashAttention-2 are its first columns).
struct PeerKind {
  const char* kernel;
  const char* layout;
  bool ratio;
};
constexpr PeerKind kPeers[] = {{"cudnn", "", false},          {"flash2", "", false},
                               {"fbgemm-int4-g1", ":fbgemm", true}, {"fbgemm-int4-g4", ":fbgemm", true},
                               {"flashinfer-bf16", "", true},  {"flashinfer-fp8-e4m3", "", true}};

// Rows of bench_peers.py's CSV (same schema) by (shape, B, T, peer).
std::map<PeerKey, size_t> index_peers(const CsvTable& t) {
  std::map<PeerKey, size_t> out;
  for (size_t r = 0; r < t.rows(); ++r)
    out[{t.at(r, t.column("shape")), static_cast<int64_t>(t.number(r, t.column("B"))),
         static_cast<int64_t>(t.number(r, t.column("T"))), t.at(r, t.column("kernel"))}] = r;
  return out;
}

int run_bench(const BenchArgs& a) {
  const DeviceInfo dev = device_info();
  const nlohmann::json info = gpu_run_info(dev);
  const std::vector<const DecodeVariant*> variants = find_decode_variants(a.variant);
  if (variants.empty()) throw InputError(fmt::format("--variant '{}' matches no decode variant (see kvq variants)", a.variant));
  const std::vector<BenchStorage> storages = parse_bench_storages(a.schemes);
  const std::vector<DecodeShape> shapes = bench_shapes(a.shapes);
  std::optional<CsvTable> peers_table;
  if (!a.peers.empty()) peers_table = CsvTable::read(a.peers);
  const std::map<PeerKey, size_t> peers = peers_table ? index_peers(*peers_table) : std::map<PeerKey, size_t>{};
  auto peer_number = [&](size_t row, const char* column) { return peers_table->number(row, peers_table->column(column)); };

  const double copy_gbps = copy_bandwidth_gbps(size_t(2) << 30), read_gbps = read_bandwidth_gbps(size_t(2) << 30);
  // The latency floor of a call: an empty kernel in the same graph plus the call's bytes at the read bandwidth.
  const double empty_us = empty_kernel_us(a.calls_per_graph);
  auto floor_us = [&](int64_t bytes) { return empty_us + static_cast<double>(bytes) / (read_gbps * 1e3); };
  fmt::print("{} ({} SMs, L2 {} MiB), driver {}, CUDA {}, commit {}\n", dev.name, dev.sm_count, dev.l2_bytes >> 20,
             info["driver"].get<std::string>(), dev.driver_string(), kvq_commit());
  fmt::print("read-only bandwidth {:.0f} GB/s; device-to-device copy {:.0f} GB/s (read + write); {} calls per graph; "
             "an empty kernel {:.2f} us per call\nfloor: the empty kernel plus the call's bytes at the read bandwidth\n\n",
             read_gbps, copy_gbps, a.calls_per_graph, empty_us);
  std::filesystem::create_directories(std::filesystem::path(a.csv).parent_path().empty()
                                          ? std::filesystem::path(".")
                                          : std::filesystem::path(a.csv).parent_path());
  std::ofstream csv(a.csv);
  if (!csv) throw InputError(fmt::format("cannot write '{}'", a.csv));
  csv << kColumns << "\n";
  // layout: "fbgemm-rows" for FBGEMM's inline-row int4 cache (kvq's ":fbgemm" storages and FBGEMM's
  // kernel), else empty (planar codes, raw bf16, FlashInfer's pages of the same bytes).
  auto emit = [&](const Row& r, const std::string& k_scheme, const std::string& v_scheme, bool fbgemm_rows) {
    const double gbps = static_cast<double>(r.bytes) / (r.t.median_us * 1e3);
    const auto cudnn = peers.find({r.shape, r.B, r.T, "cudnn"});
    const std::string ratio =
        cudnn == peers.end() ? "" : fmt::format("{:.3f}", r.t.median_us / peer_number(cudnn->second, "median_us"));
    const double floor = floor_us(r.bytes);
    fmt::print("{:<8} {:>4} {:>3} {:>3} {:>6} {:<17} {:<28} {:>4} {:>2} {:>9.2f} {:>9.2f} {:>9.2f} {:>6.0f} {:>5.1f}% {:>6} {:>7.2f} {:>5.2f}\n",
               r.shape, r.B, r.HQ, r.HKV, r.T, r.kernel, r.storage, r.splits, r.heads_per_cta, r.t.median_us,
               r.t.p10_us, r.t.p90_us, gbps, 100 * gbps / read_gbps, ratio, floor, r.t.median_us / floor);
    std::fflush(stdout);
    csv << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{},{},{},{},{:.1f},{:.2f},{:.1f},{:.1f},{},{:.3f},{},{},{},{}\n",
                       r.shape, r.B, r.HQ, r.HKV, r.T, r.D, r.kernel, k_scheme, v_scheme, fbgemm_rows ? "fbgemm-rows" : "",
                       r.splits, r.heads_per_cta,
                       r.t.median_us, r.t.p10_us, r.t.p90_us, r.t.reps, a.calls_per_graph, r.sets, r.bytes, gbps,
                       100 * gbps / read_gbps, read_gbps, copy_gbps, ratio, floor, csv_quoted(dev.name),
                       info["driver"].get<std::string>(), dev.runtime_string(), kvq_commit());
  };
  fmt::print("{:<8} {:>4} {:>3} {:>3} {:>6} {:<17} {:<28} {:>4} {:>2} {:>9} {:>9} {:>9} {:>6} {:>6} {:>6} {:>7} {:>5}\n",
             "shape", "B", "Hq", "Hkv", "T", "kernel", "K/V storage", "spl", "hc", "median us", "p10 us", "p90 us", "GB/s",
             "%read", "/cuDNN", "floor", "/flr");
  // best[(shape, B, T)][storage] = fastest variant's median
  std::map<std::tuple<std::string, int64_t, int64_t>, std::map<std::string, double>> best;
  std::set<std::string> peers_seen;
  for (const DecodeShape& sh : shapes) {
    for (const PeerKind& peer : kPeers) {
      const auto it = peers.find({sh.group, sh.batch, sh.tokens, peer.kernel});
      if (it == peers.end()) continue;
      const size_t r = it->second;
      const std::string& k_scheme = peers_table->at(r, peers_table->column("k_scheme"));
      const std::string& v_scheme = peers_table->at(r, peers_table->column("v_scheme"));
      Row row(sh, peer.kernel, (k_scheme == v_scheme ? k_scheme : k_scheme + "/" + v_scheme) + peer.layout + " (peer)");
      row.t = {peer_number(r, "median_us"), peer_number(r, "p10_us"), peer_number(r, "p90_us"),
               static_cast<int>(peer_number(r, "reps"))};
      row.sets = static_cast<int>(peer_number(r, "input_sets"));
      row.bytes = static_cast<int64_t>(peer_number(r, "bytes"));
      if (!peers_table->at(r, peers_table->column("splits")).empty())  // FBGEMM: its best split count
        row.splits = static_cast<int>(peer_number(r, "splits"));
      emit(row, k_scheme, v_scheme, std::string(peer.layout) == ":fbgemm");
      best[{sh.group, sh.batch, sh.tokens}][peer.kernel] = row.t.median_us;
      peers_seen.insert(peer.kernel);
    }
    for (const BenchStorage& st : storages) {
      BenchCaches caches(sh, st, dev);
      for (const DecodeVariant* v : variants) {
        const DecodeTiming timed = time_decode(*v, sh, st, caches, dev, a.reps, a.calls_per_graph, a.splits);
        if (!timed.skipped.empty()) {
          fmt::print("{:<8} {:>4} {:>3} {:>3} {:>6} {:<17} {:<28} skipped: {}\n", sh.group, sh.batch, sh.q_heads,
                     sh.kv_heads, sh.tokens, v->name, st.name, timed.skipped);
          continue;
        }
        Row row(sh, v->name, st.name);
        row.splits = timed.planned.splits, row.heads_per_cta = timed.planned.heads_per_cta, row.sets = caches.sets();
        row.t = timed.time;
        row.bytes = timed.bytes;
        emit(row, st.k ? to_string(*st.k) : to_string(st.k_format), st.v ? to_string(*st.v) : to_string(st.v_format),
             st.k_format == KvFormat::kInt4Fbgemm);
        double& b = best[{sh.group, sh.batch, sh.tokens}][st.name];
        b = b == 0 ? row.t.median_us : std::min(b, row.t.median_us);
      }
    }
  }
  // The ratio table: the quantized peers (FBGEMM) and the fastest variant per storage / cuDNN.
  std::vector<std::string> ratio_columns;
  for (const PeerKind& peer : kPeers)
    if (peer.ratio && peers_seen.count(peer.kernel)) ratio_columns.push_back(peer.kernel);
  for (const BenchStorage& st : storages) ratio_columns.push_back(st.name);
  fmt::print("\nfastest variant / cuDNN bf16 (same run); cuDNN and FlashAttention-2 in us\n{:<8} {:>4} {:>6} {:>8} {:>8}",
             "shape", "B", "T", "cudnn", "flash2");
  for (const std::string& c : ratio_columns) fmt::print(" {:>{}}", c, std::max<size_t>(8, c.size()));
  fmt::print("\n");
  for (const DecodeShape& sh : shapes) {
    const auto& m = best[{sh.group, sh.batch, sh.tokens}];
    auto get = [&](const std::string& k) { const auto it = m.find(k); return it == m.end() ? 0.0 : it->second; };
    fmt::print("{:<8} {:>4} {:>6} {:>8.1f} {:>8.1f}", sh.group, sh.batch, sh.tokens, get("cudnn"), get("flash2"));
    for (const std::string& c : ratio_columns) {
      const double cudnn = get("cudnn"), mine = get(c);
      const std::string cell = cudnn > 0 && mine > 0 ? fmt::format("{:.3f}", mine / cudnn) : fmt::format("{:.1f}us", mine);
      fmt::print(" {:>{}}", cell, std::max<size_t>(8, c.size()));
    }
    fmt::print("\n");
  }
  fmt::print("wrote {}\n", a.csv);
  return 0;
}

// --plan --shard: one shard of a bench study (experiments/cluster/bench_shards.hpp). Each (shape,
// variant, storage) is one run_bench into the unit's file; without peer rows, which would repeat in
// every unit (bench_peers.py's own CSV has them).
int run_shard(const BenchArgs& a) {
  if (a.plan.empty()) throw InputError("bench --shard: give --plan (kvq plan bench writes it)");
  const WorkPlan plan = read_plan(a.plan);
  if (plan.kind != "bench") throw InputError(fmt::format("{}: a {} plan, not a bench's", a.plan, plan.kind));
  const nlohmann::json& s = plan.settings;
  std::vector<std::string> storages;
  for (const BenchStorage& st : parse_bench_storages(s.at("storages").get<std::string>().empty()
                                                         ? std::string(kBenchStorages)
                                                         : s.at("storages").get<std::string>()))
    storages.push_back(st.name);
  run_bench_shard(plan, parse_shard(a.shard, plan.shards), a.gpu, device_info().name, storages, a.out,
                  [&](const std::string& shape, const std::string& variant, const std::string& storage,
                      const std::string& csv) {
                    BenchArgs one = a;
                    one.shapes = "^" + shape + "$", one.variant = "^" + variant + "$", one.schemes = storage;
                    one.csv = csv, one.peers.clear();
                    one.reps = s.at("reps").get<int>(), one.calls_per_graph = s.at("calls_per_graph").get<int>();
                    one.splits = s.at("splits").get<int>();
                    run_bench(one);
                  });
  return 0;
}

}  // namespace

std::vector<Command> add_bench_command(CLI::App& parent) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* bench = parent.add_subcommand(
      "bench", "Time every decode variant on the DESIGN.md shapes beside the peers (cuDNN, FlashAttention-2, FBGEMM)");
  bench->add_option("--csv", a->csv, "CSV of the timings (kvq and peer rows, one schema)")->capture_default_str();
  bench->add_option("--peers", a->peers, "Peer timings from experiments/bench/bench_peers.py in the same device run");
  bench->add_option("--variant", a->variant, "Regex over decode variant names")->capture_default_str();
  bench->add_option("--schemes", a->schemes, "K/V storages: bf16, fp16, a scheme, or scheme:fbgemm, comma-separated")
      ->capture_default_str();
  bench->add_option("--shapes", a->shapes, "Regex over shape labels (seed000, seed002, llama8b, smollm2; seed000/B128/T8192)")->capture_default_str();
  bench->add_option("--reps", a->reps, "Timed graph replays per case")->capture_default_str()->check(CLI::Range(30, 100000));
  bench->add_option("--splits", a->splits, "Key splits for the split-K variants (0: each variant's heuristic)")
      ->capture_default_str()
      ->check(CLI::Range(0, kMaxSplits));
  bench->add_option("--calls-per-graph", a->calls_per_graph, "Decode calls captured per graph")
      ->capture_default_str()
      ->check(kPositive);
  bench->add_option("--plan", a->plan, "A study's plan.json (kvq plan bench): run --shard of it")->check(CLI::ExistingFile);
  bench->add_option("--shard", a->shard, "I/N or I: the shard to run into --out (skips finished units)");
  bench->add_option("--gpu", a->gpu, "--shard: the plan's GPU type this task runs (checked against the device)");
  bench->add_option("--out", a->out, "--shard: the shard's folder")->capture_default_str();
  return {{bench, [a] { return a->shard.empty() ? run_bench(*a) : run_shard(*a); }}};
}

}  // namespace kvq
