// Exact attention (DESIGN.md "Attention"): fp64 reference, key-range partials for split-K and their
// LSE merge, and a precision-mimic mode that redoes the math in a kernel's precision.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "quant/kv_tensor.hpp"

namespace kvq {

// One attention call. Query head h reads KV head h / (Hq / Hkv).
struct AttentionProblem {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, q_len = 1, head_dim = 0;  // B, Hq, Hkv, Tq, D
  const float* q = nullptr;           // [B, Hq, Tq, D] contiguous
  KvView k, v;                        // [B, Hkv, T, D]
  const int32_t* seq_lens = nullptr;  // [B]; nullptr: every sequence has T tokens
  double softmax_scale = 0.0;         // 0: 1 / sqrt(D)
  bool alibi = false;

  int64_t tokens() const { return k.shape.tokens; }
  int64_t seq_len(int64_t b) const { return seq_lens ? seq_lens[b] : tokens(); }
  double scale() const;
  KvShape q_shape() const { return {batch, q_heads, q_len, head_dim}; }
};

// Throws InputError for inconsistent shapes, Hq % Hkv != 0, seq_lens outside [0, T].
void check_problem(const AttentionProblem& p);

struct AttentionOutput {
  std::vector<double> o;    // [B, Hq, Tq, D]
  std::vector<double> lse;  // [B, Hq, Tq]; -inf where the key set is empty (then O = 0)
};

// Keys j in [begin, end) (intersected with the causal set). The default is all keys.
struct KeyRange {
  int64_t begin = 0;
  int64_t end = std::numeric_limits<int64_t>::max();
};

enum class RoundTo { kNone, kFp16, kBf16 };
// x rounded (RNE) to `to`'s type through fp32, as a kernel stores it; kNone: x unchanged.
double round_to(double x, RoundTo to);

// How a kernel does the math; the reference is fp64 with no rounding.
struct PrecisionProfile {
  bool fp32 = false;               // logits, softmax and accumulation in fp32 instead of fp64
  // Q rounded before Q.K: bf16, or fp16 after scaling each query row by 2^fp16_operand_exponent
  // (quant/float_formats.hpp), the scaling undone exactly afterwards (tensor-core kernels).
  RoundTo q_before_qk = RoundTo::kNone;
  RoundTo k_before_qk = RoundTo::kNone;  // K values (as dequantized, fp32) rounded before Q.K
  RoundTo p_before_pv = RoundTo::kNone;
  RoundTo output = RoundTo::kNone;

  static PrecisionProfile reference() { return {}; }
  // Parses "fp64" or "fp32[-q{bf16|fp16}][-k{bf16|fp16}][-p{bf16|fp16}][-o{bf16|fp16}]", e.g.
  // "fp32-qfp16-pfp16-obf16".
  static PrecisionProfile parse(const std::string& name);
  std::string name() const;
};

// Attention of every query over the keys in `range`. With the default range and profile this is
// the normative fp64 reference. `probabilities`, if given, receives softmax(s) as
// [B, Hq, Tq, T] (zero outside the key set).
AttentionOutput attention(const AttentionProblem& p, const PrecisionProfile& profile = {}, KeyRange range = {},
                          std::vector<double>* probabilities = nullptr);

// O = sum_s exp(LSE_s - LSE) O_s, LSE = logsumexp_s LSE_s; empty partials (LSE = -inf) ignored.
AttentionOutput merge_partials(const std::vector<AttentionOutput>& partials);

// Split [0, T) into `splits` near-equal key ranges, attend each, merge.
AttentionOutput split_k_attention(const AttentionProblem& p, int64_t splits);

// ALiBi slopes m_1..m_n (BLOOM's rule for n not a power of two).
std::vector<double> alibi_slopes(int64_t n);

}  // namespace kvq
