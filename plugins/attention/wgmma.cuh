// Hopper (sm_90a) warpgroup MMA wrappers: shared-memory matrix descriptors, the async-proxy fence, wgmma
// fence/commit/wait, and the m64nNk16 products (fp32 accumulators) the sm90 attention mainloop issues.
#pragma once
#include "attention_mma.cuh"

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL) && defined(__CUDA_ARCH__)
#error "the wgmma mainloop (WGMMA=1) needs the sm_90a target (compute_90a); plan_attention selects it only there"
#endif

// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format", sm_90): bits 0-13 start address >> 4,
// 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension byte offset >> 4, 49-51 base offset (0: every
// swizzled region starts 1024-byte aligned), 62-63 swizzle mode (1 = 128-byte swizzle).
// Advancing a descriptor by b bytes (b % 16 == 0, inside one swizzle row or to a later 1024-byte atom) is adding
// b >> 4: the hardware applies the swizzle to the resulting address bits, as the cp.async stores did.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t smem_byte_addr, uint32_t leading_bytes,
                                                    uint32_t stride_bytes) {
  return static_cast<uint64_t>((smem_byte_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(leading_bytes >> 4) << 16) | (static_cast<uint64_t>(stride_bytes >> 4) << 32) |
         (1ull << 62);
}

// Ordinary (generic-proxy) shared-memory writes, cp.async included, become visible to wgmma (async proxy) only
// after this fence in the writing thread, followed by a barrier.
__device__ __forceinline__ void fence_async_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads/writes of registers that an in-flight wgmma owns across the fence/wait.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_operands(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[j][e])::"memory");
}

#if DTYPE_BF16
#define WGMMA_AB_TYPES ".bf16.bf16"
#else
#define WGMMA_AB_TYPES ".f16.f16"
#endif
// The accumulator fragment of m64nN, as n8 blocks: d[j][e] is row (warp % 4) * 16 + lane / 4 + (e / 2) * 8,
// column j * 8 + (lane % 4) * 2 + e % 2 -- per warp exactly the m16n8 accumulator layout of mma.sync.
#define WG_ACC4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define WG_ACC_N64 WG_ACC4(0), WG_ACC4(1), WG_ACC4(2), WG_ACC4(3), WG_ACC4(4), WG_ACC4(5), WG_ACC4(6), WG_ACC4(7)
#define WG_ACC_N128 WG_ACC_N64, WG_ACC4(8), WG_ACC4(9), WG_ACC4(10), WG_ACC4(11), WG_ACC4(12), WG_ACC4(13), \
                    WG_ACC4(14), WG_ACC4(15)
#define WG_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
               "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
               "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, " \
               "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
               "%62, %63}"

// d (64 x N, fp32) = (accumulate ? d : 0) + A (64 x 16, smem, K-major) * B (16 x N, smem, K-major: stored N x 16).
template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  static_assert(N == 64 || N == 128, "wgmma_ss: N must be 64 or 128");
  if constexpr (N == 64) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32" WGMMA_AB_TYPES " " WG_D32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WG_ACC_N64 : "l"(a_desc), "l"(b_desc), "r"(accumulate));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32" WGMMA_AB_TYPES " " WG_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_ACC_N128 : "l"(a_desc), "l"(b_desc), "r"(accumulate));
  }
}

// d (64 x N, fp32) += A (64 x 16, registers: the m16k16 A fragment of mma.sync per warp) * B (16 x N, smem,
// MN-major: stored 16 x N with N contiguous, hence the transpose flag 1). The accumulate predicate is constant true.
template <int N>
__device__ __forceinline__ void wgmma_rs_b_mn_major(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b_desc) {
  static_assert(N == 64 || N == 128, "wgmma_rs: N must be 64 or 128");
  if constexpr (N == 64) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32" WGMMA_AB_TYPES " " WG_D32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : WG_ACC_N64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(1));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32" WGMMA_AB_TYPES " " WG_D64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WG_ACC_N128 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(1));
  }
}

#undef WG_ACC4
#undef WG_ACC_N64
#undef WG_ACC_N128
#undef WG_D32
#undef WG_D64
