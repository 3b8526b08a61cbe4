#include "experiments/bench/bench_cpu.hpp"

#include <algorithm>
#include <chrono>

#include "data/synthetic.hpp"
#include "reference/attention.hpp"

namespace kvq {

namespace {

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

}  // namespace

CpuTiming time_reference(const DecodeShape& shape, int min_reps, double min_seconds) {
  const KvShape kv{shape.batch, shape.kv_heads, shape.tokens, shape.head_dim};
  std::vector<float> k(kv.numel()), v(kv.numel()), q(shape.batch * shape.q_heads * shape.head_dim);
  fill_normal(k, 1, 1);
  fill_normal(v, 1, 2);
  fill_normal(q, 1, 3);
  AttentionProblem p;
  p.batch = shape.batch;
  p.q_heads = shape.q_heads;
  p.kv_heads = shape.kv_heads;
  p.head_dim = shape.head_dim;
  p.q = q.data();
  p.k = KvView::bnsh(k.data(), kv);
  p.v = KvView::bnsh(v.data(), kv);

  using clock = std::chrono::steady_clock;
  attention(p);  // warm-up: page in the buffers
  std::vector<double> ms;
  const auto start = clock::now();
  while (static_cast<int>(ms.size()) < min_reps ||
         std::chrono::duration<double>(clock::now() - start).count() < min_seconds) {
    const auto t0 = clock::now();
    const AttentionOutput out = attention(p);
    ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - t0).count());
  }
  CpuTiming t{shape, static_cast<int>(ms.size()), percentile(ms, 0.5), percentile(ms, 0.1), percentile(ms, 0.9)};
  const double flops = 4.0 * shape.batch * shape.q_heads * shape.tokens * shape.head_dim;
  t.gflops = flops / (t.median_ms * 1e6);
  t.kv_gbps = 2.0 * kv.numel() * sizeof(float) / (t.median_ms * 1e6);
  return t;
}

}  // namespace kvq
