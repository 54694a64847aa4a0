"""Times of GPU calls from CUDA-graph replays: one call alone (``time_ms``) or all the columns of one benchmark point
(``time_columns``). The H100 runs these kernels at its power cap, and for ~100-400 ms after a switch a kernel runs at
the clock the previous load left (job attn-ws-1 of session 10, attention_h100_s10_clock_trace.md), so how a point's
columns are warmed decides what a 2k column measures."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

REPS_IN_GRAPH = 10


@dataclass(frozen=True)
class Method:
    """How the columns of one point are timed (``replays`` event-timed replays of a REPS_IN_GRAPH-call graph a column
    and round, the median over all rounds):
    - sequential: each column captured and timed right after the one before (the tables before session 10; a
      column then runs at the clock its predecessor left: 2k columns ran 5-15% apart);
    - sustained: each column replayed alone for ``warmup_s`` right before its replays, so it is timed at the clock
      its own power draw settles at; ``rounds`` passes, every other one in reverse order."""
    kind: str
    rounds: int
    replays: int
    warmup_s: float

    def describe(self) -> str:
        graph = f"{self.replays} replays of a {REPS_IN_GRAPH}-call CUDA graph"
        if self.kind == "sequential":
            return f"timing: columns one after another, each {graph} right after its capture, median"
        return (f"timing: each column replayed alone for {self.warmup_s:g} s right before {graph}, in {self.rounds} "
                f"passes over the point's columns (every other pass in reverse order); median over all replays")


METHODS = {"sequential": Method("sequential", 1, 15, 0.0), "sustained": Method("sustained", 2, 8, 0.3)}


@dataclass(frozen=True)
class Timing:
    ms: float  # median milliseconds a call
    mhz: float  # median SM clock sampled during the replays (nan without NVML)


def graph_of_calls(fn, calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` back-to-back ``fn()`` calls, captured after a warm-up and replayed once, so what
    the timing and energy benchmarks replay never includes compiling, loading or autotuning."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def replays(graph, count: int | None = None, seconds: float | None = None, sample=None) -> list[tuple]:
    """Event-timed replays of ``graph`` one after another, ``count`` of them or for ``seconds``: per replay (seconds
    since the first, ms a call, *``sample()``), ``sample`` being called while the replay runs (e.g. NVML readings)."""
    out, t0 = [], time.perf_counter()
    while (len(out) < count) if count is not None else (time.perf_counter() - t0 < seconds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        t, extra = time.perf_counter() - t0, sample() if sample else ()
        end.record()
        end.synchronize()
        out.append((t, start.elapsed_time(end) / REPS_IN_GRAPH, *extra))
    return out


def time_ms(fn, count: int = 15) -> float:
    """Median milliseconds of one ``fn()`` call, from replays of a CUDA graph holding REPS_IN_GRAPH calls."""
    return statistics.median(r[1] for r in replays(graph_of_calls(fn, REPS_IN_GRAPH), count))


def time_columns(fns: dict, method: Method, nvml=None) -> dict[str, Timing]:
    """Timing of one call of each of ``fns`` (column name -> closure), all timed by ``method``; with ``nvml`` the
    median SM clock sampled during each column's replays."""
    sample = (lambda: (nvml.sm_clock_mhz(),)) if nvml else (lambda: (float("nan"),))
    samples = {name: [] for name in fns}
    if method.kind == "sequential":
        for name, fn in fns.items():
            samples[name] = replays(graph_of_calls(fn, REPS_IN_GRAPH), method.rounds * method.replays, sample=sample)
    else:
        graphs = {name: graph_of_calls(fn, REPS_IN_GRAPH) for name, fn in fns.items()}
        for r in range(method.rounds):
            for name in list(graphs) if r % 2 == 0 else list(graphs)[::-1]:
                replays(graphs[name], seconds=method.warmup_s)
                samples[name] += replays(graphs[name], method.replays, sample=sample)
    return {name: Timing(statistics.median(r[1] for r in s), statistics.median(r[2] for r in s))
            for name, s in samples.items()}
