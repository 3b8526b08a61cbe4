// Special values for the block formats (q8_0 ... nvfp4): rows whose 32-element blocks sit on the
// corners of each reference rule, for the GPU-vs-CPU gate and tests. Row r takes kind r % 12:
//   0 q8_0 ties (d = 1, half steps round away)      6 nvfp4 at s_t = 1: e4m3 ties of the block scale,
//   1 q4_0 ties (d = 1: x + 8.5 an integer)            e2m1 ties of the codes (the tensor's amax, 2688,
//   2 q5_0 ties (d = 1)                                 is element 0 of each such row)
//   3 q4_1 / q5_1 ties (min 0, d = 1)                7 fp16-subnormal d (|x| ~ 1e-5 .. 1e-3)
//   4 iq4_nl: every table value and midpoint (d0=1)  8 blocks so small that 1/d overflows (fp32 subnormals)
//   5 mxfp4: amax just below a power of two (the     9 zero blocks: +0, -0, -0 first, a constant
//     rounded log2 lifts the exponent, or not),      10 one huge value; opposite largest magnitudes
//     e2m1 ties, tiny exponents                      11 signed zeros as min and max around one value
// Every value is at most 2688 in magnitude, so nvfp4's s_t is exactly 1 when a kind-6 row is present.
// D must be a multiple of 32.
#pragma once

#include <vector>

#include "quant/groups.hpp"

namespace kvq {

std::vector<float> block_special_values(const KvShape& shape);

}  // namespace kvq
