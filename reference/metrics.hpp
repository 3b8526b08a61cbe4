// The error metrics of DESIGN.md, each named for what it computes. All accumulate in fp64.
#pragma once

#include <cstdint>
#include <vector>

#include "quant/groups.hpp"

namespace kvq {

// Reconstruction: 10 log10(sum x^2 / sum (x - x')^2) in dB; +inf when x' == x.
double sqnr_db(const std::vector<float>& x, const std::vector<float>& x_hat);

template <typename A, typename B>
double max_abs_difference(const std::vector<A>& a, const std::vector<B>& b);

// Attention output vs a reference, per head = one (b, query head) with its Tq x D values.
struct OutputError {
  double rel_l2_mean = 0;  // mean over heads of ||O' - O|| / ||O||
  double rel_l2_max = 0;   // max over heads
  double max_abs = 0;      // max |O' - O| over all elements
  double cosine_mean = 1;  // mean over heads of <O', O> / (||O'|| ||O||)
  double cosine_min = 1;
};
// One head's error. `empty` when the reference is all zero (an empty key set) and the output too:
// rel-L2 and cosine are then undefined and left out of the summaries (a nonzero output there has
// rel-L2 inf). A NaN in the output makes every summary it enters NaN.
struct HeadError {
  double rel_l2 = 0, cosine = 1, max_abs = 0;
  bool empty = false;
};
// `o_test` and `o_ref` are [heads, values_per_head].
std::vector<HeadError> head_errors(const std::vector<double>& o_test, const std::vector<double>& o_ref,
                                   int64_t values_per_head);
OutputError summarize(const std::vector<HeadError>& heads);
inline OutputError output_error(const std::vector<double>& o_test, const std::vector<double>& o_ref,
                                int64_t values_per_head) {
  return summarize(head_errors(o_test, o_ref, values_per_head));
}

// Attention probabilities vs reference, rows of length T (one per query).
struct ProbabilityError {
  double kl_mean = 0;  // mean over queries of KL(P_ref || P') in nats
  double kl_max = 0;
  double topk_overlap_mean = 1;  // |top-k(P_ref) ∩ top-k(P')| / k, mean over queries
  double topk_overlap_min = 1;
};
// Rows whose reference sums to zero (empty key set) are skipped. k is capped at the row's length.
ProbabilityError probability_error(const std::vector<double>& p_test, const std::vector<double>& p_ref,
                                   int64_t row_length, int64_t k);

// Memory: bytes per token per KV head, codes plus scales / zero points (and nvfp4's fp32 tensor
// scale) amortized over the tokens and heads that share them; and the same in bits per element. With a +wW window the tokens kept in
// full precision count kKeptBytes per element (a bf16 / fp16 cache, as serving stacks keep it;
// the sweep keeps the dump's own values) and depend on the sequence lengths (`seq_lens` [B],
// nullptr: all T).
inline constexpr double kKeptBytes = 2.0;
double bytes_per_token_per_head(const Scheme& s, const KvShape& shape, const int32_t* seq_lens = nullptr);
double bits_per_element(const Scheme& s, const KvShape& shape, const int32_t* seq_lens = nullptr);
// Elements sharing one scale: B*H*T*D (tensor), H*D (token), D (head), G, or N (chan-tN).
int64_t elements_per_group(const Scheme& s, const KvShape& shape);

}  // namespace kvq
