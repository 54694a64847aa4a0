// Values ptxas must take as unknown where they are used, through volatile asm it cannot hoist, fold or share with an
// earlier copy: for warpgroups at the edge of their registers (setmaxnreg), where ptxas's choice of what to keep live
// across a loop decides between spilling, rebuilding values inside the loop, and neither.
#pragma once
#include <stdint.h>

// `x` as a value computed here: what derives from it is computed after this point (e.g. once per outer-loop trip,
// next to the inner loop that uses it) rather than hoisted out of the outer loop and rebuilt inside the inner one.
__device__ __forceinline__ uint32_t opaque_u32(uint32_t x) {
  asm volatile("mov.b32 %0, %0;\n" : "+r"(x));
  return x;
}

__device__ __forceinline__ uint64_t opaque_u64(uint64_t x) {
  asm volatile("mov.b64 %0, %0;\n" : "+l"(x));
  return x;
}

// `x`, the same in every lane of the warp, as a warp shuffle of lane 0's, inside the loop that uses it: ptxas drops
// opaque_u32's mov before it decides what to keep live, a shuffle of a uniform value only after (no instruction is
// left), so what derives from `x` is formed there and kept in (uniform) registers rather than rebuilt from the kernel
// parameter at every use. All 32 lanes must run it. Use: the persistent loader's K/V strides (attention_sm90.cu).
__device__ __forceinline__ int warp_uniform_kept(int x) { return __shfl_sync(0xffffffffu, x, 0); }
