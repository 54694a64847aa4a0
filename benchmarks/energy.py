"""Energy per call of a GPU kernel under sustained back-to-back load: NVML's total-energy counter (mJ) around many
CUDA-graph replays, with the SM clock and power sampled between them. The replay grids run at the H100's power cap,
where time follows energy a call more than cycles a call, so a kernel change is judged by both."""
from __future__ import annotations

import statistics
import time

import torch

from nvml_lib import Nvml
from timing import graph_of_calls


def sustained(fn, nvml: Nvml, seconds: float = 1.5, calls_in_graph: int = 20) -> dict:
    """Replay a CUDA graph of ``calls_in_graph`` ``fn()`` calls back to back for about ``seconds``: milliseconds and
    millijoules a call, mean power (energy / time) and the median sampled SM clock."""
    graph = graph_of_calls(fn, calls_in_graph)
    clocks, replays, queued = [], 0, []
    e0, t0 = nvml.energy_mj(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        graph.replay()
        replays += 1
        queued.append(torch.cuda.Event())
        queued[-1].record()
        if len(queued) > 2:  # two replays stay queued: the GPU never idles, the host never runs far ahead
            queued.pop(0).synchronize()
            clocks.append(nvml.sm_clock_mhz())
    torch.cuda.synchronize()
    elapsed, energy = time.perf_counter() - t0, nvml.energy_mj() - e0
    calls = replays * calls_in_graph
    return {"ms": elapsed * 1e3 / calls, "mj": energy / calls, "w": energy / 1e3 / elapsed,
            "mhz": statistics.median(clocks)}
