// Output store of the warp-specialized Hopper kernel: attention_epilogue.cuh's store, by the kMmaThreads MMA
// threads (thread `tid` counted from the first MMA thread) instead of the whole block.
#pragma once
#include "attention_epilogue.cuh"

__device__ __forceinline__ void store_output_by_mma_threads(elem_t* out, const elem_t* sO, int64_t stride, int m0,
                                                            int len_q, int tid) {
  constexpr int kPerThread = kBlockM * kChunksPerRow / kThreads;  // kThreads: the MMA threads
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = tid + i * kThreads;
    const int row = idx / kChunksPerRow;
    const int chunk = idx % kChunksPerRow;
    if (m0 + row < len_q)
      *reinterpret_cast<uint4*>(out + (m0 + row) * stride + chunk * 8) =
          *reinterpret_cast<const uint4*>(sO + row * kRowPitch + chunk * 8);
  }
}
