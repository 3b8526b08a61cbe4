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
