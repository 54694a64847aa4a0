// Warpgroup register reallocation (setmaxnreg, sm_90a): a warp-specialized kernel hands the registers its
// load warpgroup does not need to its MMA warpgroups. Every warp of a warpgroup executes the same call.
// Effective only when the kernel has a register cap at entry (__launch_bounds__(threads, 1)); ptxas warns
// (C7508) when it ignores one.
#pragma once

template <int kRegisters>
__device__ __forceinline__ void warpgroup_registers_increase() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg takes 24..256, step 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

template <int kRegisters>
__device__ __forceinline__ void warpgroup_registers_decrease() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg takes 24..256, step 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
