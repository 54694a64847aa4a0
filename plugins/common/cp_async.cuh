// cp.async (sm_80+): asynchronous 16-byte global -> shared copies, committed and awaited in groups.
#pragma once
#include <stdint.h>

// 16 bytes global -> shared; src_bytes < 16 fills the rest with zeros (0: all zeros, e.g. rows past the end).
// L1 = true caches the source in L1 (.ca: data the CTA reads again soon), else L2 only (.cg).
template <bool L1 = false>
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  if constexpr (L1)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most kNewest of this thread's most recent cp.async groups are still in flight.
template <int kNewest>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kNewest) : "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }
// An arrival on the mbarrier at shared address `bar` once every earlier cp.async copy of this thread has landed
// (.noinc: the arrival counts toward the barrier's expected count, so initialize it with one per copying thread).
// The copying thread does not wait: a producer warp keeps issuing while its copies are in flight.
__device__ __forceinline__ void cp_async_arrive_on(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
