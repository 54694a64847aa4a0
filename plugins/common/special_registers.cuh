// PTX special registers read where they are used. CUDA's gridDim is an ordinary value to ptxas, which may keep it
// in a register for a whole loop; a warpgroup left with 24-40 registers (setmaxnreg) then spills it. Reading
// %nctaid through a volatile asm makes each use a fresh S2R instead.
#pragma once
#include <stdint.h>

// gridDim.x, read anew at each call.
__device__ __forceinline__ int grid_dim_x() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%nctaid.x;\n" : "=r"(n));
  return static_cast<int>(n);
}
