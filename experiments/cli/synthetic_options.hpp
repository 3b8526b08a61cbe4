// Command-line options for the synthetic generator, shared by `kvq synth` and `kvq sweep`.
#pragma once

#include <CLI/CLI.hpp>

#include "data/synthetic.hpp"
#include "experiments/cli/number_checks.hpp"

namespace kvq {

inline void add_synthetic_options(CLI::App& cmd, SyntheticSpec& s) {
  auto* g = cmd.add_option_group("synthetic data", "Seeded LLM-shaped K/V/Q (labelled synthetic in every output)");
  g->add_option("--batch", s.batch, "B")->capture_default_str()->check(kPositive);
  g->add_option("--q-heads", s.q_heads, "Hq")->capture_default_str()->check(kPositive);
  g->add_option("--kv-heads", s.kv_heads, "Hkv")->capture_default_str()->check(kPositive);
  g->add_option("--tokens", s.tokens, "T")->capture_default_str()->check(kPositive);
  g->add_option("--head-dim", s.head_dim, "D")->capture_default_str()->check(kPositive);
  g->add_option("--q-len", s.q_len, "Tq: decode queries per sequence (the last Tq positions)")->capture_default_str();
  g->add_option("--seed", s.seed, "Generator seed")->capture_default_str();
  g->add_option("--outlier-channels", s.outlier_channels, "K channels with a large mean")->capture_default_str();
  g->add_option("--outlier-scale", s.outlier_scale, "Their mean, in normal-channel sigmas")->capture_default_str();
  g->add_option("--token-spread", s.token_spread, "Sigma of the log-normal token magnitude")->capture_default_str();
  g->add_option("--sink-tokens", s.sink_tokens, "Attention-sink tokens at the start")->capture_default_str();
  g->add_option("--sink-scale", s.sink_scale, "Sink key norm in units of sqrt(D)")->capture_default_str();
  g->add_option("--query-bias", s.query_bias, "Queries' lean towards the sink direction")->capture_default_str();
  g->add_option("--rope-theta", s.rope_theta, "RoPE base")->capture_default_str();
}

}  // namespace kvq
