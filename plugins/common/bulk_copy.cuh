// cp.async.bulk (sm_90): one global -> shared copy of a contiguous run by the SM's TMA unit (no tensor map: a plain
// byte range), counted as transaction bytes (complete_tx) on an mbarrier of each destination CTA. One instruction
// per run where cp.async takes one per 16 bytes and thread; the run lands unswizzled.
#pragma once
#include <stdint.h>

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from `src` to this CTA's shared address `dst`, counted on
// the mbarrier `bar` of this CTA.
__device__ __forceinline__ void bulk_copy_to_shared(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// The same run into every CTA of the cluster whose rank is a bit of `cta_mask`, at the CTA-relative offset of `dst`,
// counted on the mbarrier at the CTA-relative offset of `bar` in each of them: L2 is read once for all of them.
__device__ __forceinline__ void bulk_copy_to_cluster(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                                     uint16_t cta_mask) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, "
               "[%3], %4;\n" ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "h"(cta_mask) : "memory");
}
