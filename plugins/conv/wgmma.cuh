// Hopper (sm_90a) warpgroup MMA for the implicit GEMM: D[64 x N] += A[64 x k] * B[N x k]^T over one 32-byte k-step
// (k16 float16/bfloat16, k32 e4m3), both operands K-major in shared memory (swizzled as implicit_gemm.cu stores its
// tiles) and read through matrix descriptors; fp32 accumulators in registers laid out per 8-column block as
// mma.sync's m16n8 C fragment (warp w of the warpgroup holds rows 16w..16w+15).
#pragma once

// Shared-memory matrix descriptor of a K-major tile with ROW_BYTES-byte rows (64: 64-byte swizzle, 128: 128-byte),
// 8-row groups ROW_BYTES * 8 apart. The tile must start on a 512 / 1024-byte boundary (the swizzle repeat).
template <int ROW_BYTES>
__device__ __forceinline__ unsigned long long smem_descriptor(const void* tile) {
  static_assert(ROW_BYTES == 64 || ROW_BYTES == 128, "64- or 128-byte swizzled rows");
  const unsigned long long address = unsigned(__cvta_generic_to_shared(tile)) & 0x3FFFF;
  const unsigned long long swizzle = ROW_BYTES == 128 ? 1 : 2;
  return (address >> 4) | (1ull << 16) | ((unsigned long long)(8 * ROW_BYTES >> 4) << 32) | (swizzle << 62);
}

// Keeps the compiler from moving accumulator reads or writes across the asynchronous MMAs.
template <int N>
__device__ __forceinline__ void fence_accumulators(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most N committed groups of this warpgroup's MMAs are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// The instruction for this specialization's operand type: k16 for 2-byte elements, k32 for e4m3 (a 32-byte k-step
// either way); float16/bfloat16 take the two transpose immediates (0: K-major), e4m3 has none.
#if FP8
#define WGMMA_INSTRUCTION(N) "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 "
#define WGMMA_IMMEDIATES "p, 1, 1;\n}\n"
#elif CONV_BF16
#define WGMMA_INSTRUCTION(N) "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 "
#define WGMMA_IMMEDIATES "p, 1, 1, 0, 0;\n}\n"
#else
#define WGMMA_INSTRUCTION(N) "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.f16.f16 "
#define WGMMA_IMMEDIATES "p, 1, 1, 0, 0;\n}\n"
#endif
#define WGMMA_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                    "+f"(d[i + 6]), "+f"(d[i + 7])
#define WGMMA_D16(i) WGMMA_D8(i), WGMMA_D8(i + 8)
#define WGMMA_D32(i) WGMMA_D16(i), WGMMA_D16(i + 16)
#define WGMMA_D64(i) WGMMA_D32(i), WGMMA_D32(i + 32)
__device__ __forceinline__ void wgmma_m64n32(float* d, unsigned long long a, unsigned long long b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n" WGMMA_INSTRUCTION(32)
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, "
      WGMMA_IMMEDIATES
      : WGMMA_D16(0)
      : "l"(a), "l"(b));
}
__device__ __forceinline__ void wgmma_m64n64(float* d, unsigned long long a, unsigned long long b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n" WGMMA_INSTRUCTION(64)
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, "
      WGMMA_IMMEDIATES
      : WGMMA_D32(0)
      : "l"(a), "l"(b));
}
__device__ __forceinline__ void wgmma_m64n128(float* d, unsigned long long a, unsigned long long b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n" WGMMA_INSTRUCTION(128)
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63}, %64, %65, "
      WGMMA_IMMEDIATES
      : WGMMA_D64(0)
      : "l"(a), "l"(b));
}
__device__ __forceinline__ void wgmma_m64n256(float* d, unsigned long long a, unsigned long long b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n" WGMMA_INSTRUCTION(256)
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "
      "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, "
      "%102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, "
      "%119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, "
      WGMMA_IMMEDIATES
      : WGMMA_D64(0), WGMMA_D64(64)
      : "l"(a), "l"(b));
}

// One 32-byte k-step of a 64 x N tile.
template <int N>
__device__ __forceinline__ void wgmma_k32bytes(float* d, unsigned long long a, unsigned long long b) {
  static_assert(N == 32 || N == 64 || N == 128 || N == 256, "wgmma tile width 32, 64, 128 or 256");
  if constexpr (N == 32) wgmma_m64n32(d, a, b);
  else if constexpr (N == 64) wgmma_m64n64(d, a, b);
  else if constexpr (N == 128) wgmma_m64n128(d, a, b);
  else wgmma_m64n256(d, a, b);
}
