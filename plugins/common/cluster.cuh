// Thread-block clusters (sm_90+): the cluster-wide barrier and distributed shared memory (DSMEM), i.e. reading a
// variable in another CTA of the cluster through its shared::cluster address.
#pragma once
#include "smem.cuh"

// Every thread of every CTA in the cluster arrives (its earlier shared-memory writes released) and waits.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The same barrier without the release: for a CTA that must not leave (freeing its shared memory) while others still
// read it through DSMEM, when nothing it wrote needs ordering (their reads completed before they arrived: each value
// was used). The release would first wait for this CTA's global stores (MEMBAR.ALL.GPU in SASS).
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}

// The two halves of a cluster barrier: every thread arrives (relaxed: nothing it wrote is ordered by it) and waits for
// that phase later, between them doing work that needs no other CTA, e.g. arriving at kernel start so that a later wait
// proves every CTA of the cluster has started (its shared memory may be written through DSMEM) at no cost.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }

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

// Four consecutive floats at a 16-byte aligned shared::cluster address, one access.
__device__ __forceinline__ float4 load_cluster4(uint32_t address) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(address) : "memory");
  return v;
}

// Four consecutive floats to a 16-byte aligned shared::cluster address (another CTA's shared memory), one access; the
// writer's next cluster_sync (its release) makes them visible to that CTA.
__device__ __forceinline__ void store_cluster4(uint32_t address, float4 v) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n"
               :: "r"(address), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
