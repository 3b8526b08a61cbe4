#include "experiments/bench/bench_shapes.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "experiments/gate/decode_run.hpp"
#include "gpu/registry.hpp"
#include "quant/errors.hpp"

namespace kvq {

std::vector<DecodeShape> bench_shapes(const std::string& regex) { return design_decode_shapes(regex, "--shapes"); }

BenchStorage bench_storage(const std::optional<Scheme>& k, KvFormat k_raw, const std::optional<Scheme>& v,
                           KvFormat v_raw, bool fbgemm) {
  BenchStorage st;
  auto name = [](const std::optional<Scheme>& s, KvFormat raw) { return s ? to_string(*s) : std::string(to_string(raw)); };
  st.name = name(k, k_raw) == name(v, v_raw) ? name(k, k_raw) : name(k, k_raw) + "/" + name(v, v_raw);
  if (fbgemm) {
    if (!k || !v || k->bits != 4 || v->bits != 4 || k->fp8() || v->fp8() || k->block_format() || v->block_format())
      throw InputError(fmt::format("{}:fbgemm: FBGEMM rows hold kvq's int4 K and V (block formats are planar)", st.name));
    st.name += ":fbgemm";
  }
  st.k_format = k ? quantized_format(*k, fbgemm) : k_raw;
  st.v_format = v ? quantized_format(*v, fbgemm) : v_raw;
  st.k = k, st.v = v;
  return st;
}

BenchStorage bench_storage(const Scheme& k, const Scheme& v, bool fbgemm) {
  return bench_storage(k, KvFormat::kBf16, v, KvFormat::kBf16, fbgemm);
}

std::vector<BenchStorage> parse_bench_storages(const std::string& list) {
  std::vector<BenchStorage> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    const bool fbgemm = colon != std::string::npos;
    if (fbgemm && item.substr(colon + 1) != "fbgemm")
      throw InputError(fmt::format("--schemes '{}': the only layout suffix is ':fbgemm'", item));
    const std::string pair = item.substr(0, colon);
    const size_t slash = pair.find('/');
    KvFormat k_format, v_format;
    const std::optional<Scheme> k = parse_storage_operand(pair.substr(0, slash), fbgemm, k_format);
    const std::optional<Scheme> v =
        parse_storage_operand(slash == std::string::npos ? pair : pair.substr(slash + 1), fbgemm, v_format);
    out.push_back(bench_storage(k, k_format, v, v_format, fbgemm));
  }
  if (out.empty()) throw InputError(fmt::format("--schemes '{}': no storage given", list));
  return out;
}

DeviceBuffer<uint8_t> random_bf16(int64_t elements, uint32_t seed, BenchInput input, int64_t row) {
  DeviceBuffer<uint8_t> out(static_cast<size_t>(2 * elements));
  const std::vector<uint16_t> bits = bench_input_pattern(input, elements, row, seed);
  for (int64_t off = 0; off < elements; off += static_cast<int64_t>(bits.size())) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(bits.size()), elements - off);
    KVQ_CUDA_CHECK(cudaMemcpy(out.data() + 2 * off, bits.data(), n * 2, cudaMemcpyHostToDevice));
  }
  return out;
}

namespace {

const QuantizeVariant& fastest_quantizer(const Scheme& s, int64_t head_dim, CodeLayout layout) {
  for (const char* name : {"quantize-groupthread", "quantize-rowwarp", "quantize-tokenteam", "quantize-tensor2pass"})
    for (const QuantizeVariant& v : quantize_variants())
      if (v.name == name && v.accepts(s, head_dim, layout, InputDtype::kBf16)) return v;
  return incumbent_quantize_variant();
}

}  // namespace

BenchCaches::BenchCaches(const DecodeShape& sh, const BenchStorage& st, const DeviceInfo& dev) {
  const KvShape kv{sh.batch, sh.kv_heads, sh.tokens, sh.head_dim};
  const bool fbgemm = st.k_format == KvFormat::kInt4Fbgemm;
  const CodeLayout layout = fbgemm ? CodeLayout::kFbgemm : CodeLayout::kPlanar;
  auto cache_bytes = [&](const std::optional<Scheme>& s) {
    if (!s) return 2 * kv.numel();
    const QuantizedSizes q = quantized_sizes(*s, kv, layout);
    return q.codes + q.scales + q.zeros + q.tensor_scale;
  };
  const int64_t per_set = std::max<int64_t>(1, cache_bytes(st.k) + cache_bytes(st.v));
  int64_t sets = std::max<int64_t>(1, (4 * dev.l2_bytes + per_set - 1) / per_set);
  sets = std::min<int64_t>(sets, std::max<int64_t>(1, dev.global_bytes / 2 / per_set));
  const DeviceBuffer<uint8_t> k_src = random_bf16(kv.numel(), 1), v_src = random_bf16(kv.numel(), 2);
  for (int64_t s = 0; s < sets; ++s) {
    for (int which = 0; which < 2; ++which) {
      const std::optional<Scheme>& scheme = which == 0 ? st.k : st.v;
      const DeviceBuffer<uint8_t>& src = which == 0 ? k_src : v_src;
      std::vector<KvOperand>& ops = which == 0 ? k_ : v_;
      std::vector<KvWindow>& windows = which == 0 ? k_window_ : v_window_;
      auto raw_copy = [&] {  // a copy of the source (fp16 reads the same bits as fp16 numbers)
        raw_.emplace_back(src.size());
        KVQ_CUDA_CHECK(cudaMemcpy(raw_.back().data(), src.data(), src.bytes(), cudaMemcpyDeviceToDevice));
        return raw_operand(raw_.back().data(), kv.heads, kv.tokens, sh.head_dim, false);
      };
      if (!scheme) {
        ops.push_back(raw_copy());
        windows.emplace_back();
        continue;
      }
      const DeviceKv input = DeviceKv::bnsh(src.data(), InputDtype::kBf16, kv);
      quantized_.push_back(std::make_unique<QuantizeWorkspace>(input, *scheme, layout));
      const QuantizeParams& qp = quantized_.back()->params();
      fastest_quantizer(*scheme, sh.head_dim, layout).launch(qp, nullptr);
      quantized_.back()->check_flags(which == 0 ? "K" : "V", nullptr);
      ops.push_back(quantized_operand(*scheme, kv.batch, kv.heads, kv.tokens, sh.head_dim, fbgemm, qp.codes, qp.scales,
                                      scheme->asymmetric ? qp.zeros : nullptr, qp.tensor_scale));
      // +wW: the window's tokens are the bf16 source itself (the cache a model keeps beside the codes)
      windows.push_back(scheme->has_window() ? scheme_window(*scheme, raw_copy(), KvFormat::kBf16) : KvWindow{});
    }
  }
}

DecodeTiming time_decode(const DecodeVariant& variant, const DecodeShape& sh, const BenchStorage& st,
                         const BenchCaches& caches, const DeviceInfo& dev, int reps, int calls_per_graph,
                         int forced_splits) {
  // Queries vary (a constant query gives every key the same score, and the softmax max never moves).
  std::vector<float> q(static_cast<size_t>(sh.batch * sh.q_heads * sh.head_dim));
  uint32_t state = 12345u;
  for (float& x : q) x = static_cast<float>((state = state * 1664525u + 1013904223u) >> 8) / 8388608.0f - 1.0f;
  DecodeRun run(sh, q, {}, false);
  std::vector<DecodeParams> planned;
  for (int s = 0; s < caches.sets(); ++s) {
    run.set_cache(st.k_format, caches.k(s), st.v_format, caches.v(s));
    run.set_windows(caches.k_window(s), caches.v_window(s));
    planned.push_back(run.plan(variant, dev.sm_count, forced_splits));
  }
  DecodeTiming out;
  out.planned = planned[0];
  if (out.skipped = variant.unsupported_reason(planned[0]); !out.skipped.empty()) return out;
  run.run(planned[0]);  // errors surface here, outside the capture
  out.time = time_graph_replays([&](cudaStream_t s, int set) { launch_decode(planned[set], s); }, caches.sets(), reps,
                                5, calls_per_graph);
  out.bytes = decode_bytes_moved(planned[0], st.k ? &*st.k : nullptr, st.v ? &*st.v : nullptr, nullptr);
  return out;
}

}  // namespace kvq
