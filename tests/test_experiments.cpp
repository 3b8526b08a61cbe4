// The sweep, its results files, and recommendations.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "data/synthetic.hpp"
#include "experiments/common/csv_table.hpp"
#include "experiments/sweep/recommend.hpp"
#include "experiments/sweep/results_writer.hpp"
#include "test_util.hpp"

using namespace kvq;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("kvq_exp_" + std::to_string(getpid()) + "_" + name)).string();
}

KvLayer small_layer() {
  SyntheticSpec spec;
  spec.batch = 2, spec.q_heads = 4, spec.kv_heads = 2, spec.tokens = 96, spec.head_dim = 64, spec.q_len = 2;
  return make_synthetic(spec);
}

}  // namespace

TEST_CASE("sweep rows carry reconstruction and attention metrics with sane bounds") {
  const KvLayer layer = small_layer();
  const std::vector<SchemePair> pairs =
      cross_pairs(parse_scheme_list("int8-head,int4-head,int4-g16-asym"), parse_scheme_list("int8-head"));
  const std::vector<SweepRow> rows = sweep_layer(layer, pairs);
  REQUIRE(rows.size() == 3);
  const SweepRow &int8 = rows[0], &int4 = rows[1], &int4_g16 = rows[2];
  CHECK(int8.has_attention);
  CHECK(int8.k_sqnr_db > 30);            // int8 per-head on unit-scale data
  CHECK(int8.k_sqnr_db > int4.k_sqnr_db + 20);  // 4 fewer bits: about 24 dB less
  CHECK(int4_g16.k_sqnr_db > int4.k_sqnr_db);   // smaller groups, asymmetric: better
  CHECK(int8.v_sqnr_db == int4.v_sqnr_db);      // same V scheme, quantized once
  CHECK(int8.output.rel_l2_mean < int4.output.rel_l2_mean);
  CHECK(int8.output.rel_l2_mean > 0);
  CHECK(int8.output.cosine_min > 0.99);
  CHECK(int8.heads.size() == 2 * 4);  // one per (b, query head)
  CHECK(int8.probabilities.topk_overlap_mean <= 1.0);
  CHECK(int8.k_bytes_per_token_head == 66.0);  // 64 codes + one fp16 scale
  CHECK(int8.k_group_elems == 64);
  CHECK(int4_g16.k_group_elems == 16);
  CHECK(int4_g16.kv_bits_per_element == doctest::Approx((4 + 2 * 16.0 / 16 + 8 + 16.0 / 64) / 2));
}

TEST_CASE("sweep with +had: Q is rotated with K, O rotated back for a rotated V, errors against the unrotated reference") {
  const KvLayer layer = small_layer();
  // A window over every token keeps the rotated input: only fp32 rotation rounding remains. Had Q
  // not been rotated (or O not rotated back) the error would be of order 1.
  const std::vector<SweepRow> kept = sweep_layer(layer, {{parse_scheme("int8-head+had+w96"), parse_scheme("int8-head+had+w96")}});
  CHECK(kept[0].output.rel_l2_max < 1e-5);
  CHECK(kept[0].k_sqnr_db > 120);  // fp32 rotation there and back
  const std::vector<SweepRow> rows = sweep_layer(
      layer, {{parse_scheme("int4-head-asym"), parse_scheme("int8-head")},
              {parse_scheme("int4-head-asym+had"), parse_scheme("int8-head")},
              {parse_scheme("int4-head-asym+had"), parse_scheme("int8-head+had")}});
  // The generator's outlier channels: rotation spreads them, so per-head int4 K loses less.
  CHECK(rows[1].k_sqnr_db > rows[0].k_sqnr_db + 3);
  CHECK(rows[1].output.rel_l2_mean < rows[0].output.rel_l2_mean);
  // A rotated int8 V: comparable error (rotation is orthogonal), not the error of a wrong basis.
  CHECK(rows[2].output.rel_l2_mean < 2 * rows[1].output.rel_l2_mean);
  CHECK(rows[2].v_sqnr_db == doctest::Approx(rows[1].v_sqnr_db).epsilon(0.1));
  CHECK(test::message_of<SchemeError>([&] {
          KvLayer odd = layer;
          odd.kv_shape.head_dim = 48;  // only the scheme check runs before the error
          sweep_layer(odd, {{parse_scheme("int8-head+had"), parse_scheme("int8-head")}});
        }) == "int8-head+had: the Hadamard rotation (+had) needs a power-of-two head_dim, got 48");
}

TEST_CASE("sweep with a window: W >= T is lossless, W = 0 equals the plain scheme, memory counts kept tokens") {
  const KvLayer layer = small_layer();  // T = 96
  const std::vector<SweepRow> rows = sweep_layer(
      layer, {{parse_scheme("int4-chan-t32-asym+w500"), parse_scheme("int4-token-asym+w500")},
              {parse_scheme("int4-chan-t32-asym+w0"), parse_scheme("int4-token-asym+w0")},
              {parse_scheme("int4-chan-t32-asym"), parse_scheme("int4-token-asym")},
              {parse_scheme("int4-chan-t32-asym+w40"), parse_scheme("int4-token-asym+w40")}});
  CHECK(rows[0].output.rel_l2_max == 0.0);
  CHECK(rows[0].kv_bits_per_element == 16.0);
  CHECK(rows[1].output.rel_l2_mean == rows[2].output.rel_l2_mean);
  CHECK(rows[1].kv_bits_per_element == rows[2].kv_bits_per_element);
  CHECK(rows[3].output.rel_l2_mean < rows[2].output.rel_l2_mean);  // recent tokens exact
  // K: W = 40 -> Lq = 56 -> 32 (whole groups): 32 tokens x 32 bytes + 64 x 128, one group of 64
  // channels x 4 bytes per head.
  CHECK(rows[3].k_bytes_per_token_head == doctest::Approx((32 * 32 + 64 * 128 + 64 * 4) / 96.0));
}

TEST_CASE("layers without queries get reconstruction metrics only") {
  KvLayer layer = small_layer();
  layer.q.clear();
  const std::vector<SweepRow> rows = sweep_layer(layer, default_pairs(64));
  REQUIRE(!rows.empty());
  for (const SweepRow& r : rows) {
    CHECK(!r.has_attention);
    // KIVI's 128-token window covers all 96 tokens: lossless, SQNR +inf.
    if (r.schemes.k.window >= layer.kv_shape.tokens) CHECK(r.k_sqnr_db == INFINITY);
    else CHECK(std::isfinite(r.k_sqnr_db));
  }
}

TEST_CASE("llama.cpp's rotation: K in the largest power-of-two block >= 64 dividing D, V in 64, none unless 64 | D") {
  CHECK(llamacpp_rotation_block(true, 128) == 128);
  CHECK(llamacpp_rotation_block(true, 192) == 64);
  CHECK(llamacpp_rotation_block(true, 256) == 256);
  CHECK(llamacpp_rotation_block(false, 256) == 64);
  CHECK(llamacpp_rotation_block(true, 96) == 0);
  CHECK(llamacpp_rotation_block(false, 32) == 0);
  CHECK(to_string(llamacpp_cache_scheme("q4_1", true, 192)) == "q4_1+had64");
  CHECK(to_string(llamacpp_cache_scheme("iq4_nl", false, 64)) == "iq4_nl+had");
  CHECK(to_string(llamacpp_cache_scheme("q5_0", true, 96)) == "q5_0");
  CHECK(test::message_of<SchemeError>([] { llamacpp_cache_scheme("nvfp4", true, 128); }).find("llama.cpp's quantized cache types") !=
        std::string::npos);
  CHECK_THROWS_AS(llamacpp_cache_scheme("int8-head", true, 128), SchemeError);
}

TEST_CASE("default scheme pairs follow the head_dim") {
  const std::vector<SchemePair> d128 = default_pairs(128), d8 = default_pairs(8);
  // {int8,int4} x {tensor,token,head,g64,g32,g16,g8} x {sym,asym} + per-channel K; 5 FP8; 2 rotated; 2 KIVI;
  // 8 block formats (llama.cpp's six, mxfp4, nvfp4) and the two q8_0 / q4_0 mixes; then llama.cpp's
  // six and the two mixes as today's llama.cpp rotates them (D % 64 == 0)
  CHECK(d128.size() == 2 * (7 * 2 + 1) + 5 + 2 + 2 + 8 + 2 + 8);
  CHECK(d8.size() == 2 * (3 * 2 + 1) + 5 + 1 + 2);  // no group smaller than D=8 divides it: head-only rotation
  CHECK(to_string(d128[2 * (7 * 2 + 1) - 1].k) == "int4-chan-t32-asym");
  CHECK(to_string(d128[2 * (7 * 2 + 1) - 1].v) == "int4-token-asym");
  CHECK(to_string(d128[d128.size() - 20].k) == "int4-chan-t32-asym+w128");
  CHECK(to_string(d128[d128.size() - 20].v) == "int4-g32-asym+w128");
  CHECK(to_string(d128[d128.size() - 18].k) == "q8_0");
  CHECK(to_string(d128[d128.size() - 11].v) == "nvfp4");
  CHECK(to_string(d128[d128.size() - 9].k) == "q4_0");
  CHECK(to_string(d128[d128.size() - 9].v) == "q8_0");
  // llama.cpp's rotation at D = 128: K as a whole row, V in two 64-blocks
  CHECK(to_string(d128[d128.size() - 8].k) == "q8_0+had");
  CHECK(to_string(d128[d128.size() - 8].v) == "q8_0+had64");
  CHECK(to_string(d128.back().k) == "q4_0+had");
  CHECK(to_string(d128.back().v) == "q8_0+had64");
  CHECK(to_string(default_pairs(64).back().v) == "q8_0+had");  // D = 64: V's block is the whole row
  CHECK(to_string(d8.back().v) == "int4-head-asym+w128");  // no block fits D = 8
  CHECK(default_pairs(96).size() == 2 * (6 * 2 + 1) + 5 + 0 + 2 + 8 + 2);  // g32, g16, g8 divide 96; no rotation
  CHECK(default_pairs(48).size() == 2 * (5 * 2 + 1) + 5 + 0 + 2 + 1);      // g16, g8; of the blocks only nvfp4
  for (int64_t d : {8, 48, 96, 128})
    for (const SchemePair& p : default_pairs(d)) {
      CHECK_NOTHROW(check_scheme_fits(p.k, static_cast<int>(d)));
      CHECK_NOTHROW(check_scheme_fits(p.v, static_cast<int>(d)));
    }
}

TEST_CASE("sweep CSV round-trips through the CSV reader with quoted sources") {
  KvLayer layer = small_layer();
  layer.source = "model \"x\", with commas";
  const std::vector<SweepRow> rows = sweep_layer(layer, cross_pairs(parse_scheme_list("int8-head"), parse_scheme_list("int8-token")));
  const std::string csv = temp_path("sweep.csv"), heads = temp_path("heads.csv");
  write_sweep_csv(rows, csv);
  write_head_csv(rows, heads);
  const CsvTable t = CsvTable::read(csv);
  REQUIRE(t.rows() == 1);
  CHECK(t.at(0, t.column("source")) == "model \"x\", with commas");
  CHECK(t.at(0, t.column("v_scheme")) == "int8-token");
  CHECK(t.at(0, t.column("k_granularity")) == "head");
  CHECK(t.number(0, t.column("out_rel_l2_mean")) == doctest::Approx(rows[0].output.rel_l2_mean).epsilon(1e-8));
  CHECK(CsvTable::read(heads).rows() == 8);
  CHECK(test::message_of<InputError>([&] { t.column("latency_us"); }) == csv + ": no column 'latency_us'");
  CHECK(test::message_of<InputError>([&] { t.number(0, t.column("k_scheme")); })
            .find("line 2: column 'k_scheme' is 'int8-head', expected a number") != std::string::npos);
  // the per-head file or the JSON handed to recommend: what it is not, and every column it lacks
  CHECK(test::message_of<InputError>([&] { read_pair_results(heads, "out_rel_l2_mean"); }) ==
        heads + ": not kvq sweep's results (sweep.csv): no columns k_bytes_per_token_head, v_bytes_per_token_head, "
                "out_rel_l2_mean");
  CHECK(test::message_of<InputError>([&] { read_end_to_end_results(csv, "kld_mean"); }) ==
        csv + ": not kvq eval's results (eval.csv): no columns kld_mean, kld_max, top1_agreement, ppl_delta");
  const std::string json = temp_path("sweep.json");
  std::ofstream(json) << "{\n  \"rows\": [1, 2]\n}\n";
  CHECK(test::message_of<InputError>([&] { CsvTable::read(json); }) ==
        json + ": JSON, expected a CSV file (a header line of column names)");
  std::filesystem::remove(json);
  std::filesystem::remove(csv);
  std::filesystem::remove(heads);
}

TEST_CASE("recommend picks the fewest bytes within budget per layer and overall") {
  const std::vector<PairResult> results = {
      {"m", 0, "int8-head", "int8-head", 260, 0.01}, {"m", 0, "int4-head", "int4-head", 132, 0.04},
      {"m", 0, "int4-g32", "int4-g32", 144, 0.02},   {"m", 1, "int8-head", "int8-head", 260, 0.02},
      {"m", 1, "int4-head", "int4-head", 132, 0.09}, {"m", 1, "int4-g32", "int4-g32", 144, 0.03},
  };
  const std::vector<Recommendation> recs = recommend(results, 0.05);
  REQUIRE(recs.size() == 3);
  CHECK(recs[0].best.k_scheme == "int4-head");  // layer 0: 0.04 within budget, fewest bytes
  CHECK(recs[1].best.k_scheme == "int4-g32");   // layer 1: int4-head is over budget
  CHECK(recs[2].layer == -1);
  CHECK(recs[2].best.k_scheme == "int4-g32");   // the cheapest pair within budget on every layer
  CHECK(recs[2].best.error == 0.03);            // its worst layer
  const std::vector<Recommendation> none = recommend(results, 0.001);
  for (const Recommendation& r : none) CHECK(!r.found);
}

TEST_CASE("recommend needs attention metrics") {
  KvLayer layer = small_layer();
  layer.q.clear();
  const std::string csv = temp_path("noq.csv");
  write_sweep_csv(sweep_layer(layer, cross_pairs(parse_scheme_list("int8-head"), parse_scheme_list("int8-head"))), csv);
  CHECK(test::message_of<InputError>([&] { read_pair_results(csv, "out_rel_l2_mean"); })
            .find("the dump had no decode queries Q") != std::string::npos);
  std::filesystem::remove(csv);
}
