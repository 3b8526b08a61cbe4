// Division by a divisor fixed at launch, for index arithmetic in kernels. Host and device code: the
// CPU tests check it (tests/test_gpu_quantize_plan.cpp).
#pragma once

#include <cstdint>
#include <stdexcept>

#include "quant/host_device.hpp"

namespace kvq {

// Division by a divisor fixed at launch, without a division on the device (Granlund and Montgomery,
// 1994, theorem 4.2 with N = 31): for 1 <= d < 2^31 and 2^(l-1) < d <= 2^l, m = ceil(2^(31+l) / d) < 2^32
// and n / d = (n m) >> (31 + l) for every 0 <= n < 2^31. A 32-bit division by a run-time value costs
// ~25 instructions (three of them quarter-rate conversions); this costs one wide multiply and a shift.
struct InvariantDivisor {
  uint32_t magic = 1u << 31;
  int shift = 31;  // 31 + l
  KVQ_HD uint32_t divide(uint32_t n) const { return static_cast<uint32_t>((uint64_t(n) * magic) >> shift); }
};

inline InvariantDivisor make_invariant_divisor(int64_t d) {
  if (d < 1 || d >= (int64_t{1} << 31)) throw std::invalid_argument("make_invariant_divisor: divisor out of [1, 2^31)");
  int l = 0;
  while ((int64_t{1} << l) < d) ++l;
  InvariantDivisor div;
  div.shift = 31 + l;
  div.magic = static_cast<uint32_t>(((uint64_t{1} << div.shift) + uint64_t(d) - 1) / uint64_t(d));
  return div;
}

}  // namespace kvq
