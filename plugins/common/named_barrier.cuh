// Named CTA barriers (bar.sync / bar.arrive with an id and a thread count): a subset of the block's warps meets
// without stopping the others; bar.arrive signals without waiting (producer/consumer hand-offs, ping-pong turns).
// Id 0 is __syncthreads'; users take ids 1-15.
#pragma once

// Wait until `threads` threads (a multiple of 32, counting this warp's) have arrived at barrier `id`.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Count this warp's arrival at barrier `id` (completing at `threads` arrivals) and go on.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
