// Division by a run-time divisor as multiply-high and shift (Granlund & Montgomery), for implicit-GEMM index math.
//
// The magic numbers need 2^32 / d and ceil(log2 d), which TensorRT's symbolic shape expressions (int32 + - * //)
// cannot express, so each thread builds them once at kernel start from the plain int32 divisor (a few dozen
// instructions, once per thread) and every later division in the kernel is one __umulhi, one add and one shift.
#pragma once

struct FastDivmod {
  unsigned divisor, multiplier, shift;

  // Valid for 1 <= d < 2^31 and dividends 0 <= n < 2^31.
  __device__ __forceinline__ explicit FastDivmod(int d) : divisor(unsigned(d)) {
    shift = 32u - unsigned(__clz(int(divisor - 1u)));  // ceil(log2 d); 0 for d == 1
    unsigned long long two_s = 1ull << shift;
    multiplier = unsigned(((1ull << 32) * (two_s - divisor)) / divisor + 1ull);
  }

  __device__ __forceinline__ int div(int n) const {
    return int((__umulhi(unsigned(n), multiplier) + unsigned(n)) >> shift);
  }

  // Quotient, with the remainder written to *rem.
  __device__ __forceinline__ int divmod(int n, int* rem) const {
    int q = div(n);
    *rem = n - q * int(divisor);
    return q;
  }
};
