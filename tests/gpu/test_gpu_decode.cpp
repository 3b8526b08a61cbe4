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

TEST_CASE("16-bit K and V take 32-key steps where a split's CTAs fit on the SMs, and only there") {
  const DeviceInfo dev = device_info();
  const DecodeVariant& tc = *find_decode_variants("^decode-tc$").at(0);
  DecodeParams p;
  p.batch = 1, p.q_heads = 32, p.kv_heads = 8, p.tokens = 8192, p.head_dim = 128;
  p.k_format = p.v_format = KvFormat::kBf16;
  const DecodeParams one = tc.plan(p, dev.sm_count);
  CHECK(one.tc_config == TcConfig::kLongSteps);
  CHECK(one.splits > 1);
  p.batch = dev.sm_count / 8 + 1;  // a split's CTAs exceed the SMs
  CHECK(tc.plan(p, dev.sm_count).tc_config == TcConfig::kStandard);
  p.batch = 1, p.k_format = p.v_format = KvFormat::kFp16, p.head_dim = 64;
  CHECK(tc.plan(p, dev.sm_count).tc_config == TcConfig::kLongSteps);
  p.v_format = KvFormat::kBf16;  // mixed 16-bit formats: the 16-key kernel
  CHECK(tc.plan(p, dev.sm_count).tc_config == TcConfig::kStandard);
  p.v_format = KvFormat::kFp16;
  p.head_dim = 256;  // no room for 32-key steps of 16-bit rows
  CHECK(tc.plan(p, dev.sm_count).tc_config == TcConfig::kStandard);
  p.head_dim = 128, p.v_format = KvFormat::kInt8;  // a quantized operand: its own 32-key steps
  CHECK(tc.plan(p, dev.sm_count).tc_config == TcConfig::kStandard);
}

TEST_CASE("int4 K and V by the row run four CTAs an SM where the grid shares SMs over long splits") {
  const DeviceInfo dev = device_info();
  const DecodeVariant& tc = *find_decode_variants("^decode-tc$").at(0);
  DecodeParams p;
  p.q_heads = 32, p.kv_heads = 8, p.head_dim = 128;
  p.k_format = p.v_format = KvFormat::kInt4;
  for (KvOperand* op : {&p.k, &p.v}) op->mode = ParamMode::kHead, op->asymmetric = true;
  p.batch = 2 * dev.sm_count / 8, p.tokens = 8192;  // two CTAs an SM at one split
  const DecodeParams many = tc.plan(p, dev.sm_count);
  CHECK(many.tc_config == TcConfig::kFourCtas);
  CHECK(many.tokens >= 512 * many.splits);
  p.batch = 1, p.tokens = 1024;  // a few short splits: the latency chain the 128 registers lengthen
  CHECK(tc.plan(p, dev.sm_count).tc_config == TcConfig::kStandard);
  p.batch = 2 * dev.sm_count / 8, p.head_dim = 64;  // no four-CTA kernels at D = 64
  CHECK(tc.plan(p, dev.sm_count).tc_config == TcConfig::kStandard);
  p.head_dim = 128;  // forced splits: the rule on the count asked
  CHECK(tc.plan(p, dev.sm_count, 2).tc_config == TcConfig::kFourCtas);
  CHECK(tc.plan(p, dev.sm_count, 32).tc_config == TcConfig::kStandard);  // 256 keys a split
}
