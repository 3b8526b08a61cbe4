// Device check of the block-format codec's one call into a math library: mxfp4's exponent
// floor(log2f(amax)) (quant/block_formats.hpp: the double log2 rounded to float). The device's log2
// is not the host's, and near a power of two the rounding decides the floor, so the device's
// exponents are compared with the host's on every float near a power of two and a stride of the rest.
#pragma once

#include <cstdint>

namespace kvq {

struct Mxfp4ExponentCheck {
  int64_t checked = 0, mismatches = 0;
  uint32_t first_bits = 0;       // the first mismatching amax's bits
  int host_e = 0, device_e = 0;  // its exponents
  bool ok() const { return checked > 0 && mismatches == 0; }
};

Mxfp4ExponentCheck check_mxfp4_exponent();

}  // namespace kvq
