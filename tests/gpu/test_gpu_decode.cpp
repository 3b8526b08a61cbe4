// GPU decode variants: the quick gate (every storage, varlen, NaN padding, GQA/MQA/MHA, ALiBi,
// forced splits, hostile shapes, reruns) and a long-sequence split-K run.
#include <doctest/doctest.h>

#include "experiments/gate/validate_decode.hpp"

using namespace kvq;

TEST_CASE("every decode variant passes the quick gate") {
  for (const DecodeVariant& v : decode_variants()) {
    CAPTURE(v.name);
    int cases = 0;
    validate_decode_variant(v, {true, 3, ""}, [&](const CaseResult& r) {
      ++cases;
      CHECK_MESSAGE(r.ok, r.name << " " << r.scheme << " " << r.shape << ": " << r.detail);
    });
    CHECK(cases >= 30);
  }
}

TEST_CASE("the split heuristic splits a long single sequence and keeps a full grid unsplit") {
  const DeviceInfo dev = device_info();
  DecodeParams p;
  p.batch = 1, p.q_heads = 32, p.kv_heads = 8, p.tokens = 32768, p.head_dim = 128, p.k_format = p.v_format = KvFormat::kInt8;
  const DecodeVariant& splitk = *find_decode_variants("^decode-splitk$").at(0);
  const DecodeParams one = splitk.plan(p, dev.sm_count);
  CHECK(one.heads_per_cta == 4);
  CHECK(one.splits > 8);
  CHECK(one.splits <= kMaxSplits);
  const DecodeVariant& tc = default_decode_variant(p);  // tensor cores where they run
  CHECK(tc.name == "decode-tc");
  CHECK(tc.plan(p, dev.sm_count).splits > 8);
  CHECK(tc.plan(p, dev.sm_count).heads_per_cta == 8);
  p.batch = 4096;
  CHECK(splitk.plan(p, dev.sm_count).splits == 1);
  CHECK(tc.plan(p, dev.sm_count).splits == 1);
  CHECK(incumbent_decode_variant().plan(p, dev.sm_count, 7).splits == 1);  // one pass ignores forcing
  CHECK(splitk.plan(p, dev.sm_count, 7).splits == 7);
  p.head_dim = 8;  // the bundled model's head_dim: the CUDA-core kernels
  CHECK(default_decode_variant(p).name == "decode-splitk");
}
