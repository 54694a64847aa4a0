// cp.async.bulk (sm_90): one global -> shared copy of a contiguous run by the SM's TMA unit (no tensor map: a plain
// byte range), counted as transaction bytes (complete_tx) on an mbarrier of the destination CTA. One instruction per
// run where cp.async takes one per 16 bytes and thread; the run lands unswizzled. Its operands are warp-uniform
// (SASS UBLKCP takes uniform registers): per-lane operands make ptxas loop over the lanes one at a time.
#pragma once
#include <stdint.h>

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from `src` to this CTA's shared address `dst`, counted on
// the mbarrier `bar` of this CTA.
__device__ __forceinline__ void bulk_copy_to_shared(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// cp.async.bulk.tensor (sm_90), 2D tile mode: the box at element coordinates (c0 inner, c1 outer) of the tensor map at
// the global address `map` (a CUtensorMap: its box, strides and element type) into this CTA's shared address `dst`,
// counted as the box's bytes on the mbarrier `bar`. One instruction moves a box of rows that lie apart in memory.
__device__ __forceinline__ void bulk_tensor_2d_to_shared(uint32_t dst, const void* map, int c0, int c1, uint32_t bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
               ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
