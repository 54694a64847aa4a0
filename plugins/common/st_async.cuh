// st.async (sm_90): a store into the shared memory of another CTA of the cluster whose arrival that CTA's mbarrier
// counts as transaction bytes (complete_tx), so the receiver waits on its own barrier instead of a cluster barrier.
#pragma once
#include <stdint.h>

// 16 bytes to `remote` (a 16-byte aligned shared::cluster address), 16 transaction bytes on `remote_bar` (an mbarrier
// in the same CTA as `remote`).
__device__ __forceinline__ void st_async_16(uint32_t remote, uint4 v, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n"
               ::"r"(remote), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar) : "memory");
}
