#include "experiments/gate/validate_decode.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>

#include "data/dump.hpp"
#include "experiments/gate/decode_gate_case.hpp"
#include "experiments/gate/decode_run.hpp"
#include "experiments/gate/dump_decode_cases.hpp"
#include "experiments/gate/large_logits.hpp"
#include "experiments/gate/paged_cache.hpp"
#include "quant/hadamard.hpp"
#include "reference/attention.hpp"

namespace kvq {
namespace {

using namespace gate_case;  // the cases' storage, placement and device operands

double bf16_noise(double r) {  // FlashAttention's atol: rounding noise of the output dtype at r
  const double x = round_to_bf16(static_cast<float>(round_to_bf16(static_cast<float>(r + 0.3)) - 0.3));
  return std::fabs(x - r);
}

std::string shape_string(const Case& c, const DecodeParams& planned) {
  std::string lens;
  if (!c.seq_lens.empty()) {
    lens = " lens";
    for (size_t i = 0; i < c.seq_lens.size() && i < 6; ++i) lens += fmt::format("{}{}", i ? "," : " ", c.seq_lens[i]);
    if (c.seq_lens.size() > 6) lens += ",...";
  }
  std::string placed = c.placement == Placement::kStrided ? " strided views"
                       : c.placement == Placement::kHuge  ? fmt::format(" placed in T={}", placed_tokens(c))
                       : c.placement == Placement::kPaged ? fmt::format(" pages of {}", c.page_tokens)
                                                          : "";
  if (!c.broken.empty()) placed += fmt::format(" rows of sequences {} not judged", fmt::join(c.broken, ","));
  return fmt::format("B={} Hq={} Hkv={} T={} D={}{}{}{} splits={} heads/CTA={}", c.shape.batch, c.shape.q_heads,
                     c.shape.kv_heads, c.shape.tokens, c.shape.head_dim, lens, c.alibi ? " alibi" : "", placed,
                     planned.splits, planned.heads_per_cta);
}

struct Gate {
  const DecodeVariant& v;
  int sm_count;
  const std::function<void(const CaseResult&)>& report;
  std::vector<CaseResult> results;

  void add(CaseResult r) {
    results.push_back(r);
    report(results.back());
  }

  void skip(const std::string& name, const Storage& st, const std::string& why) {
    CaseResult r{v.name, name, st.name(), st.formats(), st.bsnh ? "BSNH" : "BNSH", "", "skipped: " + why, 0, true};
    r.skipped = true;
    add(r);
  }

  // Runs one case; `k`, `v`, `q` default to random values. Returns the kernel's output.
  std::vector<float> run(const Case& c, std::vector<float> k = {}, std::vector<float> vv = {}, std::vector<float> q = {},
                         double softmax_scale = 0.0) {
    const DecodeShape& s = c.shape;
    const int64_t kv_n = s.batch * s.kv_heads * s.tokens * s.head_dim;
    if (k.empty()) k = random_normal(kv_n, 11, s.head_dim), vv = random_normal(kv_n, 12, s.head_dim, 3.0f);
    if (q.empty()) q = random_normal(s.batch * s.q_heads * s.head_dim, 13, s.head_dim, 1.0f);
    for (float& x : q) x = round_to_bf16(x);
    // +had K: the codes are in the rotated basis; the kernel rotates Q alike (the codec's fp32
    // transform), so the reference attends with the rotated Q.
    std::vector<float> q_ref = q;
    if (c.storage.k && c.storage.k->hadamard)
      for (int64_t r = 0; r < s.batch * s.q_heads; ++r)
        hadamard_rotate(q_ref.data() + r * s.head_dim, s.head_dim, c.storage.k->rotation_block(s.head_dim));
    const char* layout = c.placement == Placement::kPaged ? "paged" : c.storage.bsnh ? "BSNH" : "BNSH";
    CaseResult r{v.name, c.name, c.storage.name(), c.storage.formats(), layout, "",
                 "", s.batch * s.q_heads * s.head_dim, false};
    try {
      std::optional<Paging> paging, window_paging;
      DeviceBuffer<int32_t> table, window_table;
      if (c.placement == Placement::kPaged) {
        paging = make_paging(lengths(c), s.tokens, c.page_tokens, 31);
        table = DeviceBuffer<int32_t>(paging->table);
        if (has_window(c.storage)) {  // the windows' raw tokens in pages of their own, another order
          window_paging = make_paging(lengths(c), s.tokens, c.page_tokens, 37, first_window_tokens(c));
          window_table = DeviceBuffer<int32_t>(window_paging->table);
        }
      }
      const Paging* pages = paging ? &*paging : nullptr;
      const Paging* window_pages = window_paging ? &*window_paging : nullptr;
      DeviceOperand dk = make_operand(c, std::move(k), c.storage.k, c.storage.k_format, pages, window_pages);
      DeviceOperand dv = make_operand(c, std::move(vv), c.storage.v, c.storage.v_format, pages, window_pages);
      DecodeShape placed = s;
      placed.tokens = placed_tokens(c);
      DecodeRun run(placed, q, c.seq_lens, c.alibi, softmax_scale);
      run.set_cache(c.storage.k_format, dk.op, c.storage.v_format, dv.op);
      run.set_windows(dk.window, dv.window);
      if (paging) run.set_pages(table.data(), paging->table_stride, paging->page_tokens);
      if (window_paging) run.set_window_pages(window_table.data());
      const DecodeParams planned = run.plan(v, sm_count, c.splits);
      r.shape = shape_string(c, planned);
      if (const std::string why = v.unsupported_reason(planned); !why.empty()) {
        r.ok = r.skipped = true, r.values = 0, r.detail = "skipped: " + why;
        add(r);
        return {};
      }
      run.run(planned);
      const std::vector<float> out = run.output(), lse = run.lse();
      // The splits' partials merged each way (the merge kernel, the last split's CTA; the planned way may
      // be a cluster): the same arithmetic in the same order, so the same bits (NaN rows included).
      int64_t merge_differs = 0;
      if (planned.family == DecodeFamily::kTensorCore && planned.splits > 1)
        for (SplitMerge way : {SplitMerge::kMergeKernel, SplitMerge::kLastSplit}) {
          DecodeParams forced = planned;
          forced.split_merge = way;
          run.run(forced);
          const std::vector<float> out2 = run.output(), lse2 = run.lse();
          for (size_t i = 0; i < out.size(); ++i) merge_differs += std::memcmp(&out[i], &out2[i], sizeof(float)) != 0;
          for (size_t i = 0; i < lse.size(); ++i) merge_differs += std::memcmp(&lse[i], &lse2[i], sizeof(float)) != 0;
        }
      // The kernels' other configurations (plan_decode picks one by the grid, which the gate's small
      // shapes seldom reach) are judged on the same case too, so that every one stays gated.
      struct Other {
        TcConfig config;
        std::vector<float> out, lse;
      };
      std::vector<Other> others;
      for (TcConfig c : tc_configs(planned))
        if (c != planned.tc_config) {
          DecodeParams other = planned;
          other.tc_config = c;
          run.run(other);
          others.push_back({c, run.output(), run.lse()});
        }

      AttentionProblem p;
      p.batch = s.batch, p.q_heads = s.q_heads, p.kv_heads = s.kv_heads, p.q_len = 1, p.head_dim = s.head_dim;
      p.q = q_ref.data();
      const KvShape kv{s.batch, s.kv_heads, s.tokens, s.head_dim};
      p.k = KvView::bnsh(dk.reference_values.data(), kv), p.v = KvView::bnsh(dv.reference_values.data(), kv);
      p.seq_lens = c.seq_lens.empty() ? nullptr : c.seq_lens.data();
      p.softmax_scale = planned.softmax_scale;
      p.alibi = c.alibi;
      PrecisionProfile profile = PrecisionProfile::parse(decode_precision_profile(planned));
      const RoundTo output_rounding = profile.output;
      const bool rotated_v = c.storage.v && c.storage.v->hadamard;
      if (rotated_v) profile.output = RoundTo::kNone;  // the kernel rounds O after rotating it back
      AttentionOutput ref = attention(p), mimic = attention(p, profile);
      if (rotated_v) {  // +had V: attention in V's rotated basis, then O rotated back
        const int64_t block = c.storage.v->rotation_block(s.head_dim);
        for (int64_t row = 0; row < s.batch * s.q_heads; ++row) {
          hadamard_rotate_back(ref.o.data() + row * s.head_dim, s.head_dim, block);
          hadamard_rotate_back(mimic.o.data() + row * s.head_dim, s.head_dim, block);
        }
        for (double& o : mimic.o) o = round_to(o, output_rounding);  // as the kernel: O rounded after its rotation
      }
      std::vector<float> judged_out = out, judged_lse = lse;
      if (!c.broken.empty()) {  // the broken sequences' rows are not judged
        auto keep = [&](auto& o, auto& l) {
          const int64_t row = s.q_heads * s.head_dim;
          for (auto b = c.broken.rbegin(); b != c.broken.rend(); ++b) {
            o.erase(o.begin() + *b * row, o.begin() + (*b + 1) * row);
            l.erase(l.begin() + *b * s.q_heads, l.begin() + (*b + 1) * s.q_heads);
          }
        };
        keep(judged_out, judged_lse), keep(ref.o, ref.lse), keep(mimic.o, mimic.lse);
        for (Other& o : others) keep(o.out, o.lse);
        r.values = static_cast<int64_t>(judged_out.size());
      }
      const ToleranceCheck t = check_tolerance(judged_out, judged_lse, ref.o, ref.lse, mimic.o, mimic.lse);
      r.ok = t.ok && merge_differs == 0, r.detail = t.detail;
      for (const Other& o : others) {
        const ToleranceCheck other = check_tolerance(o.out, o.lse, ref.o, ref.lse, mimic.o, mimic.lse);
        r.ok = r.ok && other.ok;
        if (!other.ok) r.detail += fmt::format("; the {} kernels: {}", to_string(o.config), other.detail);
      }
      if (merge_differs)
        r.detail += fmt::format("; {} values differ between the split merges (merge kernel, last split, planned)", merge_differs);
      add(r);
      return out;
    } catch (const std::exception& e) {  // a launch or input error fails the case, and the gate goes on
      r.detail = std::string("error: ") + e.what();
      add(r);
      return {};
    }
  }
};

Storage raw(KvFormat f, bool bsnh = false) { return {f, f, std::nullopt, std::nullopt, bsnh}; }
// K and V by name: a scheme, or "bf16" / "fp16" for a raw operand.
Storage quantized(const char* k, const char* v, bool fbgemm = false) {
  Storage st;
  st.k = parse_storage_operand(k, fbgemm, st.k_format);
  st.v = parse_storage_operand(v, fbgemm, st.v_format);
  return st;
}

// kvq.gate's large_logits and split_stress families (gate_cases.py): scores past float32's exp range in
// some sequences of a batch and not in others, a dominating key first, last or mid-sequence, lengths that
// leave T-based splits empty; split-K variants also at forced split counts.
void run_large_logits(Gate& g, int64_t T, bool split_k) {
  struct Shaped {
    const char* name;
    DecodeShape shape;
    std::vector<int32_t> lens;
    std::vector<const char*> modes;
  };
  const int32_t t = static_cast<int32_t>(T);
  const std::vector<Shaped> cases = {
      {"large logits", {"", 5, 8, 2, T, 128}, {t, t - 3, t / 2, 7, t}, {"plain", "large", "negative", "dominant@0.5", "plain"}},
      {"large logits, MQA", {"", 3, 8, 1, T, 64}, {t, t, 1}, {"dominant@1", "plain", "large"}},
      {"split stress", {"", 5, 8, 2, 4 * T, 128}, {4 * t, 4 * t - 1, t + 1, 65, 4 * t},
       {"dominant@1", "dominant@0", "dominant@0.99", "dominant@1", "plain"}}};
  for (const Storage& st : {raw(KvFormat::kBf16), raw(KvFormat::kFp16), quantized("int8-head", "int8-head"),
                            quantized("int4-g32-asym", "int4-g32-asym"), quantized("fp8-e4m3-head", "fp8-e4m3-head"),
                            quantized("q4_0", "q8_0"), quantized("int4-chan-t32-asym+w64", "int4-g32-asym+w64")})
    for (const Shaped& c : cases)
      for (int splits : split_k ? std::vector<int>{0, 7, 64} : std::vector<int>{0}) {
        const DecodeShape& s = c.shape;
        const int64_t kv_n = s.batch * s.kv_heads * s.tokens * s.head_dim;
        std::vector<float> k = random_normal(kv_n, 11, s.head_dim), v = random_normal(kv_n, 12, s.head_dim, 3.0f);
        std::vector<float> q = random_normal(s.batch * s.q_heads * s.head_dim, 13, s.head_dim, 1.0f);
        std::vector<LogitMode> modes;
        for (const char* m : c.modes) modes.push_back(LogitMode::parse(m));
        shape_logits(q, k, s, c.lens, modes, 1.0 / std::sqrt(static_cast<double>(s.head_dim)), 17);
        const std::string name = splits ? fmt::format("{}, {} splits", c.name, splits) : std::string(c.name);
        g.run({name, s, c.lens, false, st, splits}, std::move(k), std::move(v), std::move(q));
      }
}

// kvq.gate's strided, nonfinite, long (32K) and huge_cache families (gate_cases.py): rows 16 bytes
// apart; +Inf in V of sequence 1 and NaN in K of sequence 2 (their rows not judged, the others must be
// untouched); a 32K cache; a cache past 2^31 elements (full runs only: 9 GB of host and device memory).
void run_placements(Gate& g, int64_t T, bool quick) {
  const int32_t t = static_cast<int32_t>(T);
  for (const Storage& st : {raw(KvFormat::kBf16), quantized("int8-head", "int8-head"),
                            quantized("int4-g32-asym", "int4-g32-asym"), quantized("q4_0", "fp8-e4m3")}) {
    Case c{"strided views", {"", 3, 8, 2, T, 128}, {t, t / 2 + 3, 17}, false, st};
    c.placement = Placement::kStrided;
    g.run(c);
  }
  for (const Storage& st : {raw(KvFormat::kBf16), raw(KvFormat::kFp16)}) {
    const DecodeShape s{"", 4, 8, 2, T, 128};
    const std::vector<int32_t> lens = {t, t - 9, t / 2, 40};
    const int64_t kv_n = s.batch * s.kv_heads * s.tokens * s.head_dim;
    std::vector<float> k = random_normal(kv_n, 11, 128), v = random_normal(kv_n, 12, 128, 3.0f);
    auto at = [&](int64_t b) { return ((b * s.kv_heads + s.kv_heads - 1) * s.tokens + lens[b] / 2) * s.head_dim + 5; };
    v[at(1)] = std::numeric_limits<float>::infinity();
    k[at(2)] = std::numeric_limits<float>::quiet_NaN();
    Case c{"Inf and NaN in one sequence", s, lens, false, st};
    c.broken = {1, 2};
    g.run(c, std::move(k), std::move(v));
  }
  if (quick) return;
  for (const Storage& st : {raw(KvFormat::kBf16), quantized("int8-head", "int8-head"),
                            quantized("int4-g32-asym", "int4-g32-asym")})
    g.run({"long, 32K", {"", 2, 8, 2, 32768, 128}, {32768, 20001}, false, st});
  for (const Storage& st : {raw(KvFormat::kBf16), quantized("int8-head", "int8-head")}) {
    Case c{"cache past 2^31 elements", {"", 4, 8, 4, 64, 128}, {64, 0, 33, 64}, false, st};
    c.placement = Placement::kHuge;
    g.run(c);
  }
}

// kvq.gate's paged family: every storage in pages of 16, 32, 64 and 128 tokens (in turn) shuffled
// through a pool with poisoned spare pages, the lengths no multiple of a page; the common storages
// at every page size, other head dims and groups, forced splits. +wW windows' raw tokens lie in pages
// of their own (another order; the pages before a window's first token name a poisoned spare page).
// Quick runs: a few of each.
void run_paged(Gate& g, int64_t T, bool quick, const std::vector<Storage>& storages) {
  const int32_t t = static_cast<int32_t>(T);
  const int pages[] = {16, 32, 64, 128};
  auto paged = [](Case c, int page_tokens) {
    c.placement = Placement::kPaged, c.page_tokens = page_tokens;
    return c;
  };
  const std::vector<int32_t> lens = {t, 1, t / 2 + 27, 0};
  for (size_t i = 0; i < storages.size(); ++i)
    if (!quick || i % 8 == 0)
      g.run(paged({"paged", {"", 4, 8, 2, T, 128}, lens, false, storages[i]}, pages[i % 4]));
  for (const Storage& st : {raw(KvFormat::kBf16), quantized("int8-head", "int8-head"),
                            quantized("int4-g32-asym", "int4-g32-asym"), quantized("q4_0", "q8_0"),
                            quantized("nvfp4", "nvfp4"), quantized("int4-head-asym", "int4-head-asym", true),
                            quantized("int4-g32-asym+w40", "int8-head+w24"), quantized("q8_0+w17", "int4-head-asym"),
                            quantized("int4-chan-t32-asym+w40", "int8-head"), quantized("int8-chan-t64", "int4-g32-asym+w24")})
    for (int page : pages) {
      if (quick && page != 16) continue;
      g.run(paged({"paged, page sizes", {"", 3, 8, 2, T, 128}, {t, t - 17, 33}, false, st}, page));
      if (quick) continue;
      g.run(paged({"paged, head_dim 64, MQA", {"", 2, 8, 1, T, 64}, {t - 1, 45}, false, st}, page));
      g.run(paged({"paged, head_dim 256, group of 6", {"", 2, 12, 2, T, 256}, {t, 100}, false, st}, page));
    }
  if (g.v.split_k)
    for (int splits : {1, 3, 64})  // splits start at multiples of a step: pages of 16 split between halves
      for (const Storage& st : {quantized("int8-head-asym", "int4-g32-asym"), quantized("int4-g32-asym+w200", "int8-head+w37")})
        g.run(paged({fmt::format("paged, forced {} splits", splits), {"", 2, 8, 2, 1000, 128}, {1000, 333}, false, st,
                     splits},
                    16));
}

// Why no decode kernel reads storage `st` at `head_dim` (a dump's D may be anything), or "" when one
// does; a variant's own limits are checked on the planned launch (Gate::run).
std::string storage_unsupported_reason(const Storage& st, int64_t head_dim) {
  const int d = static_cast<int>(head_dim);
  if (!decode_head_dim_supported(d)) return fmt::format("head_dim {} (decode kernels take 8, 64, 128 or 256)", d);
  const bool fbgemm = st.k_format == KvFormat::kInt4Fbgemm;
  for (const std::optional<Scheme>& scheme : {st.k, st.v}) {
    if (!scheme) continue;
    const Scheme& s = *scheme;
    std::string why = decode_unsupported_reason(s, d, fbgemm);
    if (why.empty()) {
      try {
        check_scheme_fits(s, d);
      } catch (const SchemeError& e) {
        why = e.what();
      }
    }
    if (!why.empty()) return why;
  }
  return "";
}

}  // namespace

ToleranceCheck check_tolerance(const std::vector<float>& out, const std::vector<float>& lse,
                               const std::vector<double>& ref_o, const std::vector<double>& ref_lse,
                               const std::vector<double>& mimic_o, const std::vector<double>& mimic_lse) {
  ToleranceCheck t;
  const size_t n = ref_o.size(), rows = ref_lse.size(), d = rows ? n / rows : 0;
  std::string problem;
  for (size_t i = 0; i < n; ++i) {
    const double e = std::fabs(out[i] - ref_o[i]), em = std::fabs(mimic_o[i] - ref_o[i]);
    if (!std::isfinite(out[i]) && problem.empty()) problem = fmt::format("O[{}] = {}", i, out[i]);
    t.max_err = std::max(t.max_err, e), t.mimic_max = std::max(t.mimic_max, em);
    t.mean_err += e / static_cast<double>(n), t.mimic_mean += em / static_cast<double>(n);
    t.floor = std::max(t.floor, 2 * bf16_noise(ref_o[i]));
  }
  double lse_mimic = 0, lse_scale = 0;
  for (size_t r = 0; r < rows; ++r) {
    if (std::isinf(ref_lse[r])) {  // empty key set: exactly O = 0, LSE = -inf
      bool zero = lse[r] == -std::numeric_limits<float>::infinity();
      for (size_t j = 0; j < d; ++j) zero = zero && out[r * d + j] == 0.0f;
      if (!zero && problem.empty()) problem = fmt::format("row {} has no keys but O != 0 or LSE = {}", r, lse[r]);
      continue;
    }
    t.lse_max_err = std::max(t.lse_max_err, std::fabs(lse[r] - ref_lse[r]));
    if (!std::isfinite(lse[r]) && problem.empty()) problem = fmt::format("LSE[{}] = {}", r, lse[r]);
    lse_mimic = std::max(lse_mimic, std::fabs(mimic_lse[r] - ref_lse[r]));
    lse_scale = std::max(lse_scale, std::fabs(ref_lse[r]));
  }
  // LSE is fp32: its floor is 8 ulps at its magnitude (exp2/log approximations differ from libm's).
  t.lse_allowed = 2 * lse_mimic + 8 * std::ldexp(std::max(lse_scale, 1.0), -23);
  const double allowed_max = 2 * t.mimic_max + t.floor, allowed_mean = 2 * t.mimic_mean + t.floor;
  t.ok = problem.empty() && t.max_err <= allowed_max && t.mean_err <= allowed_mean && t.lse_max_err <= t.lse_allowed;
  t.detail = fmt::format("max |O-ref| {:.3g} <= {:.3g}, mean {:.3g} <= {:.3g} (mimic {:.3g}/{:.3g}, floor {:.3g}); "
                         "max |LSE-ref| {:.3g} <= {:.3g}{}",
                         t.max_err, allowed_max, t.mean_err, allowed_mean, t.mimic_max, t.mimic_mean, t.floor,
                         t.lse_max_err, t.lse_allowed, problem.empty() ? "" : "; " + problem);
  return t;
}

std::vector<CaseResult> validate_decode_variant(const DecodeVariant& v, const ValidateOptions& opt,
                                                const std::function<void(const CaseResult&)>& report) {
  Gate g{v, device_info().sm_count, report, {}};
  const int64_t T = opt.quick ? 70 : 300;
  const DecodeShape gqa{"", 3, 8, 2, T, 128};
  const std::vector<int32_t> lens = {static_cast<int32_t>(T), 0, static_cast<int32_t>(T / 2 + 27)};
  // Every storage kind, varlen with an empty sequence, NaN / garbage in the padding.
  const std::vector<Storage> storages = {
      raw(KvFormat::kBf16), raw(KvFormat::kFp16), raw(KvFormat::kBf16, true),
      quantized("int8-tensor", "int8-tensor"), quantized("int8-token", "int8-token"),
      quantized("int8-head", "int8-head"), quantized("int8-head-asym", "int8-head-asym"),
      quantized("int8-g32", "int8-g32"), quantized("int8-g64-asym", "int8-g64-asym"),
      quantized("int8-head-fp32", "int8-token"), quantized("int4-head", "int4-head"),
      quantized("int4-head-asym", "int4-head-asym"), quantized("int4-g32-asym", "int4-g32-asym"),
      quantized("int4-g64", "int4-g64"), quantized("int4-g8-asym", "int4-head-asym"),
      quantized("int4-tensor", "int4-token-asym"), quantized("int4-g32-asym-fp32", "int4-g32-asym-fp32"),
      quantized("int4-head-asym", "int4-head-asym", true), quantized("int4-g32-asym", "int4-g32-asym", true),
      quantized("int4-g16-asym", "int4-g64-asym", true),
      // FP8: every granularity, both formats, scale-free
      quantized("fp8-e4m3-head", "fp8-e4m3-head"), quantized("fp8-e4m3-tensor", "fp8-e4m3-token"),
      quantized("fp8-e5m2-g32", "fp8-e5m2-g64-fp32"), quantized("fp8-e4m3", "fp8-e5m2"),
      // K and V in different formats (tensor cores only)
      quantized("int4-g32-asym", "int8-head"), quantized("int8-head-asym", "int4-head"), quantized("bf16", "int4-g32-asym"),
      quantized("int8-token-asym", "bf16"), quantized("fp8-e4m3-head", "int4-g32-asym"), quantized("fp16", "fp8-e5m2-head"),
      quantized("int4-head-asym", "fp16"), quantized("int4-g32-asym", "fp8-e4m3-tensor"),
      // +wW: both windows, one of them, W = 0 and W >= T, K and V windows of different lengths
      quantized("int4-token-asym+w16", "int4-token-asym+w16"), quantized("int4-g32-asym+w64", "int8-head+w64"),
      quantized("int8-head+w100", "int4-g32-asym"), quantized("bf16", "fp8-e4m3-head+w40"),
      quantized("int4-head-asym+w0", "int4-head-asym+w1000"), quantized("int4-g32-asym+w32", "int4-g32-asym+w80"),
      // one window on K and V: read at the end of the last split (int4 V by the word, nvfp4 V's blocks)
      quantized("int4-head-asym+w40", "int4-head-asym+w40"), quantized("q8_0+w24", "nvfp4+w24"),
      // chan-tN K (KIVI), with and without windows; token groups tensor cores cannot read
      quantized("int4-chan-t32-asym", "int4-g32-asym"), quantized("int8-chan-t64", "int8-head"),
      quantized("int4-chan-t32-asym+w64", "int4-g32-asym+w64"), quantized("int8-chan-t32-asym+w50", "int4-head-asym"),
      quantized("int4-chan-t16-asym", "int4-g32-asym"), quantized("int8-chan-t64", "int4-g32-asym+w24"),
      // +had K (Q rotated in the kernel), +had V (O rotated back); +had with a window: not read (skipped)
      quantized("int4-g32-asym+had", "int4-g32-asym"), quantized("int8-head-asym+had", "int4-head-asym"),
      quantized("int4-chan-t32-asym+had", "int4-g32-asym"), quantized("int4-g32-asym", "int4-g32-asym+had"),
      quantized("int4-g32-asym+had+w32", "int4-g32-asym"),
      // llama.cpp's cache types and mxfp4 / nvfp4 (the codec's planar layout); nvfp4 V: blocks of 16,
      // whose scales decode-tc multiplies into the V fragments
      quantized("q8_0", "q8_0"), quantized("q4_0", "q4_0"), quantized("q4_1", "q4_1"), quantized("q5_0", "q5_0"),
      quantized("q5_1", "q5_1"), quantized("iq4_nl", "iq4_nl"), quantized("mxfp4", "mxfp4"), quantized("nvfp4", "q8_0"),
      quantized("q8_0", "nvfp4"), quantized("q8_0", "q4_0"), quantized("q4_1", "q5_0"), quantized("q5_1", "iq4_nl"),
      quantized("mxfp4", "q4_1"), quantized("bf16", "q5_1"), quantized("iq4_nl", "fp16"), quantized("q8_0", "int4-g32-asym"),
      quantized("int8-head", "q5_0"), quantized("q4_0+w32", "q5_1+w64"), quantized("q4_0+had", "q4_0"),
      quantized("q4_0+had64", "q8_0"),  // llama.cpp's rotation blocks: at D = 128, two 64-blocks
      quantized("q4_0+had", "q4_0+had64"), quantized("q8_0+had", "q5_1+had64"), quantized("int8-head", "int8-head+had32"),
      quantized("nvfp4+had", "iq4_nl"), quantized("nvfp4", "nvfp4"), quantized("bf16", "nvfp4+w24")};
  for (const Storage& st : storages) g.run({"varlen GQA", gqa, lens, false, st});
  // Head dims, head-group sizes (MHA, MQA, groups that are not a power of two, groups over 8), ALiBi.
  for (const auto& [k, vs] : {std::pair{"bf16", "bf16"}, std::pair{"int8-head", "int8-head"},
                               std::pair{"int4-g32-asym", "int4-g32-asym"}, std::pair{"fp8-e4m3-head", "fp8-e4m3-head"},
                               std::pair{"int4-head-asym", "int8-g32-asym"}, std::pair{"q5_1", "q4_0"},
                               std::pair{"nvfp4", "mxfp4"}, std::pair{"q5_0", "q5_0"},
                               std::pair{"int4-chan-t32-asym+w128", "int4-g32-asym+w128"}, std::pair{"bf16", "q4_0"},
                               std::pair{"iq4_nl", "nvfp4"}, std::pair{"q8_0+had", "q4_0+had64"},
                               std::pair{"int4-g32-asym+w40", "int4-head-asym+w40"}}) {
    // raw K with quantized V: the general kernel (at D = 256 one MMA chain, whose sum is the score)
    const Storage st = std::string(k) == "bf16" && std::string(vs) == "bf16" ? raw(KvFormat::kBf16) : quantized(k, vs);
    for (int d : {64, 256}) g.run({"head_dim", {"", 2, 4, 2, T, d}, {}, false, st});
    g.run({"MHA", {"", 2, 4, 4, T, 128}, {}, false, st});
    g.run({"MQA", {"", 2, 8, 1, T, 128}, {}, false, st});
    g.run({"group of 6, ALiBi", {"", 2, 12, 2, T, 128}, {static_cast<int32_t>(T - 1), 5}, true, st});
    g.run({"group of 16", {"", 1, 16, 1, T, 64}, {}, false, st});
  }
  g.run({"ALiBi, windows", {"", 2, 12, 2, T, 128}, {static_cast<int32_t>(T - 1), 5}, true,
         quantized("int4-g32-asym+w48", "int8-head+w20")});
  // Split-K: forced split counts agree with the single pass (both within the rule).
  if (v.split_k)
    for (int splits : {1, 2, 3, 7, 64, kMaxSplits}) {
      const Case c{fmt::format("forced {} splits", splits), {"", 2, 8, 2, 1000, 128}, {1000, 333}, false,
                   quantized("int8-head", "int8-head"), splits};
      g.run(c);
      g.run({fmt::format("forced {} splits, windows", splits), {"", 2, 8, 2, 1000, 128}, {1000, 333}, false,
             quantized("int4-g32-asym+w200", "int8-head+w37"), splits});
      g.run({fmt::format("forced {} splits, one window", splits), {"", 2, 8, 2, 1000, 128}, {1000, 333}, false,
             quantized("int8-head+w64", "int4-g32-asym+w64"), splits});
      // rotated K and V: each split's O rotated back before the merge (kernel or cluster)
      g.run({fmt::format("forced {} splits, +had", splits), {"", 2, 8, 2, 1000, 128}, {1000, 333}, false,
             quantized("q4_0+had", "q4_0+had64"), splits});
    }
  run_large_logits(g, T, v.split_k);
  run_placements(g, T, opt.quick);
  run_paged(g, T, opt.quick, storages);
  // Hostile shapes: one key, keys not a tile multiple, no keys at all, no batch.
  for (const Case& c : {Case{"one key", {"", 1, 4, 1, 1, 128}, {}, false, raw(KvFormat::kBf16)},
                        Case{"33 keys", {"", 2, 4, 2, 33, 128}, {}, false, quantized("int4-g32-asym", "int4-g32-asym")},
                        // odd T: per-row fp16 parameters of most rows start mid-word, the last ends the array
                        Case{"odd T", {"", 3, 8, 2, 37, 128}, {37, 20, 1}, false, quantized("int8-head-asym", "int8-token-asym")},
                        Case{"odd T, groups", {"", 2, 8, 1, 45, 64}, {45, 13}, false, quantized("int4-g16-asym", "int4-g32")},
                        // one-byte scales: a row's span starts at any byte of a word
                        Case{"odd T, one-byte scales", {"", 2, 8, 1, 45, 64}, {45, 13}, false, quantized("nvfp4", "mxfp4")},
                        Case{"odd T, nvfp4 V", {"", 2, 8, 1, 45, 64}, {45, 13}, false, quantized("mxfp4", "nvfp4")},
                        Case{"no keys", {"", 2, 4, 2, 16, 128}, {0, 0}, false, quantized("int8-head", "int8-head")},
                        // both windows over every key: one launch (the raw region), O written directly
                        Case{"windows over every key", {"", 2, 8, 2, 64, 128}, {}, false,
                             quantized("int4-g32-asym+w128", "int8-head+w100")},
                        Case{"T = 0", {"", 1, 4, 2, 0, 128}, {}, false, raw(KvFormat::kBf16)},
                        Case{"B = 0", {"", 0, 4, 2, 16, 128}, {}, false, raw(KvFormat::kBf16)}})
    g.run(c);
  // A real dump (--dump; the bundled capture by default) as it is: every layer, every batch entry
  // with its own seq_len, the layer's heads, D, ALiBi flag and softmax scale, and its own decode
  // queries (experiments/gate/dump_decode_cases.hpp). What the variant cannot run is reported skipped.
  if (!opt.bundled_dump.empty() && !opt.quick) {
    const DumpInfo info = open_dump(opt.bundled_dump);
    const std::string file = std::filesystem::path(opt.bundled_dump).filename().string();
    for (size_t i = 0; i < info.layers.size(); ++i) {
      const KvLayer layer = read_layer(info, i);
      check_finite_queries(info, i, layer);
      const std::vector<DumpDecodeCase> cases = dump_decode_cases(layer, file);
      for (const Storage& st : {raw(KvFormat::kBf16), quantized("int8-head", "int8-head"),
                                quantized("int4-head-asym", "int4-head-asym")}) {
        const std::string why = cases.empty() ? "the layer has no decode queries (q)"
                                              : storage_unsupported_reason(st, layer.kv_shape.head_dim);
        if (!why.empty()) {
          g.skip(fmt::format("dump {} layer {}", file, layer.layer), st, why);
          continue;
        }
        for (const DumpDecodeCase& dc : cases)
          g.run({"dump " + dc.label, dc.shape, dc.seq_lens, dc.alibi, st}, dc.k, dc.v, dc.q, dc.softmax_scale);
      }
    }
  }
  // Reruns: bitwise identical outputs.
  {
    const Case c{"reruns", {"", 4, 8, 2, opt.quick ? 64 : 2048, 128}, {}, false, quantized("int4-g32-asym", "int4-g32-asym")};
    const DecodeShape& s = c.shape;
    const int64_t kv_n = s.batch * s.kv_heads * s.tokens * s.head_dim;
    DeviceOperand dk = make_operand(c, random_normal(kv_n, 21, 128), c.storage.k, c.storage.k_format);
    DeviceOperand dv = make_operand(c, random_normal(kv_n, 22, 128), c.storage.v, c.storage.v_format);
    DecodeRun run(s, random_normal(s.batch * s.q_heads * s.head_dim, 23, 128, 1.0f), {}, false);
    run.set_cache(c.storage.k_format, dk.op, c.storage.v_format, dv.op);
    const DecodeParams planned = run.plan(v, g.sm_count);
    run.run(planned);
    const std::vector<float> first = run.output(), first_lse = run.lse();
    const int reruns = opt.quick ? 3 : opt.reruns;
    int differing = 0;
    for (int i = 1; i < reruns; ++i) {
      run.run(planned);
      differing += run.output() != first || run.lse() != first_lse;
    }
    g.add({v.name, fmt::format("{} reruns", reruns), c.storage.name(), "int4", "BNSH", shape_string(c, planned),
           differing ? fmt::format("{} reruns differ from the first", differing) : "bitwise identical",
           static_cast<int64_t>(first.size()) * reruns, differing == 0});
  }
  return g.results;
}

}  // namespace kvq
