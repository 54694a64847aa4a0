// Hopper (sm_90a) warpgroup MMA: shared-memory matrix descriptors, the async-proxy fence, wgmma fence/commit/wait,
// and the m64nN products (fp32 accumulators). The accumulator fragment of m64nN, as n8 blocks d[j][0..3], is per
// warp exactly mma.sync's m16n8 C fragment: row (warp % 4) * 16 + lane / 4 + (e / 2) * 8, column j * 8 +
// (lane % 4) * 2 + e % 2, so a kernel shares its softmax/epilogue code between the two MMA paths.
#pragma once
#include <stdint.h>

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL) && defined(__CUDA_ARCH__)
#error "wgmma (WGMMA=1) needs the sm_90a target (compute_90a); the launch plans select it only there"
#endif

// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format", sm_90): bits 0-13 start address >> 4,
// 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension byte offset >> 4, 49-51 base offset (0: every
// swizzled region starts on its swizzle repeat, kSwizzleBytes * 8 bytes), 62-63 swizzle mode (1: 128-byte rows,
// 2: 64-byte, 3: 32-byte). Advancing a descriptor by b bytes (b % 16 == 0, inside one swizzle row or to a later repeat) is
// adding b >> 4: the hardware applies the swizzle to the resulting address bits, as the cp.async stores did.
template <int kSwizzleBytes>
__device__ __forceinline__ uint64_t smem_desc(uint32_t smem_byte_addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  static_assert(kSwizzleBytes == 128 || kSwizzleBytes == 64 || kSwizzleBytes == 32, "128-, 64- or 32-byte swizzled rows");
  constexpr uint64_t kMode = kSwizzleBytes == 128 ? 1 : kSwizzleBytes == 64 ? 2 : 3;
  return static_cast<uint64_t>((smem_byte_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(leading_bytes >> 4) << 16) | (static_cast<uint64_t>(stride_bytes >> 4) << 32) |
         (kMode << 62);
}

// Ordinary (generic-proxy) shared-memory writes, cp.async included, become visible to wgmma (async proxy) only
// after this fence in the writing thread, followed by a barrier.
__device__ __forceinline__ void fence_async_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most kPending committed groups of this warpgroup's MMAs are still running.
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

// Operand types: e4m3 for an FP8 specialization (k32), else the element type (DTYPE_BF16, k16): a 32-byte k-step
// either way. The immediates after the predicate: scale-a, scale-b (1: no negation), and for 16-bit types the
// transpose flags of A and B (0: K-major).
#if DTYPE_BF16
#define WGMMA_F16_TYPES ".bf16.bf16"
#else
#define WGMMA_F16_TYPES ".f16.f16"
#endif
#if FP8
#define WGMMA_SS_SHAPE(N) "m64n" #N "k32.f32.e4m3.e4m3"
#define WGMMA_SS_IMMEDIATES "p, 1, 1;\n}\n"
#else
#define WGMMA_SS_SHAPE(N) "m64n" #N "k16.f32" WGMMA_F16_TYPES
#define WGMMA_SS_IMMEDIATES "p, 1, 1, 0, 0;\n}\n"
#endif
#define WGMMA_REGS_16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define WGMMA_REGS_32                                                                                   \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WGMMA_REGS_40                                                                                   \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}"
#define WGMMA_REGS_48                                                                                   \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, " \
    "%41, %42, %43, %44, %45, %46, %47}"
#define WGMMA_REGS_64                                                                                   \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, " \
    "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, " \
    "%61, %62, %63}"
#define WGMMA_REGS_96                                                                                   \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, " \
    "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, " \
    "%61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, " \
    "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}"
#define WGMMA_REGS_128                                                                                   \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, " \
    "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, " \
    "%61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, " \
    "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, " \
    "%100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, " \
    "%116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define WGMMA_ACC4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define WGMMA_ACC_N32(j) WGMMA_ACC4(j), WGMMA_ACC4(j + 1), WGMMA_ACC4(j + 2), WGMMA_ACC4(j + 3)
#define WGMMA_ACC_N64(j) WGMMA_ACC_N32(j), WGMMA_ACC_N32(j + 4)
#define WGMMA_ACC_N80(j) WGMMA_ACC_N64(j), WGMMA_ACC4(j + 8), WGMMA_ACC4(j + 9)
#define WGMMA_ACC_N96(j) WGMMA_ACC_N64(j), WGMMA_ACC_N32(j + 8)
#define WGMMA_ACC_N128(j) WGMMA_ACC_N64(j), WGMMA_ACC_N64(j + 8)
#define WGMMA_ACC_N192(j) WGMMA_ACC_N128(j), WGMMA_ACC_N64(j + 16)
#define WGMMA_ACC_N256(j) WGMMA_ACC_N128(j), WGMMA_ACC_N128(j + 16)
// One m64nN k-step, A and B from descriptors: the accumulators are operands 0..N/2-1, the descriptors IA and IB,
// the accumulate flag IP (SCALE_D: "r" for a run-time value, "n" for a compile-time one).
#define WGMMA_SS(N, REGS, ACC, IA, IB, IP, SCALE_D)                                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IP ", 0;\n"                                   \
               "wgmma.mma_async.sync.aligned." WGMMA_SS_SHAPE(N) " " REGS ", %" #IA ", %" #IB ", " \
               WGMMA_SS_IMMEDIATES                                                                  \
               : ACC : "l"(a_desc), "l"(b_desc), SCALE_D)
#define WGMMA_SS_EVERY_N(SCALE_D)                                                                     \
  if constexpr (N == 32) WGMMA_SS(32, WGMMA_REGS_16, WGMMA_ACC_N32(0), 16, 17, 18, SCALE_D);         \
  else if constexpr (N == 64) WGMMA_SS(64, WGMMA_REGS_32, WGMMA_ACC_N64(0), 32, 33, 34, SCALE_D);    \
  else if constexpr (N == 80) WGMMA_SS(80, WGMMA_REGS_40, WGMMA_ACC_N80(0), 40, 41, 42, SCALE_D);    \
  else if constexpr (N == 96) WGMMA_SS(96, WGMMA_REGS_48, WGMMA_ACC_N96(0), 48, 49, 50, SCALE_D);     \
  else if constexpr (N == 128) WGMMA_SS(128, WGMMA_REGS_64, WGMMA_ACC_N128(0), 64, 65, 66, SCALE_D);  \
  else if constexpr (N == 192) WGMMA_SS(192, WGMMA_REGS_96, WGMMA_ACC_N192(0), 96, 97, 98, SCALE_D);  \
  else WGMMA_SS(256, WGMMA_REGS_128, WGMMA_ACC_N256(0), 128, 129, 130, SCALE_D)

// d (64 x N, fp32) = (accumulate ? d : 0) + A (64 x k, smem) * B (k x N, smem, stored N x k), both K-major; one
// 32-byte k-step. kAccumulate >= 0 fixes the flag at compile time; -1 (default) takes it from `accumulate`.
template <int N, int kAccumulate = -1>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t a_desc, uint64_t b_desc, int accumulate = 1) {
  static_assert(N == 32 || N == 64 || N == 80 || N == 96 || N == 128 || N == 192 || N == 256,
                "wgmma_ss: N must be 32, 64, 80, 96, 128, 192 or 256");
  if constexpr (kAccumulate >= 0) {
    WGMMA_SS_EVERY_N("n"(kAccumulate));
  } else {
    WGMMA_SS_EVERY_N("r"(accumulate));
  }
}

// d (64 x N, fp32) += A (64 x 16, registers: the m16k16 A fragment of mma.sync per warp) * B (16 x N, smem,
// MN-major: stored 16 x N with N contiguous, hence the transpose flag 1); 16-bit element types only.
template <int N>
__device__ __forceinline__ void wgmma_rs_b_mn_major(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b_desc) {
  static_assert(N == 64 || N == 128 || N == 256, "wgmma_rs: N must be 64, 128 or 256");
  if constexpr (N == 64) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32" WGMMA_F16_TYPES " " WGMMA_REGS_32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : WGMMA_ACC_N64(0) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(1));
  } else if constexpr (N == 128) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32" WGMMA_F16_TYPES " " WGMMA_REGS_64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WGMMA_ACC_N128(0) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(1));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32" WGMMA_F16_TYPES " " WGMMA_REGS_128
                 ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
                 : WGMMA_ACC_N256(0) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(1));
  }
}

// d (64 x N, fp32) += A (64 x 32 e4m3, registers) * B (32 x N e4m3, smem, K-major: stored N x 32 with the 32 keys
// contiguous; FP8 wgmma has no transpose flag). The A fragment (CuTe's ALayout_64x32, the PTX ISA's m64nNk32 register
// fragment for 8-bit types): register i of lane l in warp w holds row 16 w + l / 4 + 8 (i % 2), columns
// 16 (i / 2) + 4 (l % 4) + {0, 1, 2, 3}, lowest byte first.
template <int N>
__device__ __forceinline__ void wgmma_rs_e4m3(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b_desc) {
  static_assert(N == 64 || N == 128 || N == 256, "wgmma_rs_e4m3: N must be 64, 128 or 256");
  if constexpr (N == 64) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " WGMMA_REGS_32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
                 : WGMMA_ACC_N64(0) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(1));
  } else if constexpr (N == 128) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " WGMMA_REGS_64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
                 : WGMMA_ACC_N128(0) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(1));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 " WGMMA_REGS_128
                 ", {%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
                 : WGMMA_ACC_N256(0) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(1));
  }
}

#undef WGMMA_F16_TYPES
#undef WGMMA_SS_SHAPE
#undef WGMMA_SS_IMMEDIATES
#undef WGMMA_REGS_16
#undef WGMMA_REGS_32
#undef WGMMA_REGS_64
#undef WGMMA_REGS_128
#undef WGMMA_ACC4
#undef WGMMA_ACC_N32
#undef WGMMA_ACC_N64
#undef WGMMA_ACC_N128
#undef WGMMA_ACC_N256
#undef WGMMA_SS
#undef WGMMA_SS_EVERY_N
