// Thread-block clusters (sm_90+): the cluster-wide barrier and distributed shared memory (DSMEM), i.e. reading a
// variable in another CTA of the cluster through its shared::cluster address.
#pragma once
#include "smem.cuh"

// Every thread of every CTA in the cluster arrives (its earlier shared-memory writes released) and waits.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The shared::cluster address of the same variable in the cluster's CTA ``rank``.
__device__ __forceinline__ uint32_t cluster_address(const void* local, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(local)), "r"(rank));
  return remote;
}

__device__ __forceinline__ float load_cluster(uint32_t address) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(address) : "memory");
  return v;
}
