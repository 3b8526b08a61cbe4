// Host/device portability for the headers that nvcc and the host compiler both see.
#pragma once

#if defined(__CUDACC__)
#define KVQ_HD __host__ __device__ __forceinline__
#else
#define KVQ_HD inline
#endif
// A codec loop over a block's elements unrolled on the device, so that the block stays in registers
// (a loop the compiler leaves rolled indexes it, which moves it to local memory).
#if defined(__CUDA_ARCH__)
#define KVQ_UNROLL _Pragma("unroll")
#else
#define KVQ_UNROLL
#endif

#include <cstdint>
#include <cstring>

namespace kvq {

KVQ_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

KVQ_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

}  // namespace kvq
