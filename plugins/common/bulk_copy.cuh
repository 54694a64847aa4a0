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
