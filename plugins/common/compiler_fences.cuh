// Values ptxas must take as unknown where they are used, through volatile asm that it cannot hoist, fold or share
// with an earlier copy. For warpgroups at the edge of their registers (setmaxnreg), where ptxas's choice of what to
// keep live across a loop decides between spilling, rebuilding values inside the loop, and neither.
#pragma once
#include <stdint.h>

// gridDim.x, read anew at each call (%nctaid.x): ptxas kept gridDim.x in a register for a whole loop and spilled it
// in a 24-40-register warpgroup.
__device__ __forceinline__ int grid_dim_x() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%nctaid.x;\n" : "=r"(n));
  return static_cast<int>(n);
}

// `x` as a value computed here: what derives from it is computed after this point (e.g. once per outer-loop trip,
// next to the inner loop that uses it) rather than hoisted out of the outer loop and kept live across it.
__device__ __forceinline__ uint32_t opaque_u32(uint32_t x) {
  asm volatile("mov.b32 %0, %0;\n" : "+r"(x));
  return x;
}
