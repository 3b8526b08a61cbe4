// The gate's large-logit cases, as kvq.gate's large_logits and split_stress families build them
// (python/kvq/gate_cases.py shape_logits): per sequence, scores left as drawn, scaled into the
// hundreds, all far below zero, or one key far above the rest -- past exp's float32 range (88.7),
// which a softmax without the running maximum, or a split-K merge weighted by the wrong maximum,
// does not survive. Host code: the CPU tests check what it builds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "experiments/common/decode_shapes.hpp"

namespace kvq {

inline constexpr float kLogitScale = 40.0f;    // Q's magnitude in a shaped sequence
inline constexpr float kLogitTarget = 300.0f;  // a dominating key's score (minus every key's, "negative")

// "plain", "large", "negative" or "dominant@F" (the key at fraction F of the sequence dominates).
struct LogitMode {
  enum Kind { kPlain, kLarge, kNegative, kDominant } kind = kPlain;
  double at = 0.0;
  static LogitMode parse(const std::string& text);  // throws InputError naming the text
  std::string name() const;
};

// q [B, Hq, D] and k [B, Hkv, T, D] (float32, before Q's bf16 rounding and K's storage), shaped in place:
// sequence b per modes[b]; lens[b] its length (empty: all T). The direction of a shaped KV head's
// scores is drawn from `seed`.
void shape_logits(std::vector<float>& q, std::vector<float>& k, const DecodeShape& s, const std::vector<int32_t>& lens,
                  const std::vector<LogitMode>& modes, double softmax_scale, uint32_t seed);

}  // namespace kvq
