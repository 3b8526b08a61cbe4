// Does mma.m16n8k16 f16 -> f32 take subnormal fp16 A operands exactly? A = codes u * 2^-24 (bits u),
// B = random fp16; compare with the exact product computed in double.
#include <cstdio>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <cuda_fp16.h>
__global__ void k(const uint16_t* A, const uint16_t* B, float* C) {  // A 16x16 row-major, B 16x8 (k x n)
  int lane = threadIdx.x, g = lane >> 2, c = lane & 3;
  auto pk = [](uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; };
  uint32_t a0 = pk(A[g * 16 + 2 * c], A[g * 16 + 2 * c + 1]), a1 = pk(A[(g + 8) * 16 + 2 * c], A[(g + 8) * 16 + 2 * c + 1]);
  uint32_t a2 = pk(A[g * 16 + 2 * c + 8], A[g * 16 + 2 * c + 9]), a3 = pk(A[(g + 8) * 16 + 2 * c + 8], A[(g + 8) * 16 + 2 * c + 9]);
  uint32_t b0 = pk(B[(2 * c) * 8 + g], B[(2 * c + 1) * 8 + g]), b1 = pk(B[(2 * c + 8) * 8 + g], B[(2 * c + 9) * 8 + g]);
  float d[4] = {0, 0, 0, 0};
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  C[g * 8 + 2 * c] = d[0], C[g * 8 + 2 * c + 1] = d[1], C[(g + 8) * 8 + 2 * c] = d[2], C[(g + 8) * 8 + 2 * c + 1] = d[3];
}
int main() {
  uint16_t *A, *B; float* C;
  cudaMallocManaged(&A, 512); cudaMallocManaged(&B, 256); cudaMallocManaged(&C, 512);
  for (int mode = 0; mode < 8; ++mode) {
  // A: 0 = 1024 + u (normal fp16), 3 = u (normal fp16), others u * 2^-24 (subnormal bits); B: see span / lo
  srand(1); int bad = 0; double worst = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    for (int i = 0; i < 256; ++i) { int u = (trial & 1) ? (rand() & 0xf) << 4 : (rand() & 0xf);
      A[i] = mode == 0 ? __half_as_ushort(__float2half(1024.f + u)) : mode == 3 ? __half_as_ushort(__float2half((float)u)) : u; }
    // B = (r - 1/2) 2^e, e in [lo, lo + span): the README lists each mode's range
    int span = mode == 4 ? 8 : mode == 5 ? 5 : mode == 6 ? 25 : mode == 7 ? 3 : mode >= 2 ? 8 : 30;
    int lo = mode == 4 ? 6 : mode == 5 ? 10 : mode == 6 ? -10 : mode == 7 ? 12 : mode >= 2 ? -4 : -15;
    for (int i = 0; i < 128; ++i) { float v = ((rand() / (float)RAND_MAX) - 0.5f) * powf(2.f, (rand() % span) + lo); B[i] = __half_as_ushort(__float2half(v)); }
    k<<<1, 32>>>(A, B, C); cudaDeviceSynchronize();
    for (int m = 0; m < 16; ++m) for (int n = 0; n < 8; ++n) {
      double exact = 0, mag = 0;
      for (int kk = 0; kk < 16; ++kk) { double a = (mode == 1 || mode == 2 || mode >= 4) ? ldexp((double)A[m * 16 + kk], -24) : (double)__half2float(__ushort_as_half(A[m * 16 + kk])), b = (double)__half2float(__ushort_as_half(B[kk * 8 + n])); exact += a * b; mag += fabs(a * b); }
      double err = fabs(C[m * 8 + n] - exact) / (mag > 0 ? mag : 1);
      worst = fmax(worst, err); if (err > 1e-6) ++bad;
    }
  }
  printf("mode %d: worst relative error %.3g (to sum |a b|), %d of %d outputs beyond 1e-6\n", mode, worst, bad, 2000 * 128);
  }
  return 0;
}
