// mbarrier (shared-memory transaction barrier, sm_80+; parity waits sm_90) wrappers: init, arrive, parity wait.
// A phase completes when `count` arrivals have been made; waiters name the phase by its parity (0, 1, 0, ...).
#pragma once
#include <stdint.h>

// Initialize the mbarrier at shared address `bar` to expect `count` arrivals per phase. The block must sync
// (__syncthreads) before any other thread uses it.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// One arrival (release semantics at CTA scope: this thread's earlier writes are visible to a waiter that sees the
// phase complete).
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Block until the phase of parity `parity` has completed (acquire semantics). A fresh barrier is in phase 0, so
// waiting for parity 1 returns at once: producers wait for "empty" with (round & 1) ^ 1.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// Thread-block clusters (sm_90): make this CTA's mbarrier inits visible to the cluster's other CTAs (they may arrive on
// them or signal transactions to them after the next cluster barrier).
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The current phase of `bar` also waits for `bytes` more transaction bytes (complete_tx from st.async or bulk copies,
// possibly from another CTA of the cluster; those may come before this call, the phase cannot complete without it).
__device__ __forceinline__ void mbarrier_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// One arrival that also makes the current phase wait for `bytes` more transaction bytes (expect_tx then arrive, one
// operation): the producer thread of bulk copies counted on `bar`, before or after it issues them.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// One arrival on an mbarrier of another CTA of the cluster (`remote_bar`: its shared::cluster address, from mapa).
// Release at CTA scope (as CUTLASS's consumer release of a multicast stage): enough to order this thread's completed
// reads of its own CTA's shared memory before the other CTA's writes there; .release.cluster would add a GPU-wide
// MEMBAR per arrival.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}
