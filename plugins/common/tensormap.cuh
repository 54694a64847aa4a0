// Tensor maps (CUtensorMap, 128 bytes) written on the device (sm_90a, PTX ISA 8.3): every field of a 2D tile-mode map
// by tensormap.replace, in shared or global memory, and the proxy fences that make a map written by generic-proxy
// writes usable by the tensor-map proxy (the TMA unit's descriptor fetch). Why: a kernel whose ABI has no place for a
// host-encoded map (pointers and scalars only) can still use cp.async.bulk.tensor with a map it builds itself.
// Fields not replaceable here (L2 promotion) keep the object's bits: a zeroed object gives no L2 promotion.
#pragma once
#include <stdint.h>

// The SM this thread runs on (%smid: below %nsmid, not necessarily below the SM count). Stable while the CTA runs.
__device__ __forceinline__ uint32_t sm_id() {
  uint32_t id;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(id));
  return id;
}

// Every field of a 2D tile-mode map at `map` (state space SPACE): element type ELEM (CUtensorMapDataType's value),
// swizzle SWIZZLE (CUtensorMapSwizzle's), no interleave, zero fill; the tensor at `base` of dim0 (inner) x dim1
// elements, rows `stride1` bytes apart, boxes of box0 x box1 elements, element strides 1. Rank is written as rank - 1.
#define TENSORMAP_WRITE_2D(NAME, SPACE, ADDR_TYPE, ADDR_OPERAND)                                                     \
  template <int ELEM, int SWIZZLE>                                                                                  \
  __device__ __forceinline__ void NAME(ADDR_TYPE map, const void* base, uint32_t dim0, uint32_t dim1,              \
                                       uint64_t stride1, uint32_t box0, uint32_t box1) {                           \
    asm volatile(                                                                                                   \
        "tensormap.replace.tile.global_address." SPACE ".b1024.b64 [%0], %1;\n"                                     \
        "tensormap.replace.tile.rank." SPACE ".b1024.b32 [%0], 1;\n"                                                \
        "tensormap.replace.tile.global_dim." SPACE ".b1024.b32 [%0], 0, %2;\n"                                      \
        "tensormap.replace.tile.global_dim." SPACE ".b1024.b32 [%0], 1, %3;\n"                                      \
        "tensormap.replace.tile.global_stride." SPACE ".b1024.b64 [%0], 0, %4;\n"                                   \
        "tensormap.replace.tile.box_dim." SPACE ".b1024.b32 [%0], 0, %5;\n"                                         \
        "tensormap.replace.tile.box_dim." SPACE ".b1024.b32 [%0], 1, %6;\n"                                         \
        "tensormap.replace.tile.element_stride." SPACE ".b1024.b32 [%0], 0, 1;\n"                                   \
        "tensormap.replace.tile.element_stride." SPACE ".b1024.b32 [%0], 1, 1;\n"                                   \
        "tensormap.replace.tile.elemtype." SPACE ".b1024.b32 [%0], %7;\n"                                           \
        "tensormap.replace.tile.interleave_layout." SPACE ".b1024.b32 [%0], 0;\n"                                   \
        "tensormap.replace.tile.swizzle_mode." SPACE ".b1024.b32 [%0], %8;\n"                                       \
        "tensormap.replace.tile.fill_mode." SPACE ".b1024.b32 [%0], 0;\n" ::ADDR_OPERAND,                            \
        "l"(base), "r"(dim0), "r"(dim1), "l"(stride1), "r"(box0), "r"(box1), "n"(ELEM), "n"(SWIZZLE)               \
        : "memory");                                                                                                \
  }
// in place in global memory (then tensormap_release_gpu before the map is used)
TENSORMAP_WRITE_2D(tensormap_write_2d_global, "global", void*, "l"(__cvta_generic_to_global(map)))
// in this CTA's shared memory at a shared address (then tensormap_copy_release_gpu to global memory)
TENSORMAP_WRITE_2D(tensormap_write_2d_shared, "shared::cta", uint32_t, "r"(map))
#undef TENSORMAP_WRITE_2D

// Order this thread's earlier generic-proxy writes of tensor maps (tensormap.replace in global memory) before later
// tensor-map-proxy uses at GPU scope.
__device__ __forceinline__ void tensormap_release_gpu() {
  asm volatile("fence.proxy.tensormap::generic.release.gpu;\n" ::: "memory");
}

// Copy the 128-byte map at the shared address `src` to the global `dst` with release to the tensor-map proxy at GPU
// scope. Warp-collective (.sync.aligned): every lane of a converged warp calls it with the same operands.
__device__ __forceinline__ void tensormap_copy_release_gpu(void* dst, uint32_t src) {
  asm volatile("tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;\n"
               ::"l"(__cvta_generic_to_global(dst)), "r"(src) : "memory");
}

// Acquire the map at the global `map` for this thread's later tensor copies: the TMA unit fetches the map as released,
// not a copy it cached from an earlier use of the same address (an earlier launch's map in the same slot).
__device__ __forceinline__ void tensormap_acquire_gpu(const void* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(map) : "memory");
}
