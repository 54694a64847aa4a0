// Which (batch, head, query block) a thread block computes. grid = (query blocks, heads_q, batch): the launch
// order walks x fastest, so the blocks running at one time are mostly query blocks of the SAME head and share its
// K/V tiles in L2 (with heads fastest, each of ~2 blocks per SM would stream its own head's K/V from HBM). Within a
// head the LAST query block (under causal masking the one with the most keys) is dispatched first, so the short
// blocks fill the tail of the wave. With KV_SPLIT > 1 the KV_SPLIT CTAs of a query block are adjacent in x (one
// thread-block cluster) and split its keys.
#pragma once
#include "attention_config.cuh"

struct AttentionTile {
  int batch, head, m_block;
  int split;  // with KV_SPLIT > 1: this CTA's share of the keys (its rank in the cluster along x)
};

__device__ __forceinline__ AttentionTile schedule_tile() {
  AttentionTile t;
  t.m_block = gridDim.x / KV_SPLIT - 1 - blockIdx.x / KV_SPLIT;
  t.split = blockIdx.x % KV_SPLIT;
  t.head = blockIdx.y;
  t.batch = blockIdx.z;
  return t;
}
