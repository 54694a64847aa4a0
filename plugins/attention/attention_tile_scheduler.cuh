// Which (batch, head, query block) a thread block computes. grid = (batch * heads_q, query blocks): the launch
// order walks x fastest, so every head's LAST query block (under causal masking the one with the most keys) is
// dispatched first and the short blocks fill the tail of the wave.
#pragma once
#include "attention_config.cuh"

struct AttentionTile {
  int batch, head, m_block;
};

__device__ __forceinline__ AttentionTile schedule_tile(int heads_q) {
  AttentionTile t;
  t.batch = blockIdx.x / heads_q;
  t.head = blockIdx.x - t.batch * heads_q;
  t.m_block = gridDim.y - 1 - blockIdx.y;
  return t;
}
