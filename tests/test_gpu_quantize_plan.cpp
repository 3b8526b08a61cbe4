// Host side of the wide-group quantize variants (no device needed): the launch plans of
// quantize-tokenteam and quantize-tensor2pass (gpu/quantize_wide_plan.hpp) put every chunk of every
// token or tensor exactly once, at the input offset its strides give and at its planar code offset;
// a host replay of the per-token walk through the codec gives the CPU quantizer's bytes; the packed
// 16-bit statistics (gpu/quantize_stats16.hpp) equal the codec's GroupStats over every pattern.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>

#include "experiments/gate/validate_quantize.hpp"
#include "gpu/quantize_block_geometry.hpp"
#include "gpu/quantize_stats16.hpp"
#include "gpu/quantize_wide_plan.hpp"
#include "quant/quantize.hpp"

using namespace kvq;

namespace {

std::string dims(const KvShape& s) {
  return std::to_string(s.batch) + "x" + std::to_string(s.heads) + "x" + std::to_string(s.tokens) + "x" +
         std::to_string(s.head_dim);
}

// Logical element (b, h, t, d) of a tensor stored with these strides.
int64_t stored_offset(const QuantizeParams& p, int64_t flat) {
  const KvShape& s = p.shape;
  const int64_t d = flat % s.head_dim, r = flat / s.head_dim;
  const int64_t t = r % s.tokens, h = (r / s.tokens) % s.heads, b = r / (s.tokens * s.heads);
  return b * p.stride_b + h * p.stride_h + t * p.stride_t + d;
}

QuantizeParams params_for(const KvShape& s, bool bsnh, int64_t pad = 0) {
  QuantizeParams p;
  p.shape = s;
  if (bsnh) {
    p.stride_h = s.head_dim + pad, p.stride_t = s.heads * p.stride_h, p.stride_b = s.tokens * p.stride_t;
  } else {
    p.stride_t = s.head_dim + pad, p.stride_h = s.tokens * p.stride_t, p.stride_b = s.heads * p.stride_h;
  }
  return p;
}

}  // namespace

TEST_CASE("tokenteam plan: the smallest team with at most K chunks a lane, every chunk of a token once") {
  struct Case {
    KvShape shape;
    InputDtype dtype;
    int lanes, cached;
  };
  const Case cases[] = {
      {{1, 1, 3, 8}, InputDtype::kBf16, 1, 4},     {{1, 1, 3, 64}, InputDtype::kBf16, 2, 4},
      {{1, 1, 3, 128}, InputDtype::kBf16, 4, 4},   {{1, 2, 3, 128}, InputDtype::kBf16, 8, 4},
      {{1, 4, 3, 128}, InputDtype::kBf16, 16, 4},  {{1, 8, 3, 128}, InputDtype::kBf16, 32, 4},
      {{1, 8, 3, 256}, InputDtype::kBf16, 32, 8},  {{1, 8, 3, 256}, InputDtype::kFp32, 32, 4},
      {{1, 16, 3, 256}, InputDtype::kFp16, 32, 8}, {{1, 5, 3, 128}, InputDtype::kBf16, 32, 4},
      {{1, 7, 3, 24}, InputDtype::kBf16, 8, 4},    {{1, 3, 3, 40}, InputDtype::kFp32, 4, 4},
      {{1, 32, 3, 128}, InputDtype::kBf16, 32, 8},
  };
  for (const Case& c : cases) {
    CAPTURE(dims(c.shape));
    CAPTURE(to_string(c.dtype));
    const TokenPlan plan = make_token_plan(c.shape, c.dtype);
    CHECK((1 << plan.lanes_log2) == c.lanes);
    CHECK(plan.cached == c.cached);
    const int L = 1 << plan.lanes_log2, S = plan.chunks_per_token;
    CHECK(S == c.shape.heads * c.shape.head_dim / 8);
    std::map<std::pair<int, int>, int> seen;  // (head, d0) -> times
    int total = 0;
    for (int j = 0; j < L; ++j) {
      const int n = token_lane_chunks(plan, j);
      if (S <= 32 * plan.cached) CHECK(n <= plan.cached);  // read once, from registers
      for (int k = 0; k < n; ++k) {
        const ChunkPos at = token_chunk(plan, j, k);
        CHECK(at.h >= 0);
        CHECK(at.h < c.shape.heads);
        CHECK(at.d0 % 8 == 0);
        CHECK(at.d0 >= 0);
        CHECK(at.d0 < c.shape.head_dim);
        ++seen[{at.h, at.d0}];
        ++total;
      }
    }
    CHECK(total == S);
    CHECK(seen.size() == static_cast<size_t>(S));
    for (const auto& [where, times] : seen) CHECK(times == 1);
  }
}

TEST_CASE("tokenteam walk: every token's team lanes once for any grid, the loop uniform across a warp") {
  for (const KvShape& shape : {KvShape{3, 1, 37, 128}, KvShape{2, 8, 9, 128}, KvShape{1, 1, 50, 8}, KvShape{5, 2, 7, 64}})
    for (int64_t threads : {256, 512, 256 * 3, 256 * 64}) {
      CAPTURE(dims(shape));
      CAPTURE(threads);
      const TokenPlan plan = make_token_plan(shape, InputDtype::kBf16);
      const int L = 1 << plan.lanes_log2;
      std::vector<int> seen(static_cast<size_t>(plan.tokens * L), 0);
      for (int64_t thread = 0; thread < threads; ++thread) {
        const TeamWalk w = token_walk(plan, thread, threads);
        const TeamWalk lane0 = token_walk(plan, thread - thread % 32, threads);
        CHECK(w.warp_first == lane0.warp_first);  // the loop test is the same for the whole warp
        CHECK(w.stride == lane0.stride);
        for (int64_t first = w.warp_first; first < plan.tokens; first += w.stride) {
          const int64_t token = first + w.team_in_warp;
          if (token < plan.tokens) ++seen[static_cast<size_t>(token * L + w.j)];
        }
      }
      CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<long>(seen.size()));
    }
}

TEST_CASE("tokenteam replayed on the host through its plan gives the CPU quantizer's bytes") {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const KvShape& shape : {KvShape{2, 3, 5, 24}, KvShape{1, 8, 4, 256}, KvShape{3, 16, 2, 256}, KvShape{2, 1, 9, 8}})
    for (bool bsnh : {false, true})
      for (const char* name : {"int8-token", "int4-token-asym", "int4-token-fp32"}) {
        CAPTURE(dims(shape));
        CAPTURE(bsnh);
        CAPTURE(name);
        const Scheme scheme = parse_scheme(name);
        std::vector<float> logical(static_cast<size_t>(shape.numel()));
        for (float& x : logical) x = normal(rng);
        QuantizeParams p = params_for(shape, bsnh);
        std::vector<float> stored(static_cast<size_t>(shape.numel()));
        for (int64_t i = 0; i < shape.numel(); ++i) stored[static_cast<size_t>(stored_offset(p, i))] = logical[i];

        const TokenPlan plan = make_token_plan(shape, InputDtype::kBf16);
        const int L = 1 << plan.lanes_log2;
        const int64_t code_bytes = shape.rows() * code_bytes_per_row(scheme, shape.head_dim);
        std::vector<uint8_t> codes(static_cast<size_t>(code_bytes), 0xa5);
        std::vector<float> scales, zeros;
        for (int64_t token = 0; token < plan.tokens; ++token) {
          int64_t b, t;
          token_coordinates(plan, shape, token, b, t);
          auto input = [&](const ChunkPos& at, int e) {
            return stored[static_cast<size_t>(b * p.stride_b + t * p.stride_t + at.h * p.stride_h + at.d0 + e)];
          };
          GroupStats st;  // the team's lanes, merged
          for (int j = 0; j < L; ++j)
            for (int k = 0; k < token_lane_chunks(plan, j); ++k)
              for (int e = 0; e < 8; ++e) st.add(input(token_chunk(plan, j, k), e));
          const GroupParams gp = group_params(st, scheme);
          scales.push_back(gp.scale);
          if (scheme.asymmetric) zeros.push_back(gp.zero);
          for (int j = 0; j < L; ++j)
            for (int k = 0; k < token_lane_chunks(plan, j); ++k) {
              const ChunkPos at = token_chunk(plan, j, k);
              uint8_t* dst = codes.data() + token_flat_index(shape, b, t, at) * scheme.bits / 8;
              for (int e = 0; e < 8; e += 2) {
                const int q0 = encode(input(at, e), gp, scheme), q1 = encode(input(at, e + 1), gp, scheme);
                if (scheme.bits == 8) dst[e] = code_to_byte(q0), dst[e + 1] = code_to_byte(q1);
                else dst[e / 2] = pack_nibbles(q0, q1);
              }
            }
        }
        const QuantizedKv cpu = quantize(KvView::bnsh(logical.data(), shape), scheme, "K");
        CHECK(codes == cpu.codes);
        CHECK(scales == cpu.scales);
        CHECK(zeros == cpu.zeros);
      }
}

TEST_CASE("tensor2pass plan: chunk c starts at element 8c of the logical tensor, whatever the strides") {
  for (const KvShape& shape : {KvShape{2, 3, 5, 24}, KvShape{1, 8, 7, 128}, KvShape{3, 1, 4, 8}})
    for (bool bsnh : {false, true})
      for (int64_t pad : {0, 8}) {
        CAPTURE(dims(shape));
        CAPTURE(bsnh);
        CAPTURE(pad);
        const QuantizeParams p = params_for(shape, bsnh, pad);
        const TensorPlan plan = make_tensor_plan(p);
        CHECK(plan.chunks * 8 == shape.numel());
        CHECK(plan.contiguous == (!bsnh && pad == 0));  // BSNH is never taken for contiguous
        for (int64_t c = 0; c < plan.chunks; ++c) CHECK(tensor_chunk_offset(p, plan, c) == stored_offset(p, 8 * c));
      }
}

namespace {

float half_value(uint16_t bits, InputDtype dt) {
  return dt == InputDtype::kFp16 ? fp16_bits_to_fp32(bits) : bf16_bits_to_fp32(bits);
}

// A random word of two 16-bit patterns for group `group`: every third group tiny values and +-0
// only, every third one without inf or NaN.
uint32_t random_pair(std::mt19937& rng, int group) {
  uint32_t w = rng();
  if (group % 3 == 0) w &= 0x80038003u;
  if (group % 3 == 1) w &= 0xbfffbfffu;
  return w;
}

// A random group of 1 + group % 64 words (random_pair) into both accumulators: the packed one with
// keys or magnitudes only (kKeys), the codec's element by element.
template <bool kKeys>
void add_random_group(std::mt19937& rng, int group, InputDtype dt, PackedStats16& packed, GroupStats& codec) {
  const int words = 1 + group % 64;
  for (int i = 0; i < words; ++i) {
    const uint32_t w = random_pair(rng, group);
    packed.add<kKeys>(w);
    codec.add(half_value(uint16_t(w & 0xffff), dt));
    codec.add(half_value(uint16_t(w >> 16), dt));
  }
}

// Field by field, bits and all (NaN amax included).
void check_same_stats(const GroupStats& packed, const GroupStats& codec) {
  CHECK(packed.lo_key == codec.lo_key);
  CHECK(packed.hi_key == codec.hi_key);
  CHECK(float_bits(packed.amax) == float_bits(codec.amax));
}

}  // namespace

TEST_CASE("packed 16-bit statistics equal the codec's GroupStats for every bf16 and fp16 pattern") {
  for (InputDtype dt : {InputDtype::kBf16, InputDtype::kFp16}) {
    CAPTURE(to_string(dt));
    // Every pattern alone, and beside each neighbour pattern in the other half.
    for (uint32_t a = 0; a < 0x10000; ++a) {
      const uint32_t b = (a * 40503u + 17u) & 0xffffu;  // a permutation of the patterns
      PackedStats16 packed;
      packed.add(a | (a << 16));
      GroupStats codec;
      codec.add(half_value(uint16_t(a), dt));
      check_same_stats(packed.finish(dt), codec);
      packed.add(a | (b << 16));
      codec.add(half_value(uint16_t(b), dt));
      check_same_stats(packed.finish(dt), codec);
    }
    // Groups of many words: random patterns, and finite ones around signed zeros in both orders.
    std::mt19937 rng(3);
    for (int group = 0; group < 2000; ++group) {
      PackedStats16 packed;
      GroupStats codec;
      add_random_group<true>(rng, group, dt, packed, codec);
      check_same_stats(packed.finish(dt), codec);
    }
  }
}

TEST_CASE("packed 16-bit magnitudes alone give the codec's amax, symmetric parameters and bounds") {
  std::mt19937 rng(4);
  for (InputDtype dt : {InputDtype::kBf16, InputDtype::kFp16}) {
    CAPTURE(to_string(dt));
    for (int group = 0; group < 3000; ++group) {
      PackedStats16 packed;
      GroupStats codec;
      add_random_group<false>(rng, group, dt, packed, codec);
      const GroupStats st = packed.finish(dt, false);
      REQUIRE(float_bits(st.amax) == float_bits(codec.amax));
      CHECK(st.all_finite(false) == codec.all_finite(false));
      if (!codec.all_finite(false)) continue;
      CHECK(!st.empty());
      CHECK(st.lo() <= codec.lo());  // bounds of the group's values, as integer_coder needs
      CHECK(st.hi() >= codec.hi());
      const Scheme s = parse_scheme("int8-head");
      CHECK(float_bits(group_params(st, s).scale) == float_bits(group_params(codec, s).scale));
    }
  }
}

TEST_CASE("InvariantDivisor divides every n < 2^31 as the division does") {
  auto check = [](int64_t d, uint32_t n) {
    const InvariantDivisor div = make_invariant_divisor(d);
    REQUIRE(div.divide(n) == n / uint32_t(d));
  };
  std::mt19937 rng(5);
  const uint32_t top = (1u << 31) - 1;
  for (int64_t d = 1; d <= 3000; ++d)  // small divisors: around every multiple near 0 and near 2^31
    for (uint32_t q : {0u, 1u, 2u, 7u, top / uint32_t(d) - 1, top / uint32_t(d)})
      for (int64_t delta = -2; delta <= 2; ++delta) {
        const int64_t n = int64_t(q) * d + delta;
        if (n >= 0 && n <= top) check(d, uint32_t(n));
      }
  for (int i = 0; i < 200'000; ++i) {  // any divisor, any numerator, and the ends of its quotients
    const int64_t d = 1 + int64_t(rng() % top);
    check(d, rng() & top);
    check(d, top);
    check(d, uint32_t(d - 1));
    if (d <= top) check(d, uint32_t(d));
  }
  for (int l = 0; l < 31; ++l) {  // powers of two and their neighbours
    for (int64_t d : {(int64_t{1} << l) - 1, int64_t{1} << l, (int64_t{1} << l) + 1}) {
      if (d < 1 || d > top) continue;
      check(d, top);
      check(d, rng() & top);
    }
  }
  CHECK_THROWS(make_invariant_divisor(0));
  CHECK_THROWS(make_invariant_divisor(int64_t{1} << 31));
}

TEST_CASE("block positions by InvariantDivisor equal the divisions, at every block, in either row order") {
  for (const KvShape& s : {KvShape{3, 5, 37, 128}, KvShape{2, 8, 4096, 128}, KvShape{1, 1, 1, 32}, KvShape{7, 3, 11, 96},
                           KvShape{2, 2, 3, 16}, KvShape{1, 32, 5, 256}}) {
    for (int elems : {16, 24, 32}) {
      if (s.head_dim % elems) continue;
      for (bool token_major : {false, true}) {
        CAPTURE(s.heads);
        CAPTURE(s.tokens);
        CAPTURE(s.head_dim);
        CAPTURE(elems);
        CAPTURE(token_major);
        const BlockGeometry geo = block_geometry(s, elems);
        REQUIRE(geo.narrow);
        BlockGeometry wide = geo;
        wide.narrow = false;
        const int64_t blocks = s.rows() * geo.per_row;
        int64_t g = 0;
        // block g is (b, h, t, d0) in turn, or (b, t, h, d0) token-major (FBGEMM rows' order)
        const int64_t inner = token_major ? s.heads : s.tokens, outer = token_major ? s.tokens : s.heads;
        for (int64_t b = 0; b < s.batch; ++b)
          for (int64_t o = 0; o < outer; ++o)
            for (int64_t in = 0; in < inner; ++in)
              for (int64_t d0 = 0; d0 < s.head_dim; d0 += elems, ++g) {
                const int64_t h = token_major ? in : o, t = token_major ? o : in;
                for (const BlockAt& at : {block_at(s, g, geo, elems, token_major), block_at(s, g, wide, elems, token_major)}) {
                  REQUIRE(at.b == b);
                  REQUIRE(at.h == h);
                  REQUIRE(at.t == t);
                  REQUIRE(at.d0 == d0);
                  REQUIRE(at.row == (b * s.heads + h) * s.tokens + t);
                }
              }
        CHECK(g == blocks);
      }
    }
  }
  CHECK(!block_geometry(KvShape{4096, 8, 65536, 128}, 32).narrow);  // 2^32 blocks: the divisions
}

TEST_CASE("tokenteam's (b, t) of a token by InvariantDivisor equal the division, and the wide path agrees") {
  std::mt19937_64 rng(11);
  for (const KvShape& shape : {KvShape{3, 1, 37, 128}, KvShape{7, 8, 1, 64}, KvShape{1, 2, 1000003, 8},
                               KvShape{65535, 1, 32768, 8}, KvShape{2, 1, (int64_t{1} << 30) - 3, 8}}) {
    CAPTURE(dims(shape));
    const TokenPlan plan = make_token_plan(shape, InputDtype::kBf16);
    REQUIRE(plan.narrow);
    TokenPlan wide = plan;
    wide.narrow = false;
    auto check = [&](int64_t token) {
      int64_t b = -1, t = -1, wb = -1, wt = -1;
      token_coordinates(plan, shape, token, b, t);
      token_coordinates(wide, shape, token, wb, wt);
      REQUIRE(b == token / shape.tokens);
      REQUIRE(t == token % shape.tokens);
      REQUIRE(wb == b);
      REQUIRE(wt == t);
    };
    for (int64_t b = 0; b < std::min<int64_t>(shape.batch, 50); ++b)  // both sides of every batch boundary
      for (int64_t t : {int64_t{0}, int64_t{1}, shape.tokens - 1})
        if (t >= 0 && t < shape.tokens) check(b * shape.tokens + t);
    for (int i = 0; i < 20000; ++i) check(static_cast<int64_t>(rng() % static_cast<uint64_t>(plan.tokens)));
    check(plan.tokens - 1);
  }
  CHECK(!make_token_plan(KvShape{4, 1, int64_t{1} << 30, 8}, InputDtype::kBf16).narrow);  // 2^32 tokens: the division
}

TEST_CASE("wide_chunks_aligned: every chunk on 16 bytes, or the kernels' element-by-element loads") {
  alignas(16) static float storage[64];
  for (InputDtype dt : {InputDtype::kBf16, InputDtype::kFp16, InputDtype::kFp32}) {
    CAPTURE(to_string(dt));
    const int64_t per16 = dt == InputDtype::kFp32 ? 4 : 8, bytes = dt == InputDtype::kFp32 ? 4 : 2;
    for (bool bsnh : {false, true})
      for (int64_t pad : {int64_t{0}, per16, per16 / 2, int64_t{1}}) {
        CAPTURE(bsnh);
        CAPTURE(pad);
        QuantizeParams p = params_for(KvShape{2, 3, 5, 16}, bsnh, pad);
        p.in_dtype = dt;
        p.input = storage;
        CHECK(wide_chunks_aligned(p) == (pad % per16 == 0));
        p.input = reinterpret_cast<const char*>(storage) + bytes;  // a view one element in
        CHECK_FALSE(wide_chunks_aligned(p));
      }
  }
  // Unaligned input keeps K = 4 chunks a lane, with the team that K needs.
  const TokenPlan wide = make_token_plan(KvShape{1, 16, 3, 256}, InputDtype::kBf16);
  const TokenPlan narrow = make_token_plan(KvShape{1, 16, 3, 256}, InputDtype::kBf16, false);
  CHECK(wide.cached == 8);
  CHECK(narrow.cached == 4);
  CHECK(narrow.lanes_log2 == 5);
}
