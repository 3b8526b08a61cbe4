#include "experiments/gate/block_special_values.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace kvq {
namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// iq4_nl's table and the midpoints between its neighbours: 31 values.
constexpr float kIq4nlPoints[31] = {-127,  -115.5, -104, -93.5, -83, -74, -65, -57, -49, -42, -35,
                                    -28.5, -22,    -16,  -10,   -4.5, 1,  7,   13,  19,  25,  31.5,
                                    38,    45.5,   53,   61,    69,   79, 89,  101, 113};
// e2m1 values and the midpoints between them (ties), positive; the blocks use both signs.
constexpr float kE2m1Points[15] = {0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6};

// Block i (32 elements) of a row of kind `kind`.
void fill_block(float* x, int kind, int64_t i) {
  const bool odd = i % 2 == 1;
  for (int j = 0; j < 32; ++j) {
    float v = 0.0f;
    switch (kind) {
      case 0: v = j == 0 ? (odd ? -127.0f : 127.0f) : static_cast<float>(j - 16) + 0.5f; break;
      case 1: v = j == 0 ? -8.0f : static_cast<float>(j % 16 - 8) + 0.5f; break;
      case 2: v = j == 0 ? -16.0f : static_cast<float>(j % 31 - 15) + 0.5f; break;
      case 3: v = j == 0 ? 0.0f : j == 1 ? (odd ? 31.0f : 15.0f) : static_cast<float>(j % (odd ? 31 : 15)) + 0.5f; break;
      case 4: v = j == 0 ? -127.0f : kIq4nlPoints[j - 1] * (odd && j > 1 ? -1.0f : 1.0f); break;
      case 5: {  // block 0: lifted (0x407fffff: log2 rounds to 2), 1: not lifted, 2: 2^-100 scale, 3: below 2^-125
        const float amax = i % 4 == 0 ? from_bits(0x407fffffu) : i % 4 == 1 ? from_bits(0x407ff000u) : 4.0f;
        const float unit = i % 4 == 2 ? std::ldexp(1.0f, -100) : i % 4 == 3 ? std::ldexp(1.0f, -128) : 1.0f;
        v = j == 0 ? amax * unit : kE2m1Points[j % 15] * (j >= 16 ? -unit : unit) * (i % 4 == 1 ? 0.5f : 1.0f);
        break;
      }
      case 6: {  // two nvfp4 blocks: pre-scales 1.0625 (tie between 1 and 1.125) and 1.1875 (1.125 / 1.25)
        const float sb = j < 16 ? 1.0f : 1.25f;  // the e4m3 scales the ties round to (even mantissas)
        if (i == 0 && j == 0) v = 2688.0f;       // s_t = 2688 / 2688 = 1 (this block: p = 448)
        else if (j % 16 == 0) v = j < 16 ? 6.375f : -7.125f;
        else v = kE2m1Points[(j % 16 - 1) % 14] * sb * (j % 3 == 0 ? -1.0f : 1.0f);  // up to 5: below the amax
        break;
      }
      case 7: v = (odd ? 1e-3f : 1e-5f) * static_cast<float>(j - 15) / 16.0f; break;
      case 8: {
        const float unit = i % 4 == 0 ? 1e-39f : i % 4 == 1 ? 1e-38f : i % 4 == 2 ? 3e-37f : 1e-45f;
        v = unit * static_cast<float>(j - 16);
        break;
      }
      case 9: v = i % 4 == 0 ? 0.0f : i % 4 == 1 ? -0.0f : i % 4 == 2 ? (j == 0 ? -0.0f : 0.0f) : -3.0f; break;
      case 10: v = odd ? (j == 0 ? -2.0f : j == 1 ? 2.0f : 0.5f) : (j == 17 ? 2000.0f : 1.0f); break;
      case 11: v = j == 5 ? (odd ? -1.0f : 1.0f) : j % 2 ? -0.0f : 0.0f; break;
    }
    x[j] = v;
  }
}

}  // namespace

std::vector<float> block_special_values(const KvShape& s) {
  if (s.head_dim % 32 != 0) throw std::invalid_argument("block_special_values: D must be a multiple of 32");
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (int64_t r = 0; r < s.rows(); ++r)
    for (int64_t i = 0; i < s.head_dim / 32; ++i) fill_block(v.data() + r * s.head_dim + 32 * i, static_cast<int>(r % 12), i);
  return v;
}

}  // namespace kvq
