// GPU subcommands: kvq variants, kvq validate (the adoption gate), kvq bench-quantize.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>

#include "experiments/bench/bench_shapes.hpp"
#include "experiments/cli/commands.hpp"
#include "experiments/cli/number_checks.hpp"
#include "experiments/common/dump_check.hpp"
#include "experiments/common/gpu_run_info.hpp"
#include "experiments/sweep/results_writer.hpp"
#include "experiments/cli/python_gate.hpp"
#include "experiments/gate/validate_decode.hpp"
#include "experiments/gate/validate_quantize.hpp"
#include "gpu/block_formats_check.hpp"
#include "gpu/float_formats_check.hpp"
#include "gpu/fp8_check.hpp"
#include "gpu/timing.hpp"
#include "quant/planar_codes.hpp"

namespace kvq {
namespace {

int run_variants() {
  fmt::print("quantize variants (gpu/registry.cpp)\n");
  for (const QuantizeVariant& v : quantize_variants())
    fmt::print("  {}{}\n      how:      {}\n      supports: {}\n", v.name, v.incumbent ? "  [incumbent]" : "", v.summary,
               v.supports);
  fmt::print("decode variants (gpu/registry.cpp; kernels gpu/decode_kernel.cuh, tensor cores gpu/decode_tc_kernel.cuh)\n");
  const std::vector<const DecodeVariant*> adopted = adopted_decode_variants();
  for (const DecodeVariant& v : decode_variants()) {
    const auto rank = std::find(adopted.begin(), adopted.end(), &v) - adopted.begin();
    const std::string tag = rank == 0 ? "  [default where it runs]"
                            : rank < static_cast<long>(adopted.size()) ? "  [default for the rest]"
                                                                       : "";
    fmt::print("  {}{}{}\n      how:      {}\n      supports: {}\n", v.name, v.incumbent ? "  [incumbent]" : "", tag,
               v.summary, v.supports);
  }
  return 0;
}

// A pseudo-random bf16 tensor on the device, with its workspace for one scheme and layout.
struct TimedCase {
  DeviceBuffer<uint8_t> input;
  std::unique_ptr<QuantizeWorkspace> ws;
  TimedCase(const KvShape& shape, const Scheme& s, CodeLayout layout, BenchInput values = BenchInput::kUniform)
      : input(random_bf16(shape.numel(), 12345, values, shape.head_dim)) {
    ws = std::make_unique<QuantizeWorkspace>(DeviceKv::bnsh(input.data(), InputDtype::kBf16, shape), s, layout);
  }
  // A workspace over the same input with a given tensor scale, as a calibrated cache quantizes: the
  // scale the last launch on ws computed from it (nvfp4's s_t, or the scheme's one stored scale).
  std::unique_ptr<QuantizeWorkspace> with_computed_scale(const Scheme& s, CodeLayout layout) const {
    const GpuQuantized q = ws->download();
    float scale = 0.0f;
    if (s.format == CodeFormat::kNvfp4) std::memcpy(&scale, q.tensor_scale.data(), sizeof scale);
    else scale = stored_param(q.scales.data(), 0, s.scale_dtype);
    const DeviceKv kv = DeviceKv::bnsh(input.data(), InputDtype::kBf16, ws->params().shape);
    return std::make_unique<QuantizeWorkspace>(kv, s, layout, std::vector<int32_t>{}, nullptr, scale);
  }
  static GpuTiming time(const QuantizeVariant& v, const QuantizeWorkspace& w, int reps) {
    return time_graph_replays([&](cudaStream_t st, int) { v.launch(w.params(), st); }, 1, reps);
  }
};

struct ValidateArgs {
  std::string variant = ".", report = "results/validate/validate.json", dump;
  bool quick = false;
  int reruns = 250;
  PythonGateArgs python;
};

int run_validate(const ValidateArgs& a) {
  const DeviceInfo dev = device_info();
  const std::vector<const QuantizeVariant*> variants = find_quantize_variants(a.variant);
  const std::vector<const DecodeVariant*> decoders = find_decode_variants(a.variant);
  if (variants.empty() && decoders.empty())
    throw InputError(fmt::format("--variant '{}' matches no registered variant (see kvq variants)", a.variant));
  if (!a.dump.empty() && !a.quick) check_dump_in_child(a.dump);  // a corrupt dump must not crash the gate
  fmt::print("kvq validate on {} ({} SMs, CUDA driver {}), commit {}\n", dev.name, dev.sm_count, dev.driver_string(), kvq_commit());
  nlohmann::json cases = nlohmann::json::array(), summary = nlohmann::json::array();
  int failed_total = 0;
  {  // the codec's fp16 rounding on the GPU (hardware conversion) against its integer definition
    const Fp16CheckResult f = check_fp16_conversions();
    const std::string detail =
        f.ok() ? "all 2^32 fp32 and 2^16 fp16 patterns identical"
               : fmt::format("{} fp32->fp16 mismatches (first bits {:#010x}), {} fp16->fp32 (first {:#06x})",
                             f.to_fp16_mismatches, f.first_fp32_bits, f.to_fp32_mismatches, f.first_fp16_bits);
    fmt::print("{} codec fp16 conversions on the device: {}\n", f.ok() ? "[OK]  " : "[FAIL]", detail);
    cases.push_back({{"variant", "codec"}, {"case", "fp16 conversions exhaustive"}, {"ok", f.ok()}, {"detail", detail}});
    failed_total += f.ok() ? 0 : 1;
  }
  {  // the hardware FP8 conversions (satfinite cvt) against the codec's software fp8(): kernels may use
     // them only where they are identical
    const Fp8CheckResult f = check_fp8_conversions();
    const std::string detail =
        f.ok() ? "e4m3 and e5m2 identical for every finite fp32 pattern and every code"
               : fmt::format("e4m3: {} mismatches (first bits {:#010x}: hw {:#04x}, sw {:#04x}); e5m2: {} (first {:#010x}: "
                             "hw {:#04x}, sw {:#04x}); {} codes decode differently",
                             f.e4m3_mismatches, f.e4m3_first_bits, f.e4m3_first_hw, f.e4m3_first_sw, f.e5m2_mismatches,
                             f.e5m2_first_bits, f.e5m2_first_hw, f.e5m2_first_sw, f.decode_mismatches);
    fmt::print("{} codec fp8 conversions on the device: {}\n", f.ok() ? "[OK]  " : "[FAIL]", detail);
    cases.push_back({{"variant", "codec"}, {"case", "fp8 conversions exhaustive"}, {"ok", f.ok()}, {"detail", detail}});
    failed_total += f.ok() ? 0 : 1;
  }
  {  // mxfp4's exponent: the device's log2 against the host's where the fp32 rounding decides the floor
    const Mxfp4ExponentCheck m = check_mxfp4_exponent();
    const std::string detail =
        m.ok() ? fmt::format("identical for {} floats near every power of two and a stride of the rest", m.checked)
               : fmt::format("{} of {} differ (first amax bits {:#010x}: host e {}, device e {})", m.mismatches, m.checked,
                             m.first_bits, m.host_e, m.device_e);
    fmt::print("{} codec mxfp4 exponent on the device: {}\n", m.ok() ? "[OK]  " : "[FAIL]", detail);
    cases.push_back({{"variant", "codec"}, {"case", "mxfp4 exponent near powers of two"}, {"ok", m.ok()}, {"detail", detail}});
    failed_total += m.ok() ? 0 : 1;
  }
  for (const QuantizeVariant* v : variants) {
    int ok = 0, failed = 0;
    int64_t values = 0;
    ValidateOptions opt{a.quick, a.reruns, a.dump};
    validate_quantize_variant(*v, opt, [&](const CaseResult& r) {
      (r.ok ? ok : failed)++;
      values += r.values;
      cases.push_back(to_json(r));
      if (!r.ok || !a.quick)
        fmt::print("{} {} {} {} {} {} {}: {}\n", r.ok ? "[OK]  " : "[FAIL]", r.variant, r.name, r.scheme, r.dtype,
                   r.layout, r.shape, r.detail);
    });
    nlohmann::json s = {{"variant", v->name}, {"cases", ok + failed}, {"failed", failed}, {"values_checked", values}};
    if (!v->incumbent && !a.quick) {  // time against the incumbent on a mid-size decode cache
      const QuantizeVariant& base = incumbent_quantize_variant();
      for (const char* name : {"int8-head", "int4-g32-asym", "int8-token", "int4-token-asym", "int8-tensor", "int4-tensor-asym"}) {
        if (!v->accepts(parse_scheme(name), 128, CodeLayout::kPlanar, InputDtype::kBf16)) continue;
        TimedCase tc({32, 8, 1024, 128}, parse_scheme(name), CodeLayout::kPlanar);
        const double mine = TimedCase::time(*v, *tc.ws, 30).median_us;
        const double theirs = TimedCase::time(base, *tc.ws, 30).median_us;
        fmt::print("[TIME] {} vs {} on {} bf16 [32, 8, 1024, 128]: {:.1f} us vs {:.1f} us, ratio {:.3f}\n", v->name,
                   base.name, name, mine, theirs, mine / theirs);
        s["timing"][name] = {{"us", mine}, {"incumbent_us", theirs}, {"ratio", mine / theirs}};
      }
    }
    fmt::print("{} {}: {} cases, {} failed, {} values checked\n", failed ? "[FAIL]" : "[OK]  ", v->name, ok + failed,
               failed, values);
    summary.push_back(s);
    failed_total += failed;
  }
  for (const DecodeVariant* v : decoders) {
    int ok = 0, failed = 0, skipped = 0;
    int64_t values = 0;
    validate_decode_variant(*v, ValidateOptions{a.quick, a.reruns, a.dump}, [&](const CaseResult& r) {
      (r.skipped ? skipped : r.ok ? ok : failed)++;
      values += r.values;
      cases.push_back(to_json(r));
      if (!r.ok || !a.quick)
        fmt::print("{} {} {} {} {}: {}\n", r.skipped ? "[SKIP]" : r.ok ? "[OK]  " : "[FAIL]", r.variant, r.name,
                   r.scheme, r.shape, r.detail);
      std::fflush(stdout);
    });
    fmt::print("{} {}: {} cases, {} failed, {} skipped (unsupported), {} outputs checked\n", failed ? "[FAIL]" : "[OK]  ",
               v->name, ok + failed, failed, skipped, values);
    summary.push_back({{"variant", v->name}, {"cases", ok + failed}, {"failed", failed}, {"skipped", skipped},
                       {"values_checked", values}});
    failed_total += failed;
  }
  std::filesystem::create_directories(std::filesystem::path(a.report).parent_path().empty()
                                          ? std::filesystem::path(".")
                                          : std::filesystem::path(a.report).parent_path());
  nlohmann::json dump = nullptr;
  if (!a.dump.empty()) dump = {{"path", a.dump}, {"sha256", file_sha256(a.dump)}};
  write_json({{"gpu", gpu_run_info(dev)}, {"dump", dump}, {"variants", summary}, {"cases", cases}}, a.report);
  fmt::print("wrote {}\n", a.report);
  return failed_total ? 1 : 0;
}

struct BenchArgs {
  std::string csv = "results/bench-quantize/quantize_bandwidth.csv";
  std::string schemes = ".";  // regex over the cases' scheme names
  std::string variant = ".";  // regex over the variant names
  std::vector<std::string> inputs = {"uniform"};  // the bf16 values, each timed in turn (bench_input.hpp)
  int reps = 30;
};

int run_bench_quantize(const BenchArgs& a) {
  std::vector<BenchInput> inputs;  // every name checked before the first timing
  for (const std::string& name : a.inputs) inputs.push_back(parse_bench_input(name));
  const DeviceInfo dev = device_info();
  const nlohmann::json info = gpu_run_info(dev);
  const double copy_gbps = copy_bandwidth_gbps(size_t(2) << 30, a.reps);
  fmt::print("{} ({} SMs, L2 {} MiB), CUDA driver {}, commit {}\n", dev.name, dev.sm_count, dev.l2_bytes >> 20,
             dev.driver_string(), kvq_commit());
  fmt::print("device-to-device copy (2 GiB): {:.0f} GB/s (read + write); input: {} bf16\n\n", copy_gbps,
             fmt::join(a.inputs, ", "));
  fmt::print("{:<14} {:<8} {:<22} {:<7} {:<21} {:>10} {:>10} {:>10} {:>8} {:>7}\n", "input", "Hkv", "scheme", "layout",
             "variant", "median us", "p10 us", "p90 us", "GB/s", "% copy");
  std::filesystem::create_directories(std::filesystem::path(a.csv).parent_path());
  std::ofstream csv(a.csv);
  if (!csv) throw InputError(fmt::format("cannot write '{}'", a.csv));
  csv << "gpu,driver,cuda_driver,cuda_runtime,sm_clock_mhz,mem_clock_mhz,commit,B,HKV,T,D,input_dtype,scheme,layout,"
         "variant,tensor_scale,median_us,p10_us,p90_us,reps,bytes,gbps,copy_gbps,pct_of_copy,input\n";
  struct Case {
    const char* scheme;
    CodeLayout layout = CodeLayout::kPlanar;
    bool given_scale = false;  // a calibrated tensor scale: no statistics pass
  };
  const std::vector<Case> cases = {
      {"int8-head"},      {"int8-head-asym"},   {"int8-g32"},
      {"int4-head-asym"}, {"int4-g64-asym"},    {"int4-g32-asym"},
      {"int4-head-asym", CodeLayout::kFbgemm},  {"int4-g32-asym", CodeLayout::kFbgemm},
      {"int8-token"},     {"int4-token-asym"},  {"int8-tensor"},
      {"int8-tensor", CodeLayout::kPlanar, true},
      {"int4-tensor"},    {"int4-tensor", CodeLayout::kPlanar, true},
      {"int8-tensor-asym"}, {"q8_0"},           {"q4_0"},
      {"q4_1"},           {"q5_0"},             {"q5_1"},
      {"iq4_nl"},         {"mxfp4"},            {"nvfp4"},
      {"nvfp4", CodeLayout::kPlanar, true},
      {"fp8-e4m3-head"},  {"fp8-e4m3-token"},   {"fp8-e4m3-tensor"},
      {"fp8-e4m3-tensor", CodeLayout::kPlanar, true}};
  auto regex_option = [](const char* option, const std::string& re) {
    try {
      return std::regex(re);
    } catch (const std::regex_error& e) {
      throw InputError(fmt::format("{} '{}': not a valid regular expression ({})", option, re, e.what()));
    }
  };
  const std::regex wanted = regex_option("--schemes", a.schemes), wanted_variant = regex_option("--variant", a.variant);
  for (const BenchInput values : inputs)
    for (int64_t hkv : {1, 8})
      for (const Case& c : cases) {
        if (!std::regex_search(c.scheme, wanted)) continue;
        const KvShape shape{128, hkv, 8192, 128};
        const Scheme s = parse_scheme(c.scheme);
        TimedCase tc(shape, s, c.layout, values);
        const std::string name = fmt::format("{}{}", c.scheme, c.given_scale ? " (given)" : "");
        for (const QuantizeVariant& v : quantize_variants()) {  // every variant that takes the case
          if (!v.accepts(s, shape.head_dim, c.layout, InputDtype::kBf16) || !std::regex_search(v.name, wanted_variant)) continue;
          tc.ws->reset();
          v.launch(tc.ws->params(), nullptr);
          tc.ws->check_flags("K", nullptr);
          std::unique_ptr<QuantizeWorkspace> given;
          if (c.given_scale) {
            given = tc.with_computed_scale(s, c.layout);
            v.launch(given->params(), nullptr);
            given->check_flags("K", nullptr);
          }
          const QuantizeWorkspace& w = given ? *given : *tc.ws;
          const GpuTiming t = TimedCase::time(v, w, a.reps);
          const double gbps = static_cast<double>(w.bytes_moved()) / (t.median_us * 1e3);
          fmt::print("{:<14} {:<8} {:<22} {:<7} {:<21} {:>10.1f} {:>10.1f} {:>10.1f} {:>8.0f} {:>6.1f}%\n",
                     bench_input_name(values), hkv, name, to_string(c.layout), v.name, t.median_us, t.p10_us,
                     t.p90_us, gbps, 100 * gbps / copy_gbps);
          std::fflush(stdout);
          csv << fmt::format("{},{},{},{},{},{},{},{},{},{},{},bfloat16,{},{},{},{},{:.3f},{:.3f},{:.3f},{},{},{:.1f},{:.1f},{:.2f},{}\n",
                             csv_quoted(dev.name), info["driver"].get<std::string>(), dev.driver_string(),
                             dev.runtime_string(), dev.sm_clock_khz / 1000, dev.memory_clock_khz / 1000, kvq_commit(),
                             shape.batch, shape.heads, shape.tokens, shape.head_dim, c.scheme, to_string(c.layout),
                             v.name, c.given_scale ? "given" : "computed", t.median_us, t.p10_us, t.p90_us, t.reps,
                             w.bytes_moved(), gbps, copy_gbps, 100 * gbps / copy_gbps, bench_input_name(values));
        }
      }
  fmt::print("wrote {}\n", a.csv);
  return 0;
}

}  // namespace

std::vector<Command> add_gpu_commands(CLI::App& parent) {
  std::vector<Command> out;
  CLI::App* variants = parent.add_subcommand("variants", "List the registered GPU kernel variants and what they support");
  out.push_back({variants, [] { return run_variants(); }});

  auto va = std::make_shared<ValidateArgs>();
  CLI::App* validate = parent.add_subcommand(
      "validate", "The adoption gate: check GPU variants against the CPU codec bit for bit; [OK]/[FAIL] per case");
  validate->add_option("--variant", va->variant, "Regex over variant names")->capture_default_str();
  validate->add_option("--report", va->report, "JSON report")->capture_default_str();
  validate->add_option("--dump", va->dump, "Real dump to validate on, as it is: every layer, batch entry and decode query "
                       "(default: the bundled one)");
  validate->add_option("--reruns", va->reruns, "Reruns compared bitwise")->capture_default_str()->check(kPositive);
  validate->add_flag("--quick", va->quick, "Small shapes only (for compute-sanitizer)");
  add_python_gate_options(validate, va->python);
  out.push_back({validate, [va, validate] {
                   if (!va->python.target.empty()) {
                     if (validate->count("--variant") || validate->count("--dump"))
                       throw InputError("kvq validate --python gates the Python kernel: --variant and --dump are for "
                                        "kvq's own kernels");
                     run_python_gate(va->python, va->quick ? "quick" : "full", va->report,
                                     validate->count("--reruns") ? va->reruns : 0);
                   }
                   if (va->dump.empty()) va->dump = KVQ_DATA_DIR "/dumps/stories260k.h5";
                   return run_validate(*va);
                 }});

  auto ba = std::make_shared<BenchArgs>();
  CLI::App* bench = parent.add_subcommand(
      "bench-quantize", "Quantize bandwidth at B=128 T=8192 Hkv={1,8} D=128 bf16, beside the device copy bandwidth");
  bench->add_option("--csv", ba->csv, "CSV of the timings")->capture_default_str();
  bench->add_option("--schemes", ba->schemes, "Regex over the cases' scheme names")->capture_default_str();
  bench->add_option("--variant", ba->variant, "Regex over the quantize variants' names")->capture_default_str();
  bench->add_option("--input", ba->inputs,
                    "The bf16 values, one or more (comma-separated), each timed in turn: uniform (in [-4, 4), "
                    "every committed run's) or gaussian-rows (rows of D whose scales spread over two decades)")
      ->delimiter(',')
      ->capture_default_str();
  bench->add_option("--reps", ba->reps, "Timed graph replays per case")->capture_default_str()->check(kPositive);
  out.push_back({bench, [ba] { return run_bench_quantize(*ba); }});
  for (Command& c : add_bench_command(parent)) out.push_back(std::move(c));
  return out;
}

}  // namespace kvq
