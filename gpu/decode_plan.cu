// The launch plan of a decode on the host: split counts (tensor_core_splits, plan_decode), the
// tensor-core configuration, whether +wW windows are read as a tail, and the key regions of a
// windowed decode. The numbers in the comments are the sweeps that chose each rule.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu/decode_tc_launch.cuh"

namespace kvq {

int nonempty_splits(int64_t tokens, int64_t splits, int64_t round) {
  if (tokens <= 0 || splits <= 1) return 1;
  round = std::max<int64_t>(round, 1);
  const int64_t per_split = ((tokens + splits - 1) / splits + round - 1) / round * round;
  return static_cast<int>((tokens + per_split - 1) / per_split);
}

int tensor_core_splits(int64_t base_ctas, int64_t resident_ctas, int64_t tokens, int64_t sm_count, int64_t round,
                       int raw_operands) {
  // Each split re-reads Q and pays a prologue and a merge: at least 128 keys (one step per warp)
  // per split. Among the counts allowed, the first whose last wave is at least 85% full; else the
  // fullest. Waves are counted with the splits that hold keys (H100, SmolLM2 B = 8 T = 8K int8:
  // 15 asked, 13 held keys, 0.79 of a wave; 16 fill it: 21.0 -> 20.1 us, int4-g32 22.5 -> 20.0).
  const int64_t most = std::clamp<int64_t>(tokens / 128, 1, kMaxSplits);
  // One CTA an SM (at least one split), as the kernel holds it: the count the two rules below may take.
  const bool grid = base_ctas > 0 && sm_count > 0;
  const int one_per_sm = grid ? nonempty_splits(tokens, std::clamp<int64_t>(sm_count / base_ctas, 1, most), round) : 1;
  // A raw bf16 / fp16 operand's CTA (3 stages of 16 keys: 1.5x a quantized CTA's bytes in flight)
  // keeps an SM's memory busy alone: where one split's CTAs fit on the SMs, one wave of one CTA an SM
  // (H100 sweeps, decode-split-counts/, this count against the resident slots': SmolLM2 B = 8 T = 8K
  // 5 splits 25.3 us / 15 27.6, T = 1K 4 10.6 / 8 11.4; llama8b B = 8 T = 1K 2 18.4 / 3 19.4, T = 8K
  // 2 95.7 / 4 99.5; seed000 B = 64 2 97.7 / 4 101.0; one loss, seed000 B = 32 4 58.8 / 8 55.3).
  if (raw_operands > 0 && grid && base_ctas <= sm_count) return one_per_sm;
  // bf16 / fp16 K and V whose split's CTAs exceed the SMs: one split. The CTAs already cover every SM,
  // and each added split only re-reads Q and adds partials to merge (H200 sweeps,
  // decode-four-ctas/split-counts/, bf16 one split against the fill rule's two: SmolLM2 B = 64 T = 1K
  // 17.6 / 18.4 us, T = 8K 94.8 / 96.1; llama8b B = 64 and seed000 B = 256 / 512 planned one already).
  // Quantized CTAs want the resident slots' warps there (int4-g32 seed000 B = 256: 1 split 204 us, 3 183).
  if (raw_operands == 2 && grid) return 1;
  int best = 1;
  double best_fill = 0;
  for (int64_t s = 1; s <= most && base_ctas > 0 && resident_ctas > 0; ++s) {
    const int n = nonempty_splits(tokens, s, round);
    const double waves = static_cast<double>(base_ctas * n) / static_cast<double>(resident_ctas);
    const double fill = waves / std::ceil(waves);  // useful fraction of the waves the grid occupies
    if (fill > best_fill + 1e-9) best_fill = fill, best = n;
    if (fill >= 0.85) break;
  }
  // A tiny grid (B = 1 or 2: at most 16 CTAs per split) whose splits stay short (<= 1024 keys) is a
  // latency chain, not a bandwidth problem: one CTA per SM beats filling every resident slot, whose
  // CTAs only slow each other (H100, llama8b B=1 T=8K: 16 splits 17.0 us vs 29 splits 19.3 us for
  // int8-head; at T=32K the resident slots win again for INT4).
  if (grid && base_ctas <= 16 && one_per_sm < best && tokens / one_per_sm <= 1024) best = one_per_sm;
  return best;
}

std::vector<TcConfig> tc_configs(const DecodeParams& p) {
  if (p.family != DecodeFamily::kTensorCore) return {TcConfig::kStandard};
  const detail::TcEntry e = detail::tc_entry_of(p);  // the kernels this build has (no CUDA call)
  std::vector<TcConfig> out = {TcConfig::kStandard};
  for (TcConfig c : {TcConfig::kLongSteps, TcConfig::kFourCtas})
    if (e.has_config && e.has_config(p, c)) out.push_back(c);
  return out;
}

namespace {
// The key splits of p's tensor-core launch (p.splits == 0) with `base` CTAs per split.
int tc_planned_splits(const DecodeParams& p, int64_t base, int sm_count) {
  // A windowed decode shares its splits among key regions of other lengths: counted as asked (one
  // read at the end of the last split is planned as its plain scheme).
  const bool windowed = (p.k_window.present() || p.v_window.present()) && !p.window_tail;
  const int round = windowed ? 1 : detail::tc_split_round(p);
  const int raw_operands = (is_quantized(p.k_format) ? 0 : 1) + (is_quantized(p.v_format) ? 0 : 1);
  int splits = tensor_core_splits(base, sm_count * detail::ctas_per_sm(p), p.tokens, sm_count, round, raw_operands);
  // Short splits are a latency chain, and merging them in clusters saves the merge kernel's launch
  // (~2.5 us at B = 1): where the count's clusters do not all fit at once, the largest count up to
  // it whose clusters do, if its splits stay within 512 keys (H100, llama8b B = 8 T = 1K: 2-3
  // splits in clusters instead of 4-6 merged by the kernel, 0.91-1.00x; with 1024-key splits at
  // T = 8K int4-g32 and int8 were up to 1.22x slower).
  if (!windowed && p.batch > 0 && splits > 1) {
    DecodeParams q = p;
    q.splits = splits;
    if (!detail::tc_cluster_merge_fits(q))
      for (q.splits = std::min(splits, detail::kMaxClusterSplits); q.splits >= 2 && p.tokens / q.splits <= 512; --q.splits)
        if (detail::tc_cluster_merge_fits(q)) {
          splits = q.splits;
          break;
        }
  }
  // The kernel rounds a split's keys up to whole rounds of steps: the count that leaves no split
  // empty (H100, SmolLM2 B = 1 T = 8K: 44 splits of 256 keys, 12 of them empty CTAs and partials).
  return nonempty_splits(p.tokens, splits, round);
}
// The tensor-core launch of p with `base` CTAs a split: configuration and (unless forced) splits.
DecodeParams plan_tensor_core(DecodeParams p, int64_t base, int sm_count) {
  // 16-bit K and V whose split's CTAs fit on the SMs (one CTA an SM, below): 32-key steps, half the
  // latency chains (H200, bf16 against 16-key steps: llama8b B = 1 T = 1K 0.94, SmolLM2 B = 1 / 8
  // T = 8K 0.89 / 0.86; where CTAs share SMs, llama8b B = 64 T = 1K 1.08 and SmolLM2 B = 64 1.06-1.36).
  const std::vector<TcConfig> configs = tc_configs(p);
  auto has = [&](TcConfig c) { return std::find(configs.begin(), configs.end(), c) != configs.end(); };
  p.tc_config = base <= sm_count && has(TcConfig::kLongSteps) ? TcConfig::kLongSteps : TcConfig::kStandard;
  const bool planned = p.splits == 0;
  if (planned) p.splits = tc_planned_splits(p, base, sm_count);
  // int4 K and V by the row at D = 128: four CTAs an SM where they share SMs over splits of at least
  // 512 keys; the 128-register cap costs instructions on every key, which short splits (latency
  // chains) and grids of one CTA an SM pay for nothing (H200, against three: seed000 B = 128-512
  // T = 8K 0.90-0.97, llama8b B = 64 T = 1K 0.79 at one split each; llama8b B = 8 T = 1K, 256-key
  // splits, 1.05).
  if (has(TcConfig::kFourCtas)) {
    DecodeParams four = p;
    four.tc_config = TcConfig::kFourCtas;
    if (planned) four.splits = tc_planned_splits(four, base, sm_count);
    if (four.tokens >= 512LL * four.splits && base * four.splits > sm_count) p = four;
  }
  return p;
}

// Whether reading the windows at the end of the last split beats their launch of their own and the
// merge kernel after it. A tail whose raw steps take one stage of the warps' rings (int4's, int5's) is
// two latency chains added to each last-split CTA: where the splits are few (a third of the CTAs or
// more carry it) and the grid runs in waves, each wave waits for it (H200, seed000 T = 8K, tail /
// regions: int4-g32-asym B = 128 / 256 / 512, 3 / 3 / 2 splits, 1.065 / 1.123 / 1.080; int4-head-asym
// B = 256, 2 splits, 1.080, B = 512, 1, 1.005). In one wave or over 4 splits or more it pays (SmolLM2
// B = 64, 2 splits: 0.74-0.76; 4-16 splits 0.69-0.99), and two stages (int8-head) everywhere (0.64-0.95).
bool window_tail_pays(const DecodeParams& p, int64_t base, int sm_count) {
  const detail::TcEntry e = detail::tc_entry_of(p);
  if (!e.window_tail_stages || e.window_tail_stages(p) >= 2 || p.splits > 3) return true;
  return base * p.splits <= static_cast<int64_t>(sm_count) * detail::ctas_per_sm(p);
}
}  // namespace

DecodeParams plan_decode(DecodeParams p, int sm_count, int max_heads_per_cta, double waves) {
  const int64_t group = p.q_heads / std::max<int64_t>(p.kv_heads, 1);
  int hpc = 1;  // a row's lanes reduce-scatter one head each: at most D/8 heads
  while (hpc < group && hpc < max_heads_per_cta && hpc < p.head_dim / kDecodeChunk) hpc *= 2;
  if (p.family == DecodeFamily::kTensorCore) hpc = 8;  // the MMA's N: padded heads cost nothing that matters
  p.heads_per_cta = hpc;
  const int64_t base = p.batch * p.kv_heads * ((group + hpc - 1) / hpc);  // CTAs per split
  if (p.family == DecodeFamily::kTensorCore) {
    // +wW windows on K and V: read at the end of the last split where that pays, planned as such
    p.window_tail = window_tail_fits(p);
    DecodeParams planned = plan_tensor_core(p, base, sm_count);
    if (planned.window_tail && !window_tail_pays(planned, base, sm_count)) {
      p.window_tail = false;
      planned = plan_tensor_core(p, base, sm_count);
    }
    p = planned;
  } else if (p.splits == 0) {
    const int per_sm = detail::ctas_per_sm(p);
    const double wanted = waves * sm_count * per_sm;
    int64_t splits = base > 0 ? static_cast<int64_t>(std::ceil(wanted / static_cast<double>(base))) : 1;
    splits = std::min<int64_t>(splits, std::max<int64_t>(1, p.tokens / 256));
    p.splits = static_cast<int>(std::clamp<int64_t>(splits, 1, kMaxSplits));
  }
  return p;
}

bool window_tail_fits(const DecodeParams& p) {
  const KvWindow &kw = p.k_window, &vw = p.v_window;
  return p.family == DecodeFamily::kTensorCore && !p.block_table && kw.present() && vw.present() &&
         kw.tokens == vw.tokens && kw.round_to == vw.round_to && kw.format == KvFormat::kBf16 &&
         vw.format == KvFormat::kBf16 && is_quantized(p.k_format) &&
         is_quantized(p.v_format) && p.k.mode != ParamMode::kChannel && !p.k.hadamard && !p.v.hadamard;
}

std::vector<DecodeParams> decode_regions(const DecodeParams& p) {
  DecodeParams all = p;
  all.region = KeyRegion::kAll, all.split_base = 0;
  if (!p.k_window.present() && !p.v_window.present()) return {all};
  if (p.window_tail && window_tail_fits(p)) {
    DecodeParams one = p;
    one.region = KeyRegion::kBothQuantized, one.split_base = 0, one.region_count = 1, one.window_tail = true;
    return {one};
  }
  std::vector<KeyRegion> regions = {KeyRegion::kBothQuantized};
  // Windows of the same length and rounding start at the same key in every sequence: no key has one
  // operand raw and the other quantized, whatever the lengths on the device (`+wW` on K and V alike).
  const bool same_windows = p.k_window.present() && p.v_window.present() && p.k_window.tokens == p.v_window.tokens &&
                            p.k_window.round_to == p.v_window.round_to;
  if (p.k_window.present() && !same_windows) regions.push_back(KeyRegion::kKRaw);
  if (p.v_window.present() && !same_windows) regions.push_back(KeyRegion::kVRaw);
  if (p.k_window.present() && p.v_window.present()) regions.push_back(KeyRegion::kBothRaw);
  std::vector<DecodeParams> out;
  int base = 0;
  for (KeyRegion r : regions) {
    int64_t lo = 0, hi = 0;  // the region's keys in a full-length sequence: its share of the splits
    key_region_bounds(r, p.k_window, p.v_window, p.tokens, lo, hi);
    // Every sequence T tokens long: a region empty at T is empty everywhere (one launch is kept).
    if (!p.seq_lens && hi <= lo && !(r == regions.back() && out.empty())) continue;
    DecodeParams q = p;
    q.region = r, q.split_base = base;
    const bool k_raw = r == KeyRegion::kKRaw || r == KeyRegion::kBothRaw, v_raw = r == KeyRegion::kVRaw || r == KeyRegion::kBothRaw;
    if (k_raw) q.k = p.k_window.raw, q.k_format = p.k_window.format;
    if (v_raw) q.v = p.v_window.raw, q.v_format = p.v_window.format;
    if (p.block_table) {  // each operand through its pages' table
      const int32_t* k_table = k_raw ? p.window_block_table : p.block_table;
      const int32_t* v_table = v_raw ? p.window_block_table : p.block_table;
      q.block_table = k_table, q.v_block_table = v_table != k_table ? v_table : nullptr;
    }
    const double share = p.tokens > 0 ? static_cast<double>(std::max<int64_t>(hi - lo, 0)) / static_cast<double>(p.tokens) : 0;
    q.splits = std::max(1, static_cast<int>(std::lround(share * p.splits)));
    base += q.splits;
    out.push_back(q);
  }
  for (DecodeParams& q : out) q.region_count = static_cast<int>(out.size());
  return out;
}

int total_splits(const DecodeParams& p) {
  int total = 0;
  for (const DecodeParams& r : decode_regions(p)) total += r.splits;
  return total;
}

int64_t partial_o_floats(const DecodeParams& p) {
  const int64_t n = total_splits(p);
  return n > 1 ? n * p.batch * p.q_heads * p.head_dim : 0;
}
int64_t partial_lse_floats(const DecodeParams& p) {
  const int64_t n = total_splits(p);
  return n > 1 ? n * p.batch * p.q_heads : 0;
}

}  // namespace kvq
