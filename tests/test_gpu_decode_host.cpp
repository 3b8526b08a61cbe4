// Host side of the decode kernels (no device needed): operands, input checks, the tolerance rule.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "experiments/bench/bench_shapes.hpp"
#include "experiments/gate/validate_decode.hpp"
#include "gpu/decode_tc_traits.cuh"
#include "quant/block_formats.hpp"
#include "quant/groups.hpp"
#include "reference/attention.hpp"
#include "test_util.hpp"

using namespace kvq;

TEST_CASE("the decode kernels' divider agrees with division for every divisor they use") {
  // Divisors: head blocks, splits (<= kMaxSplits), KV heads; dividends up to the 2^31 the launch allows.
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 300; ++d) divisors.push_back(d);
  for (uint32_t d : {1000u, 4095u, 4096u, 65535u, 65536u, 1000003u, (1u << 30) + 1, (1u << 31) - 1}) divisors.push_back(d);
  std::vector<uint32_t> dividends = {0, 1, 2, 3, 7, 8, 127, 128, 129, 65535, 65536, (1u << 31) - 1, (1u << 31) - 2};
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 2000; ++i) {  // xorshift: dividends spread over [0, 2^31)
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    dividends.push_back(static_cast<uint32_t>(x % (uint64_t{1} << 31)));
  }
  int wrong = 0;
  for (uint32_t d : divisors) {
    const detail::FastDiv div(d);
    for (uint32_t n : dividends) wrong += div.div(n) != n / d;
    for (uint32_t k : {1u, 2u, 3u, 1000u})  // around multiples of d
      for (int64_t n : {int64_t{k} * d - 1, int64_t{k} * d, int64_t{k} * d + 1})
        if (n >= 0 && n < (int64_t{1} << 31)) wrong += div.div(static_cast<uint32_t>(n)) != static_cast<uint32_t>(n) / d;
  }
  CHECK(wrong == 0);
}

TEST_CASE("decode operands carry the layouts' strides and parameter modes") {
  const KvOperand planar = quantized_operand(parse_scheme("int4-g32-asym"), 2, 3, 10, 128, false, nullptr, nullptr, nullptr);
  CHECK(planar.mode == ParamMode::kGroup);
  CHECK(planar.group == 32);
  CHECK(planar.stride_t == 64);
  CHECK(planar.stride_h == 640);
  CHECK(planar.stride_b == 1920);
  const KvOperand rows = quantized_operand(parse_scheme("int4-g32-asym"), 2, 3, 10, 128, true, nullptr, nullptr, nullptr);
  CHECK(rows.mode == ParamMode::kInlineRow);
  CHECK(rows.inline_bytes == 16);
  CHECK(rows.stride_h == 80);
  CHECK(rows.stride_t == 240);
  const KvOperand free = quantized_operand(parse_scheme("fp8-e5m2"), 2, 3, 10, 128, false, nullptr, nullptr, nullptr);
  CHECK(free.mode == ParamMode::kNone);  // scale-free FP8: the codes are the values
  CHECK(free.stride_t == 128);
  CHECK(free.stride_b == 3 * 10 * 128);
  CHECK(quantized_format(parse_scheme("fp8-e5m2-g32"), false) == KvFormat::kFp8E5m2);
  CHECK(quantized_format(parse_scheme("int4-head-asym"), true) == KvFormat::kInt4Fbgemm);
  const KvOperand bsnh = raw_operand(nullptr, 3, 10, 64, true);
  CHECK(bsnh.stride_h == 128);
  CHECK(bsnh.stride_t == 384);
}

TEST_CASE("block-format operands carry the codec's values as the kernels read them") {
  auto op = [](const char* s, const float* tensor_scale = nullptr) {
    return quantized_operand(parse_scheme(s), 1, 1, 64, 128, false, nullptr, nullptr, nullptr, tensor_scale);
  };
  CHECK(quantized_format(parse_scheme("q8_0"), false) == KvFormat::kInt8);
  CHECK(quantized_format(parse_scheme("q4_1"), false) == KvFormat::kInt4);
  CHECK(quantized_format(parse_scheme("q5_0"), false) == KvFormat::kInt5);
  CHECK(quantized_format(parse_scheme("mxfp4"), false) == KvFormat::kLut4);
  const KvOperand q8 = op("q8_0"), q4 = op("q4_0"), q41 = op("q4_1"), q50 = op("q5_0");
  CHECK((q8.mode == ParamMode::kGroup && q8.group == 32 && q8.signed_codes() && !q8.has_zero()));
  CHECK((q4.code_offset == -8 && !q4.signed_codes() && q4.has_zero() && q4.stride_t == 64));
  CHECK((q41.asymmetric && q41.code_offset == 0 && q41.has_zero()));
  CHECK((q50.code_offset == -16 && q50.stride_t == 80));  // nibbles, then the fifth bits
  CHECK((op("iq4_nl").lut == LutTable::kIq4Nl && op("mxfp4").lut == LutTable::kE2m1Doubled && op("q4_1").lut == LutTable::kNone));
  CHECK((op("iq4_nl").param_bytes() == 2 && op("mxfp4").param_bytes() == 1));
  // the kernels' table words are the codec's entries: byte i % 4 of word i / 4 is entry i, as int8
  for (LutTable t : {LutTable::kIq4Nl, LutTable::kE2m1Doubled})
    for (int i = 0; i < 16; ++i) {
      const int8_t entry = static_cast<int8_t>(lut_word(t, i / 4) >> (8 * (i % 4)) & 0xff);
      CHECK(entry == (t == LutTable::kIq4Nl ? iq4nl_value(i) : e2m1_doubled(i)));
    }
  CHECK(lut_word(LutTable::kE2m1Doubled, 1) == 0x0c080604u);  // 4, 6, 8, 12
  const float s_t = 0.25f;
  const KvOperand nv = op("nvfp4", &s_t);
  CHECK((nv.group == 16 && nv.tensor_scale == &s_t && nv.scale_dtype == ScaleDtype::kE4M3));
  CHECK(decode_unsupported_reason(parse_scheme("q4_0"), 128, true) ==
        "q4_0: block formats are stored planar (or as ggml's blocks), not as FBGEMM rows");

  DecodeParams p;
  p.batch = 1, p.q_heads = 8, p.kv_heads = 1, p.tokens = 64, p.head_dim = 128;
  p.k_format = KvFormat::kLut4, p.v_format = KvFormat::kInt8;
  p.k = op("nvfp4"), p.v = op("q8_0");
  CHECK(tensor_core_unsupported_reason(p) == "K nvfp4: its per-tensor scale (an fp32 on the device) is missing");
  p.k = nv;
  CHECK(tensor_core_unsupported_reason(p).empty());
  p.k = op("q8_0"), p.v = nv, p.k_format = KvFormat::kInt8, p.v_format = KvFormat::kLut4;
  CHECK(tensor_core_unsupported_reason(p).empty());  // nvfp4 V: its block scales multiply the fragments
  p.v = op("int4-g16"), p.v_format = KvFormat::kInt4;  // other groups of 16 still split an m-tile pair
  CHECK(tensor_core_unsupported_reason(p) ==
        "V scale groups of 16 elements: tensor-core kernels need a multiple of 32 (whole m-tile pairs)");
  p.k = p.v = q4, p.k_format = p.v_format = KvFormat::kInt4;  // q4_0: the offset is decode-tc's
  CHECK(cuda_core_unsupported_reason(p) ==
        "q4_0, q5_0, q5_1, iq4_nl, mxfp4, nvfp4: CUDA-core kernels read no block format but q8_0 and q4_1 (decode-tc reads them all)");
  p.k = p.v = q41;
  CHECK(cuda_core_unsupported_reason(p).empty());
}

TEST_CASE("schemes the decode kernels cannot read are refused with the reason") {
  CHECK(decode_unsupported_reason(parse_scheme("int8-head"), 128, false).empty());
  CHECK(decode_unsupported_reason(parse_scheme("int4-chan-t32-asym"), 128, false).empty());  // decode-tc reads K
  CHECK(decode_unsupported_reason(parse_scheme("int4-g2-asym"), 128, false) ==
        "int4-g2-asym: groups of 2 elements (decode kernels need a multiple of 8)");
  CHECK(decode_unsupported_reason(parse_scheme("int8-head"), 96, false) ==
        "head_dim 96 (decode kernels take 8, 64, 128 or 256)");
  const KvOperand chan = quantized_operand(parse_scheme("int8-chan-t32"), 1, 1, 1, 128, false, nullptr, nullptr, nullptr);
  CHECK(chan.mode == ParamMode::kChannel);
  CHECK(chan.group == 32);  // tokens per group
}

TEST_CASE("the decode benchmark reads rotated and windowed storages and the kernels say which they cannot") {
  CHECK(bench_storage(parse_scheme("int4-g32-asym+had"), parse_scheme("int4-g32-asym"), false).name ==
        "int4-g32-asym+had/int4-g32-asym");
  CHECK(parse_bench_storages("int4-g32-asym+w128").at(0).name == "int4-g32-asym+w128");
  DecodeParams p;
  p.batch = 1, p.q_heads = 8, p.kv_heads = 1, p.tokens = 64, p.head_dim = 128;
  p.k_format = p.v_format = KvFormat::kInt4;
  auto op = [](const char* s) { return quantized_operand(parse_scheme(s), 1, 1, 64, 128, false, nullptr, nullptr, nullptr); };
  p.k = op("int4-g32-asym+had"), p.v = op("int4-g32-asym");
  CHECK(p.k.hadamard);
  CHECK(tensor_core_unsupported_reason(p).empty());  // Q rotated in the kernel
  CHECK(cuda_core_unsupported_reason(p) == "+had: CUDA-core kernels rotate neither Q nor O (decode-tc does)");
  p.k = op("int4-g32-asym"), p.v = op("int4-g32-asym+had");
  CHECK(tensor_core_unsupported_reason(p).empty());  // O rotated back in the kernel
  CHECK(cuda_core_unsupported_reason(p) == "+had: CUDA-core kernels rotate neither Q nor O (decode-tc does)");
  p.v = op("int4-g32-asym+had+w16");
  p.v_window = scheme_window(parse_scheme("int4-g32-asym+had+w16"), KvOperand{}, KvFormat::kBf16);
  CHECK(tensor_core_unsupported_reason(p) == "V +had with a +wW window: tensor-core kernels do not read a rotated window");
  p.v = op("int4-g32-asym"), p.v_window = KvWindow{};
  p.k = op("int4-g32-asym+had+w16"), p.v = op("int4-g32-asym");
  p.k_window = scheme_window(parse_scheme("int4-g32-asym+had+w16"), KvOperand{}, KvFormat::kBf16);
  CHECK(tensor_core_unsupported_reason(p) == "K +had with a +wW window: tensor-core kernels do not read a rotated window");
  CHECK(parse_bench_storages("int4-g32-asym").size() == 1);
  CHECK(parse_bench_storages("q8_0/q4_0").at(0).v_format == KvFormat::kInt4);
  CHECK_THROWS_WITH_AS(parse_bench_storages("q4_0:fbgemm"),
                       "q4_0:fbgemm: FBGEMM rows hold kvq's int4 K and V (block formats are planar)", InputError);
}

TEST_CASE("window starts and key regions follow quantized_length, per operand") {
  const KvOperand none{};
  const KvWindow k = scheme_window(parse_scheme("int4-chan-t32-asym+w128"), none, KvFormat::kBf16);
  const KvWindow v = scheme_window(parse_scheme("int4-g32-asym+w128"), none, KvFormat::kBf16);
  CHECK((k.tokens == 128 && k.round_to == 32 && v.round_to == 1));
  CHECK(!scheme_window(parse_scheme("int4-g32-asym"), none, KvFormat::kBf16).present());
  for (int64_t len : {0, 1, 100, 128, 129, 1000, 4097}) {  // the CPU quantizer's boundary, operand by operand
    CHECK(window_start(k, len) == quantized_length(parse_scheme("int4-chan-t32-asym+w128"), len, 5000));
    CHECK(window_start(v, len) == quantized_length(parse_scheme("int4-g32-asym+w128"), len, 5000));
  }
  // len 1000: K quantized below 864, V below 872: the regions tile [0, 1000) without overlap.
  int64_t covered = 0, lo = 0, hi = 0;
  for (KeyRegion r : {KeyRegion::kBothQuantized, KeyRegion::kKRaw, KeyRegion::kVRaw, KeyRegion::kBothRaw}) {
    key_region_bounds(r, k, v, 1000, lo, hi);
    covered += std::max<int64_t>(hi - lo, 0);
    if (r == KeyRegion::kKRaw) CHECK((lo == 864 && hi == 872));
    if (r == KeyRegion::kVRaw) CHECK(lo >= hi);
  }
  CHECK(covered == 1000);
  DecodeParams p;
  p.batch = 2, p.q_heads = 8, p.kv_heads = 1, p.tokens = 1000, p.head_dim = 128, p.splits = 10;
  CHECK(decode_regions(p).size() == 1);
  CHECK(total_splits(p) == 10);
  p.k_window = k, p.v_window = v;
  CHECK(decode_regions(p).size() == 3);  // every sequence 1000 long: V is never raw while K is quantized
  {
    DecodeParams short_seq = p;  // 100 tokens, both windows cover them: one launch, O written directly
    short_seq.tokens = 100, short_seq.splits = 1;
    const std::vector<DecodeParams> one = decode_regions(short_seq);
    REQUIRE(one.size() == 1);
    CHECK((one[0].region == KeyRegion::kBothRaw && one[0].region_count == 1 && total_splits(short_seq) == 1));
    CHECK(partial_o_floats(short_seq) == 0);
  }
  const int32_t lens[2] = {1000, 1000};  // lengths on the device: every region is launched
  p.seq_lens = lens;
  const std::vector<DecodeParams> regions = decode_regions(p);
  REQUIRE(regions.size() == 4);
  CHECK(regions[0].splits == 9);  // 864 of 1000 keys
  int base = 0;
  for (const DecodeParams& r : regions) {
    CHECK(r.split_base == base);
    base += r.splits;
  }
  CHECK(total_splits(p) == base);
  CHECK(partial_lse_floats(p) == base * 2 * 8);
  // The same window on K and V (+w128 on both): K and V turn raw at the same key in every sequence,
  // so only the both-quantized and both-raw regions are launched, lengths on the device or not.
  DecodeParams same = p;
  same.v_window = scheme_window(parse_scheme("int4-g32-asym+w128"), none, KvFormat::kBf16);
  same.k_window = same.v_window;
  for (const int32_t* device_lens : {static_cast<const int32_t*>(nullptr), lens}) {
    same.seq_lens = device_lens;
    const std::vector<DecodeParams> two = decode_regions(same);
    REQUIRE(two.size() == 2);
    CHECK((two[0].region == KeyRegion::kBothQuantized && two[1].region == KeyRegion::kBothRaw));
    CHECK((two[0].splits == 9 && two[1].splits == 1 && two[1].split_base == 9 && two[1].region_count == 2));
  }
  // Tensor cores, K and V quantized: the window is read at the end of the last split (where planned so),
  // in one launch with every split; the cases it does not fit keep a launch per region.
  DecodeParams tail = same;
  tail.family = DecodeFamily::kTensorCore, tail.k_format = tail.v_format = KvFormat::kInt4;
  REQUIRE(window_tail_fits(tail));
  CHECK(decode_regions(tail).size() == 2);  // not planned as a tail
  tail.window_tail = true;
  for (const int32_t* device_lens : {static_cast<const int32_t*>(nullptr), lens}) {
    tail.seq_lens = device_lens;
    const std::vector<DecodeParams> one = decode_regions(tail);
    REQUIRE(one.size() == 1);
    CHECK((one[0].window_tail && one[0].region == KeyRegion::kBothQuantized && one[0].region_count == 1 &&
           one[0].splits == 10 && total_splits(tail) == 10));
  }
  auto regions_of = [&](DecodeParams q) { return decode_regions(q).size(); };
  DecodeParams other = tail;
  other.v_window.format = KvFormat::kFp16;  // K's window bf16, V's fp16 (fp16 windows: a launch per region)
  CHECK((!window_tail_fits(other) && regions_of(other) == 2));
  other.k_window.format = KvFormat::kFp16;
  CHECK(!window_tail_fits(other));
  other = tail, other.v_format = KvFormat::kBf16, other.v_window = KvWindow{};  // raw V beside K's window
  CHECK((!window_tail_fits(other) && regions_of(other) == 2));
  other = tail, other.k_window = k;  // K's window rounded to token groups of 32, V's not
  CHECK((!window_tail_fits(other) && regions_of(other) == 4));
  other = tail, other.family = DecodeFamily::kCudaCore;
  CHECK(!window_tail_fits(other));
  const int32_t table[1] = {0};
  other = tail, other.block_table = table;  // paged windows: pages of their own, a launch per region
  CHECK(!window_tail_fits(other));
}

TEST_CASE("paged windows: each region reads each operand through its own pages' table") {
  const int32_t table[2] = {0, 1}, window_table[2] = {5, 6};
  int32_t raw = 0;  // a window's raw values (never read here)
  DecodeParams p;
  p.batch = 1, p.q_heads = 8, p.kv_heads = 1, p.tokens = 64, p.head_dim = 128, p.splits = 4;
  p.k_format = KvFormat::kInt4, p.v_format = KvFormat::kInt8;
  p.k = quantized_operand(parse_scheme("int4-g32-asym+w40"), 1, 1, 32, 128, false, nullptr, nullptr, nullptr);
  p.v = quantized_operand(parse_scheme("int8-head+w20"), 1, 1, 32, 128, false, nullptr, nullptr, nullptr);
  p.k = paged_operand(p.k, 1, 32, 128, 64), p.v = paged_operand(p.v, 1, 32, 128, 128);
  const KvOperand window = paged_operand(raw_operand(&raw, 1, 32, 128, true), 1, 32, 128, 256);
  p.k_window = scheme_window(parse_scheme("int4-g32-asym+w40"), window, KvFormat::kBf16);
  p.v_window = scheme_window(parse_scheme("int8-head+w20"), window, KvFormat::kBf16);
  p.block_table = table, p.table_stride = 2, p.page_tokens = 32;
  CHECK(paged_unsupported_reason(p).find("window_block_table") != std::string::npos);
  p.window_block_table = window_table;
  CHECK(paged_unsupported_reason(p) == "");
  DecodeParams huge = p;  // the kernels index table entries in 32 bits
  huge.batch = 1 << 16, huge.table_stride = 1 << 15;
  CHECK(paged_unsupported_reason(huge).find("2^31 entries") != std::string::npos);
  huge.table_stride = (1 << 15) - 1;
  CHECK(paged_unsupported_reason(huge) == "");
  const int32_t lens[1] = {64};
  p.seq_lens = lens;
  for (const DecodeParams& r : decode_regions(p)) {
    CAPTURE(static_cast<int>(r.region));
    const bool k_raw = r.region == KeyRegion::kKRaw || r.region == KeyRegion::kBothRaw;
    const bool v_raw = r.region == KeyRegion::kVRaw || r.region == KeyRegion::kBothRaw;
    CHECK(r.block_table == (k_raw ? window_table : table));
    const int32_t* v_table = r.v_block_table ? r.v_block_table : r.block_table;  // nullptr: K's
    CHECK(v_table == (v_raw ? window_table : table));
    CHECK((r.v_block_table == nullptr) == (k_raw == v_raw));
  }
  DecodeParams bf16_k = p;  // a raw K from the cache's pages beside V's window pages: two raw tables
  bf16_k.k_window = KvWindow{}, bf16_k.k_format = KvFormat::kBf16, bf16_k.k = window;
  CHECK(paged_unsupported_reason(bf16_k).find("beside a +wW window") != std::string::npos);

  // chan-tN K: pages hold whole token groups, their parameters [pages, H, P / N, D]
  DecodeParams chan = p;
  chan.k_window = chan.v_window = KvWindow{};
  chan.k = quantized_operand(parse_scheme("int4-chan-t32-asym"), 1, 2, 64, 128, false, nullptr, nullptr, nullptr);
  chan.k = paged_operand(chan.k, 2, 64, 128, 64);
  CHECK((chan.k.param_stride_h == 2 * 128 && chan.k.param_stride_page == 2 * 2 * 128));
  chan.page_tokens = 64;
  CHECK(paged_unsupported_reason(chan) == "");
  chan.page_tokens = 16;
  chan.k = paged_operand(quantized_operand(parse_scheme("int4-chan-t32-asym"), 1, 2, 16, 128, false, nullptr, nullptr,
                                           nullptr),
                         2, 16, 128, 64);
  CHECK(paged_unsupported_reason(chan).find("a token group must lie in one page") != std::string::npos);
}

TEST_CASE("the decode benchmark reads K/V pairs, raw operands and FP8") {
  const std::vector<BenchStorage> st =
      parse_bench_storages("int4-g32-asym/int8-head,bf16/int4-head-asym,fp8-e4m3-head,fp16,int4-g32-asym:fbgemm");
  REQUIRE(st.size() == 5);
  CHECK(st[0].name == "int4-g32-asym/int8-head");
  CHECK((st[0].k_format == KvFormat::kInt4 && st[0].v_format == KvFormat::kInt8));
  CHECK((!st[1].k && st[1].k_format == KvFormat::kBf16 && st[1].v_format == KvFormat::kInt4));
  CHECK((st[2].k_format == KvFormat::kFp8E4m3 && st[2].v_format == KvFormat::kFp8E4m3 && st[2].name == "fp8-e4m3-head"));
  CHECK((!st[3].k && !st[3].v && st[3].k_format == KvFormat::kFp16));
  CHECK((st[4].k_format == KvFormat::kInt4Fbgemm && st[4].v_format == KvFormat::kInt4Fbgemm));
  CHECK(test::message_of<InputError>([] { parse_bench_storages("int8-head/int4-head-asym:fbgemm"); }) ==
        "int8-head/int4-head-asym:fbgemm: FBGEMM rows hold kvq's int4 K and V (block formats are planar)");
  CHECK_THROWS_AS(parse_bench_storages("int4-head/nonsense"), SchemeError);
}

TEST_CASE("kvq bench's --shapes is a regular expression over shape labels") {
  CHECK(bench_shapes("seed000").size() == 5);
  const std::vector<DecodeShape> one = bench_shapes("seed000/B128/");
  REQUIRE(one.size() == 1);
  CHECK((one[0].batch == 128 && one[0].tokens == 8192 && one[0].label() == "seed000/B128/T8192"));
  CHECK(bench_shapes("llama8b/B1/T1024$").size() == 1);
  CHECK(bench_shapes("/T32768").size() == 2);  // llama8b B = 1 and 8
  CHECK_THROWS_AS(bench_shapes("seed000/B3/"), InputError);
  CHECK_THROWS_AS(bench_shapes("(seed"), InputError);
}

TEST_CASE("the CUDA-core family reads K and V in one integer or raw format") {
  DecodeParams p;
  p.batch = 1, p.q_heads = 8, p.kv_heads = 1, p.tokens = 64, p.head_dim = 128;
  p.k_format = KvFormat::kInt8, p.v_format = KvFormat::kInt8;
  CHECK(cuda_core_unsupported_reason(p).empty());
  p.v_format = KvFormat::kInt4;
  CHECK(cuda_core_unsupported_reason(p) ==
        "K int8 / V int4: CUDA-core kernels read K and V in one format (decode-tc reads mixed pairs)");
  p.k_format = p.v_format = KvFormat::kFp8E5m2;
  CHECK(cuda_core_unsupported_reason(p) == "fp8-e5m2: CUDA-core kernels read no FP8 (decode-tc does)");
  p.head_dim = 96;
  CHECK(cuda_core_unsupported_reason(p) == "head_dim 96");
}

TEST_CASE("the tensor-core family names what it cannot read and its precision profile") {
  DecodeParams p;
  p.batch = 1, p.q_heads = 8, p.kv_heads = 1, p.tokens = 64, p.head_dim = 128;
  p.k_format = p.v_format = KvFormat::kInt4;
  p.k = quantized_operand(parse_scheme("int4-g16-asym"), 1, 1, 64, 128, false, nullptr, nullptr, nullptr);
  p.v = quantized_operand(parse_scheme("int4-g32"), 1, 1, 64, 128, false, nullptr, nullptr, nullptr);
  CHECK(tensor_core_unsupported_reason(p).empty());
  p.v = quantized_operand(parse_scheme("int4-g16"), 1, 1, 64, 128, false, nullptr, nullptr, nullptr);
  CHECK(tensor_core_unsupported_reason(p) ==
        "V scale groups of 16 elements: tensor-core kernels need a multiple of 32 (whole m-tile pairs)");
  p.k = quantized_operand(parse_scheme("int4-g8"), 1, 1, 64, 128, false, nullptr, nullptr, nullptr);
  CHECK(tensor_core_unsupported_reason(p) ==
        "K scale groups of 8 elements: tensor-core kernels need a multiple of 16 (whole k-slices)");
  p.k = p.v = quantized_operand(parse_scheme("int8-head"), 1, 1, 64, 128, false, nullptr, nullptr, nullptr);
  p.k_format = p.v_format = KvFormat::kInt8;
  auto op = [](const char* s) { return quantized_operand(parse_scheme(s), 1, 1, 64, 128, false, nullptr, nullptr, nullptr); };
  p.k = op("int4-chan-t32-asym"), p.k_format = KvFormat::kInt4;
  CHECK(tensor_core_unsupported_reason(p).empty());
  p.family = DecodeFamily::kTensorCore;
  CHECK(std::string(decode_precision_profile(p)) == "fp32-qfp16-kfp16-pfp16-obf16");
  p.family = DecodeFamily::kCudaCore;
  DecodeParams same = p;
  same.v_format = KvFormat::kInt4;
  CHECK(cuda_core_unsupported_reason(same) ==
        "chan-tN: per-channel groups change along the keys; CUDA-core kernels do not read them (decode-tc reads K)");
  p.k = op("int4-chan-t16-asym");
  CHECK(tensor_core_unsupported_reason(p) ==
        "K chan-t16: tensor-core kernels need token groups of a multiple of 32 (whole key steps)");
  p.k = op("int4-chan-t32-asym-fp32");
  CHECK(tensor_core_unsupported_reason(p) == "K chan-tN with fp32 parameters: tensor-core kernels dequantize K with fp16 ones");
  p.k = op("int4-chan-t32"), p.v_format = KvFormat::kFp8E5m2;
  CHECK(tensor_core_unsupported_reason(p) ==
        "K chan-tN with V fp8-e5m2: tensor-core kernels read it with int8, int4 planar or raw V");
  p.v_format = KvFormat::kBf16;
  CHECK(tensor_core_unsupported_reason(p).empty());
  p.k = p.v = op("int8-chan-t32");
  p.k_format = p.v_format = KvFormat::kInt8;  // V chan-tN
  CHECK(tensor_core_unsupported_reason(p) == "V chan-tN: tensor-core kernels read per-channel groups for K only");
  p.k = p.v = op("int8-head");
  p.k.data = reinterpret_cast<const uint8_t*>(uintptr_t{2});
  CHECK(tensor_core_unsupported_reason(p) ==
        "K rows or parameters are not 4-byte aligned (tensor-core kernels copy words)");
  p.head_dim = 8;
  CHECK(tensor_core_unsupported_reason(p) ==
        "head_dim 8: tensor-core kernels take 64, 128 or 256 (the CUDA-core variants take 8)");
  p.family = DecodeFamily::kTensorCore;
  CHECK(std::string(decode_precision_profile(p)) == "fp32-qfp16-pfp16-obf16");
  p.v_format = KvFormat::kBf16;  // fp16 QK, bf16 PV
  CHECK(std::string(decode_precision_profile(p)) == "fp32-qfp16-pbf16-obf16");
  p.k_format = KvFormat::kBf16;
  CHECK(std::string(decode_precision_profile(p)) == "fp32-pbf16-obf16");
  p.v_format = KvFormat::kFp8E4m3;  // bf16 QK (Q exact), fp16 PV
  CHECK(std::string(decode_precision_profile(p)) == "fp32-pfp16-obf16");
  p.k_format = KvFormat::kBf16, p.v_format = KvFormat::kBf16;
  p.family = DecodeFamily::kCudaCore;
  CHECK(std::string(decode_precision_profile(p)) == "fp32-obf16");
  for (const DecodeVariant& v : decode_variants())  // every profile parses
    CHECK_NOTHROW(PrecisionProfile::parse(decode_precision_profile(v.plan(p, 132, 1))));
}

TEST_CASE("tensor-core split counts fill whole waves with splits of at least 128 keys") {
  CHECK(tensor_core_splits(32, 396, 8192, 132) == 11);   // 352 CTAs: one wave 89% full
  CHECK(tensor_core_splits(512, 396, 8192, 132) == 2);   // 2.6 of 3 waves (86%) beat 1.3 of 2 (65%)
  CHECK(tensor_core_splits(396, 396, 8192, 132) == 1);
  CHECK(tensor_core_splits(8, 396, 1024, 132) == 8);     // 128 keys per split: at most 8 splits
  CHECK(tensor_core_splits(8, 396, 100, 132) == 1);
  CHECK(tensor_core_splits(0, 396, 8192, 132) == 1);
  // Tiny grids: one CTA per SM while the splits stay <= 1024 keys, else the resident slots
  CHECK(tensor_core_splits(8, 396, 8192, 132) == 16);    // B=1, Hkv=8: 128 CTAs of 512 keys (fill rule: 43)
  CHECK(tensor_core_splits(8, 264, 8192, 132) == 16);
  CHECK(tensor_core_splits(8, 396, 32768, 132) == 43);   // 2048 keys per split: the fill rule
  CHECK(tensor_core_splits(3, 396, 8192, 132) == 44);    // SmolLM2 B=1 (Hkv=3): 132 CTAs of 187 keys
  CHECK(tensor_core_splits(64, 396, 1024, 132) == 6);    // B=8, Hkv=8: not tiny, the fill rule
}

TEST_CASE("tensor-core split counts leave no split empty where the kernel rounds a split's keys") {
  CHECK(nonempty_splits(8192, 44, 128) == 32);  // 187 keys a split rounded to 256: 12 splits would be empty
  CHECK(nonempty_splits(8192, 44, 64) == 43);
  CHECK(nonempty_splits(8192, 15, 128) == 13);
  CHECK(nonempty_splits(8192, 16, 128) == 16);
  CHECK(nonempty_splits(1000, 8, 128) == 8);    // 7 splits of 128 and one of 104
  CHECK(nonempty_splits(100, 2, 128) == 1);
  CHECK(nonempty_splits(0, 4, 128) == 1);
  CHECK(nonempty_splits(8192, 5, 1) == 5);
  // Whatever was asked, the count the kernel then gets covers every key and leaves no split empty:
  // its splits of ceil(T / n) keys rounded up to `round`.
  int bad = 0;
  for (int64_t round : {1, 64, 128})
    for (int64_t tokens = 1; tokens <= 4096; ++tokens)
      for (int64_t asked = 1; asked <= 64; ++asked) {
        const int64_t n = nonempty_splits(tokens, asked, round);
        const int64_t per_split = ((tokens + n - 1) / n + round - 1) / round * round;
        bad += n < 1 || n > asked || n * per_split < tokens || (n - 1) * per_split >= tokens;
      }
  CHECK(bad == 0);
  // Waves are counted with the splits that hold keys: SmolLM2 B=8 (24 CTAs a split, 396 resident)
  CHECK(tensor_core_splits(24, 396, 8192, 132) == 15);       // no rounding: 360 CTAs, 91% of a wave
  CHECK(tensor_core_splits(24, 396, 8192, 132, 128) == 16);  // 15 hold 13 (79%); 16 hold 16 (97%)
  // The tiny-grid rule's one CTA per SM, as held: SmolLM2 B=1 (Hkv=3)
  CHECK(tensor_core_splits(3, 396, 8192, 132, 128) == 32);
  CHECK(tensor_core_splits(3, 396, 8192, 132, 64) == 43);
  CHECK(tensor_core_splits(8, 396, 1024, 132, 128) == 8);
}

TEST_CASE("tensor-core split counts with raw operands: one wave of one CTA an SM where a split fits, one split for raw K and V where it does not") {
  CHECK(tensor_core_splits(24, 396, 1024, 132, 64, 2) == 4);   // SmolLM2 B=8 T=1K: 5 asked hold 4
  CHECK(tensor_core_splits(24, 396, 8192, 132, 64, 1) == 5);   // T=8K (the resident slots: 15)
  CHECK(tensor_core_splits(64, 264, 1024, 132, 64, 2) == 2);   // llama8b B=8 T=1K
  CHECK(tensor_core_splits(8, 264, 1024, 132, 64, 1) == 8);    // 128 keys a split at most 8
  CHECK(tensor_core_splits(192, 396, 1024, 132, 64, 2) == 1);  // SmolLM2 B=64: more CTAs than SMs (the fill rule: 2)
  CHECK(tensor_core_splits(192, 396, 1024, 132, 64) == 2);
  CHECK(tensor_core_splits(192, 396, 1024, 132, 64, 1) == 2);  // one raw operand: the fill rule
  CHECK(tensor_core_splits(512, 264, 32768, 132, 64, 2) == 1);
  CHECK(tensor_core_splits(24, 396, 8192, 132, 64) == 15);
}

TEST_CASE("the tensor-core kernels' other configurations: long steps for 16-bit K and V, four CTAs for int4 by the row") {
  using C = std::vector<TcConfig>;
  const C standard = {TcConfig::kStandard}, long_steps = {TcConfig::kStandard, TcConfig::kLongSteps},
          four = {TcConfig::kStandard, TcConfig::kFourCtas};
  DecodeParams p;
  p.family = DecodeFamily::kTensorCore, p.head_dim = 128;
  p.k_format = p.v_format = KvFormat::kBf16;
  CHECK(tc_configs(p) == long_steps);
  p.k_format = p.v_format = KvFormat::kFp16, p.head_dim = 64;
  CHECK(tc_configs(p) == long_steps);
  p.head_dim = 256;  // no room for 32-key steps of 16-bit rows
  CHECK(tc_configs(p) == standard);
  p.head_dim = 128, p.v_format = KvFormat::kBf16;  // mixed 16-bit formats
  CHECK(tc_configs(p) == standard);
  p.k_format = p.v_format = KvFormat::kInt8;  // quantized: 32-key steps already
  CHECK(tc_configs(p) == standard);

  p.k_format = p.v_format = KvFormat::kInt4;  // one scale group per row (fp16 parameters)
  for (KvOperand* op : {&p.k, &p.v}) op->mode = ParamMode::kHead, op->asymmetric = true;
  CHECK(tc_configs(p) == four);
  const KvOperand planar = p.v;
  for (KvOperand* op : {&p.k, &p.v}) op->mode = ParamMode::kInlineRow, op->group = 128, op->inline_bytes = 4;
  p.k_format = p.v_format = KvFormat::kInt4Fbgemm;  // FBGEMM's rows: the same kernel
  CHECK(tc_configs(p) == four);
  p.k = p.v = planar, p.k_format = p.v_format = KvFormat::kInt4;
  p.k.scale_dtype = ScaleDtype::kFp32;  // fp32 parameters: the general kernel
  CHECK(tc_configs(p) == standard);
  p.k.scale_dtype = ScaleDtype::kFp16;
  p.head_dim = 64;  // at D = 64 three CTAs measured faster (H200, SmolLM2)
  CHECK(tc_configs(p) == standard);
  p.head_dim = 128;
  for (KvOperand* op : {&p.k, &p.v}) op->mode = ParamMode::kGroup, op->group = 32;  // g32 spills at 128 registers
  CHECK(tc_configs(p) == standard);
  p.k_format = p.v_format = KvFormat::kBf16, p.family = DecodeFamily::kCudaCore;
  CHECK(tc_configs(p) == standard);
}

TEST_CASE("decode parameters are checked before a launch") {
  DecodeParams p;
  p.batch = 1, p.q_heads = 6, p.kv_heads = 4, p.tokens = 8, p.head_dim = 128, p.splits = 1, p.heads_per_cta = 1;
  CHECK(test::message_of<InputError>([&] { check_decode_params(p); }) == "decode: Hq=6 is not a multiple of Hkv=4");
  p.q_heads = 8, p.head_dim = 96;
  CHECK(test::message_of<InputError>([&] { check_decode_params(p); }) ==
        "decode: head_dim 96 (expected 8, 64, 128 or 256)");
  p.head_dim = 8, p.heads_per_cta = 2;
  CHECK(test::message_of<InputError>([&] { check_decode_params(p); }) ==
        "decode: heads_per_cta 2 exceeds the 1 lanes of a head_dim 8 row");
  p.head_dim = 128, p.heads_per_cta = 1, p.splits = 0;
  CHECK(test::message_of<InputError>([&] { check_decode_params(p); }) == "decode: 0 splits (expected 1..128)");
  p.splits = 1;
  CHECK(test::message_of<InputError>([&] { check_decode_params(p); }) == "decode: Q, K, V, O and LSE buffers are required");
}

TEST_CASE("the tolerance rule passes mimic-sized errors and fails larger ones") {
  const std::vector<double> ref = {0.5, -0.25, 1.0, 0.125}, ref_lse = {2.0};
  std::vector<double> mimic = ref;
  mimic[0] += 1e-3;  // the kernel's precision costs 1e-3 at most
  const std::vector<double> mimic_lse = {2.0 + 1e-7};
  std::vector<float> out(ref.begin(), ref.end());
  out[0] += 1.5e-3f;
  CHECK(check_tolerance(out, {2.0f}, ref, ref_lse, mimic, mimic_lse).ok);
  out[2] += 0.05f;  // far beyond 2x the mimic's error plus bf16 noise at 1.0
  const ToleranceCheck bad = check_tolerance(out, {2.0f}, ref, ref_lse, mimic, mimic_lse);
  CHECK_FALSE(bad.ok);
  CHECK(bad.max_err == doctest::Approx(0.05).epsilon(1e-3));
  out[2] = NAN;
  CHECK(check_tolerance(out, {2.0f}, ref, ref_lse, mimic, mimic_lse).detail.find("O[2] = nan") != std::string::npos);
}

TEST_CASE("an empty key set must give O = 0 and LSE = -inf exactly") {
  const std::vector<double> zeros(4, 0.0), lse = {-INFINITY};
  CHECK(check_tolerance(std::vector<float>(4, 0.0f), {-INFINITY}, zeros, lse, zeros, lse).ok);
  CHECK_FALSE(check_tolerance(std::vector<float>(4, 0.0f), {0.0f}, zeros, lse, zeros, lse).ok);
  CHECK_FALSE(check_tolerance({0.0f, 1e-3f, 0.0f, 0.0f}, {-INFINITY}, zeros, lse, zeros, lse).ok);
}
