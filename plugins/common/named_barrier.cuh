// Named CTA barriers (bar.sync / bar.arrive with an id and a thread count): a subset of the block's warps meets
// without stopping the others; bar.arrive signals without waiting (producer/consumer hand-offs, ping-pong turns).
// Id 0 is __syncthreads'; users take ids 1-15. The thread count is a compile-time immediate (a multiple of 32,
// counting this warp's threads).
#pragma once

// Wait until kThreads threads have arrived at barrier `id`.
template <int kThreads>
__device__ __forceinline__ void named_barrier_sync(int id) {
  static_assert(kThreads % 32 == 0, "named barriers count whole warps");
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// Count this warp's arrival at barrier `id` (completing at kThreads arrivals) and go on.
template <int kThreads>
__device__ __forceinline__ void named_barrier_arrive(int id) {
  static_assert(kThreads % 32 == 0, "named barriers count whole warps");
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
