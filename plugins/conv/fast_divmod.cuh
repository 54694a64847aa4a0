// Division by a run-time divisor as multiply-high and shift (Granlund & Montgomery), for implicit-GEMM index math.
//
// The magic numbers need 2^32 / d and ceil(log2 d), which TensorRT's symbolic shape expressions (int32 + - * //)
// cannot express, so they are built at kernel start from the plain int32 divisor (a 64-bit division: WarpDivmods
// builds a warp's divisors on separate lanes at once) and every later division in the kernel is one __umulhi, one add
// and one shift.
#pragma once

struct FastDivmod {
  unsigned divisor, multiplier, shift;

  FastDivmod() = default;
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

  // The FastDivmod of divisor d that lane `lane` of the warp built (all 32 lanes call it). d is passed, not shuffled:
  // a kernel argument the compiler can reload instead of keeping it in a register.
  __device__ __forceinline__ FastDivmod from_lane(int lane, int d) const {
    FastDivmod f;
    f.divisor = unsigned(d);
    f.multiplier = __shfl_sync(0xffffffffu, multiplier, lane);
    f.shift = __shfl_sync(0xffffffffu, shift, lane);
    return f;
  }
};

// FastDivmods of N run-time divisors for every lane of the calling warp (all 32 lanes call it, converged): lane i
// builds the i-th, so the constructor's 64-bit division (a called routine of dependent multiplies, reciprocal and
// conversions) runs once for all N instead of N times in a row, on the kernels' path to their first loads; the warp
// shares them by shuffles. kShared = false: every thread builds all N itself (kernels whose roles share one register
// cap spilled with the shuffled build: implicit_gemm_sm90.cu's kLoaderOwnsRegisters).
template <int N, bool kShared = true>
struct WarpDivmods {
  FastDivmod at[N];
  __device__ __forceinline__ explicit WarpDivmods(const int (&divisors)[N]) {
    static_assert(N >= 1 && N <= 32, "one divisor a lane");
    if constexpr (!kShared) {
#pragma unroll
      for (int i = 0; i < N; ++i) at[i] = FastDivmod(divisors[i]);
    } else {
      const int lane = threadIdx.x & 31;
      int mine = divisors[0];
#pragma unroll
      for (int i = 1; i < N; ++i) mine = lane == i ? divisors[i] : mine;
      const FastDivmod built(mine);
#pragma unroll
      for (int i = 0; i < N; ++i) at[i] = built.from_lane(i, divisors[i]);
    }
  }
};
