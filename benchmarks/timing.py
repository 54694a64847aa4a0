"""Times of GPU calls from CUDA-graph replays: one call alone (``time_ms``) or all the columns of one benchmark point
under equal conditions (``time_columns``), since on a power-capped GPU a column's time depends on what ran before it."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

REPS_IN_GRAPH = 10


@dataclass(frozen=True)
class Method:
    """How the columns of one point are timed: ``rounds`` rounds of ``replays`` graph replays a column, after every
    column's graph has been replayed for ``warmup_s`` seconds, the column order rotated by one each round; or, with
    ``interleaved`` False, each column captured and replayed ``rounds * replays`` times right after the one before
    (the method of every table before session 10, whose first-timed column ran low at 2k)."""
    interleaved: bool
    rounds: int
    replays: int
    warmup_s: float

    def describe(self) -> str:
        if not self.interleaved:
            return (f"timing: columns one after another, each {self.rounds * self.replays} replays of a "
                    f"{REPS_IN_GRAPH}-call CUDA graph right after its capture, median")
        return (f"timing: every column of a point replayed {self.warmup_s:g} s (interleaved) before timing, then "
                f"{self.rounds} rounds of {self.replays} replays of a {REPS_IN_GRAPH}-call CUDA graph a column, the "
                f"column order rotated each round; median over all replays")


METHODS = {"sequential": Method(False, 1, 15, 0.0), "interleaved": Method(True, 5, 3, 0.5)}


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


def timed_replays(graph, replays: int, nvml=None) -> list[tuple[float, float]]:
    """(ms a call, SM MHz sampled while the replay runs) of each of ``replays`` event-timed replays of ``graph``."""
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        mhz = nvml.sm_clock_mhz() if nvml else float("nan")
        end.record()
        end.synchronize()
        samples.append((start.elapsed_time(end) / REPS_IN_GRAPH, mhz))
    return samples


def time_ms(fn, replays: int = 15) -> float:
    """Median milliseconds of one ``fn()`` call, from replays of a CUDA graph holding REPS_IN_GRAPH calls."""
    return statistics.median(ms for ms, _ in timed_replays(graph_of_calls(fn, REPS_IN_GRAPH), replays))


def time_columns(fns: dict, method: Method, nvml=None) -> dict[str, Timing]:
    """Timing of one call of each of ``fns`` (column name -> closure), all timed by ``method``."""
    samples = {name: [] for name in fns}
    if not method.interleaved:
        for name, fn in fns.items():
            samples[name] = timed_replays(graph_of_calls(fn, REPS_IN_GRAPH), method.rounds * method.replays, nvml)
    else:
        graphs = {name: graph_of_calls(fn, REPS_IN_GRAPH) for name, fn in fns.items()}
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < method.warmup_s:
            for graph in graphs.values():
                graph.replay()
            torch.cuda.synchronize()
        names = list(graphs)
        for r in range(method.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                samples[name] += timed_replays(graphs[name], method.replays, nvml)
    return {name: Timing(statistics.median(ms for ms, _ in s), statistics.median(mhz for _, mhz in s))
            for name, s in samples.items()}
