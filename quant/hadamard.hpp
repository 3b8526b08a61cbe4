// The normalized Walsh-Hadamard rotation of the `+had` modifier (DESIGN.md), host and device:
// butterflies with stride 1, 2, 4, ..., D/2, each (a, b) -> (a + b, a - b) in fp32, then every
// element times fl(1/sqrt(D)). D must be a power of two. The normalized matrix H is symmetric and
// orthogonal, so H is its own inverse: the same function rotates back (up to fp32 rounding).
#pragma once

#include <cmath>
#include <cstdint>

#include "quant/host_device.hpp"

namespace kvq {

KVQ_HD bool is_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// fl(1/sqrt(D)) for D = 2^k, without a library sqrt (so host and device agree by construction):
// 2^(-k/2) for even k, else fl(sqrt 2) * 2^(-(k+1)/2) -- scaling by a power of two commutes with
// rounding, and 0x1.6a09e6p+0 is sqrt(2) rounded to nearest fp32.
KVQ_HD float hadamard_norm(int64_t d) {
  int k = 0;
  while ((int64_t{1} << k) < d) ++k;
  float pow2 = 1.0f;  // 2^(-ceil(k/2))
  for (int i = 0; i < (k + 1) / 2; ++i) pow2 *= 0.5f;
  return k % 2 == 0 ? pow2 : 0x1.6a09e6p+0f * pow2;
}

// In place on x[0 .. d) (d a power of two; callers check). T = float is the codec's transform;
// T = double (with the norm in double) rotates results back in the fp64 reference.
template <typename T>
KVQ_HD void walsh_hadamard_unnormalized(T* x, int64_t d) {
  for (int64_t h = 1; h < d; h *= 2)
    for (int64_t i = 0; i < d; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const T a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

KVQ_HD void hadamard_rotate(float* x, int64_t d) {
  walsh_hadamard_unnormalized(x, d);
  const float norm = hadamard_norm(d);
  for (int64_t i = 0; i < d; ++i) x[i] *= norm;
}

// +had<N>: the rotation of each block of `block` consecutive elements of x[0 .. d) on its own
// (block-diagonal; block a power of two dividing d). block == d is the whole-row rotation.
KVQ_HD void hadamard_rotate(float* x, int64_t d, int64_t block) {
  for (int64_t i = 0; i < d; i += block) hadamard_rotate(x + i, block);
}

// Back to the input basis in fp64 (H is its own inverse): what the fp64 reference and the
// quantize-on-append cache apply to results computed in the rotated basis.
inline void hadamard_rotate_back(double* x, int64_t d) {
  walsh_hadamard_unnormalized(x, d);
  const double norm = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t i = 0; i < d; ++i) x[i] *= norm;
}
inline void hadamard_rotate_back(double* x, int64_t d, int64_t block) {
  for (int64_t i = 0; i < d; i += block) hadamard_rotate_back(x + i, block);
}

}  // namespace kvq
