"""The CUDA headers both ops' kernels include: each PTX instruction wrapped once (cp.async, ldmatrix, mma.sync, wgmma,
cluster shared memory), and the element type. The launcher puts this folder's parent on nvcc's include path, so a
kernel writes ``#include "common/wgmma.cuh"``."""
from pathlib import Path

INCLUDE_ROOT = Path(__file__).resolve().parent.parent  # the folder whose "common/..." the kernels include
