// Shared-memory addresses as PTX's shared-state-space instructions take them (32-bit offsets).
#pragma once
#include <stdint.h>

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
