// elect.sync (sm_90): one lane of the converged warp is chosen. Unlike `lane == 0`, ptxas knows that exactly one lane
// runs the branch, so warp-uniform operands stay in uniform registers there (bulk copies, TMA) instead of a loop over
// the active lanes (ELECT, R2UR, BRA.U.ANY a copy).
#pragma once
#include <stdint.h>

__device__ __forceinline__ bool elect_one_sync() {
  uint32_t elected;
  asm volatile("{\n.reg .pred p;\nelect.sync _|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n" : "=r"(elected));
  return elected != 0;
}
