"""What the launch plans and the compiler need to know about a GPU target (``sm_80``, ``sm_90a``, ...), in one place:
its number, the dynamic shared memory one block may opt into, and which targets have wgmma and thread-block clusters.
"""
from __future__ import annotations

# Targets named in messages (compile accepts any sm_<digits>[a|f]).
ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120a")

# Dynamic shared memory per block with the opt-in (cuFuncSetAttribute), bytes, from the CUDA C++ Programming Guide's
# "Technical Specifications per Compute Capability": 163 KB (8.0, 8.7), 99 KB (8.6, 8.9, 12.x), 227 KB (9.0, 10.0).
SHARED_LIMIT = {"sm_80": 166912, "sm_86": 101376, "sm_87": 166912, "sm_89": 101376, "sm_90": 232448, "sm_90a": 232448,
                "sm_100": 232448, "sm_100a": 232448, "sm_120": 101376, "sm_120a": 101376}

WGMMA_ARCHES = ("sm_90a",)  # warpgroup MMA needs the arch-specific sm_90a target
CLUSTER_ARCH = 90           # thread-block clusters: sm_90 and newer

# SMs of an H100 / H200 SXM, the GPUs the plans' grid rules were measured on (an H100 PCIe has 114: its grids are the
# same, only less evenly spread over waves).
SM_COUNT = 132


def arch_number(arch: str) -> int:
    """89 for ``sm_89``, 90 for ``sm_90a``; 0 when ``arch`` is not an ``sm_<digits>`` name."""
    digits = arch.removeprefix("sm_").rstrip("abf")
    return int(digits) if digits.isdigit() else 0


def shared_limit(arch: str) -> int:
    """Dynamic shared memory a block may use on ``arch``. An arch not in the table gets the smallest limit: a plan
    that fits it fits every GPU listed, where a larger guess could plan a tile the GPU refuses at launch."""
    return SHARED_LIMIT.get(arch, min(SHARED_LIMIT.values()))
