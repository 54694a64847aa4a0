// prefetch.global.L2 (sm_80+): ask L2 to fetch the 128-byte line holding an address from DRAM, with no register,
// shared memory or wait involved. Decode streams K/V through a few shared-memory stages; prefetching tiles further
// ahead into L2 keeps more DRAM requests in flight than the stages hold (NOTES.md, attention decode session 7).
#pragma once

__device__ __forceinline__ void prefetch_l2(const void* ptr) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(ptr)); }
