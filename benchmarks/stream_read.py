"""The read ceiling of decode-sized K/V (issue 10 item 2, session 10): a streaming read of ours (benchmarks/stream_read.cu:
a ring of shared-memory stages loaded by cp.async or cp.async.bulk, as the decode kernel loads, or by 2D tensor copies) over the 64 MB K/V of
head dim 64 x 32k keys x 8 K/V heads, by CTA count (64: batch 1's 8 K/V heads x 8-CTA clusters; 132: one an SM),
layout (the decode kernel's 128-byte rows of a head, or one contiguous run a CTA), copy kind and bytes in flight a
CTA; beside a torch sum of the same bytes, the decode kernel's plan on those K/V and the 1 GiB read. Then the same
over 8-256 MB (fixed cost and asymptotic rate by a line fit above L2), an empty launch, and the 64 MB read from four
buffers in turn (nothing left in L2 by the previous call). Timing as benchmarks/attention.py (CUDA-graph replays of
10 back-to-back calls, median); every stream run's checksum is checked against torch's.

    python benchmarks/stream_read.py --out benchmarks/results/stream_read_h100.md
    python benchmarks/stream_read.py --small     # a few small checked runs (for compute-sanitizer)
    python benchmarks/stream_read.py --tensor-maps   # only the 2D tensor-copy columns and their 64-CTA references
    python benchmarks/stream_read.py --device-maps   # tensor maps written on the device: cost, and the 64 MB columns
"""
from __future__ import annotations

import argparse
import ctypes
from pathlib import Path
from typing import NamedTuple

import torch

from attention import ceilings, ours, read_bandwidth, time_ms, versions, write_report
from attention_decode import DECODE_TUNING, decode_plans
from trt_fusedattn.launcher import device_arch, launch, precompile
from trt_fusedattn.launcher.plan import LaunchPlan

SOURCE = Path(__file__).resolve().parent / "stream_read.cu"
HEADS, ROW_BYTES, KEYS = 8, 128, 32768  # head dim 64 bf16 K/V of batch 1 x 32k keys: 64 MB with V
SHARED_LIMIT = 227 * 1024
ONE_CTA_AN_SM = 116 * 1024  # two CTAs of it (+ 1 KB reserved each) exceed an H100 / H200 SM's 228 KB


class Stream(NamedTuple):
    """One streaming-read configuration: copy kind, layout, CTAs, cluster, threads, keys a tile, ring stages."""
    bulk: int        # 0: cp.async 16 bytes a thread, 1: cp.async.bulk (TMA unit) of runs, 2: 2D tensor copies
    heads: int       # HEADS 8: the decode kernel's rows (128 bytes of one head, 1 KB apart); 1: contiguous runs
    ctas: int
    cluster: int
    threads: int
    block_n: int
    stages: int
    device_map: int = 0  # tensor copies' maps: 0 host-encoded, 1 written on the device in place, 2 built in shared
    l2_promotion: int = 3  # host-encoded maps' CUtensorMapL2promotion (3: 256 B; the device writes none: 0)

    @property
    def in_flight_kb(self) -> int:
        return (self.stages - 1) * 2 * self.block_n * ROW_BYTES // 1024

    def label(self) -> str:
        maps = ("tensor map", "device map (in place)", "device map (shared, copied)")[self.device_map]
        kind = (maps if self.bulk == 2 else "bulk") if self.bulk else f"cp.async x{self.threads}"
        layout = "decode rows" if self.heads > 1 else "contiguous"
        if self.bulk == 2 and not self.device_map and self.l2_promotion != 3:
            kind += ", no L2 promotion"
        return (f"{kind}, {layout}, {self.ctas} CTAs, cluster {self.cluster}, {self.block_n}-row tiles x "
                f"{self.stages} stages ({self.in_flight_kb} KB in flight a CTA)")

    def plan(self, keys_per_head: int) -> LaunchPlan:
        """The launch over K/V of ``keys_per_head`` keys x HEADS heads (viewed as ``self.heads`` heads)."""
        split = self.ctas // self.heads
        keys = keys_per_head * HEADS // self.heads
        shared = self.stages * (2 * self.block_n * ROW_BYTES + 8) + 4  # stages, their mbarriers, the block's sum
        if self.device_map:  # (+ the maps' build area) above half an SM's: one CTA an SM owns its per-SM map slot
            shared = max(shared + 256 * (self.device_map == 2), ONE_CTA_AN_SM)
        if self.ctas % self.heads or self.ctas % self.cluster or shared > SHARED_LIMIT:
            raise ValueError(f"{self.label()}: CTAs not a multiple of heads and cluster, or {shared} B of stages")
        defines = dict(THREADS=self.threads, STAGES=self.stages, BLOCK_N=self.block_n, ROW_BYTES=ROW_BYTES,
                       HEADS=self.heads, SPLIT=split, CLUSTER=self.cluster, BULK=self.bulk, DEVICE_MAP=self.device_map)
        return LaunchPlan(SOURCE, "stream_read", defines, (self.ctas, 1, 1), (self.threads, 1, 1), shared, (keys,))


def configs() -> list[Stream]:
    """The 64 MB columns: bytes in flight a CTA on the decode grid (64 CTAs in 8-CTA clusters, decode rows), then
    contiguous runs on 64, 132 and 264 CTAs, and the decode rows on 128 CTAs."""
    c = []
    for bulk in (0, 1):
        depths = ((64, 3), (64, 5), (64, 7), (64, 9), (64, 13), (128, 3), (128, 5), (128, 7), (32, 9))
        c += [Stream(bulk, HEADS, 64, 8, 128, n, s) for n, s in depths]
        c += [Stream(bulk, HEADS, 64, 1, 128, 64, 9), Stream(bulk, HEADS, 128, 1, 128, 64, 5),
              Stream(bulk, HEADS, 128, 1, 128, 64, 9), Stream(bulk, HEADS, 128, 8, 128, 64, 5)]
        c += [Stream(bulk, 1, 64, 1, 128, n, s) for n, s in ((64, 5), (64, 9), (64, 13), (128, 7))]
        c += [Stream(bulk, 1, 132, 1, 128, n, s) for n, s in ((64, 3), (64, 5), (64, 9), (128, 5))]
        c += [Stream(bulk, 1, 264, 1, 128, 64, s) for s in (3, 5)]
    c += [Stream(0, HEADS, 64, 8, 256, 64, 9), Stream(0, 1, 132, 1, 256, 64, 5)]
    # session 10, second run: more threads issuing cp.async on the decode grid (256 of them were 1.5x 128's rate in
    # attn-decode-2, at any depth), and bulk copies of 32 KB on 64 CTAs (16 KB ones ran 29.5 us, 8 KB ones 38)
    c += [Stream(0, HEADS, 64, 8, t, n, s) for t, n, s in ((512, 64, 9), (1024, 64, 9), (512, 128, 5), (256, 128, 5))]
    c += [Stream(1, 1, 64, 1, 128, 256, s) for s in (2, 3)] + [Stream(1, 1, 64, 8, 128, 256, 3)]
    return c + TENSOR_CONFIGS


# the decode rows by one 2D tensor copy a tile and tensor (the TMA unit walks the 1 KB row stride): whether the 32 KB
# copies' rate on 64 CTAs (attn-decode-3) holds for the decode kernel's own layout
TENSOR_CONFIGS = [Stream(2, HEADS, 64, 8, 128, n, s) for n, s in ((64, 5), (64, 9), (128, 3), (128, 5), (256, 2),
                                                                  (256, 3))] + [
    Stream(2, HEADS, 64, 1, 128, 128, 5), Stream(2, HEADS, 128, 1, 128, 128, 3), Stream(2, HEADS, 128, 8, 128, 64, 5)]
# attn-decode-3's fastest 64-CTA readers (32 KB contiguous bulk copies), beside them in --tensor-maps
TENSOR_REFERENCES = [Stream(1, 1, 64, 1, 128, 256, 3), Stream(1, 1, 64, 8, 128, 256, 3)]


# tensor maps written on the device (session 10, third run): the best host-map columns of attn-decode-5 again, each
# beside the same host map without L2 promotion (as the device writes it) and its two device-written twins (in place in
# the per-SM slot; built in shared memory and copied there)
DEVICE_MAP_BASES = [Stream(2, HEADS, 64, 8, 128, n, s) for n, s in ((128, 3), (128, 5), (256, 3))] + [
    Stream(2, HEADS, 64, 1, 128, 128, 5)]
DEVICE_MAP_CONFIGS = [b._replace(device_map=d, l2_promotion=p) for b in DEVICE_MAP_BASES
                      for d, p in ((0, 3), (0, 0), (1, 0), (2, 0))]
# what writing + fencing the maps costs a launch: one configuration's three map sources by K/V size, 0 keys included
COST_BASE, COST_KEYS = Stream(2, HEADS, 64, 8, 128, 128, 5), (0, 512, 4096, 32768, 65536)


SWEEP = (Stream(0, HEADS, 64, 8, 128, 64, 9), Stream(1, HEADS, 64, 8, 128, 64, 9), Stream(0, 1, 132, 1, 128, 64, 5),
         Stream(1, 1, 132, 1, 128, 64, 5))
SWEEP_KEYS = (512, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
L2_BYTES = 50 * 2 ** 20


def kv_pair(keys: int, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """Random bf16 K and V of batch 1 x ``keys`` x HEADS x 64 (never zeros)."""
    return tuple(torch.randn(1, keys, HEADS, ROW_BYTES // 2, device="cuda", dtype=torch.bfloat16, generator=gen)
                 for _ in range(2))


def tensor_maps(k, v, block_n: int, l2_promotion: int) -> torch.Tensor:
    """The CUtensorMaps of K and V (each 128 bytes, on the device) as the driver encodes them: bytes of [keys][HEADS *
    ROW_BYTES], boxes of ROW_BYTES x ``block_n`` (one head's rows of a tile), no swizzle, ``l2_promotion``."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
    encoded = []
    for t in (k, v):
        buf = (ctypes.c_uint8 * 192)()
        addr = (ctypes.addressof(buf) + 63) // 64 * 64  # (CUtensorMap is 64-byte aligned)
        err = lib.cuTensorMapEncodeTiled(
            ctypes.c_void_p(addr), ctypes.c_int(0), ctypes.c_uint32(2), ctypes.c_void_p(t.data_ptr()),  # UINT8, rank 2
            (ctypes.c_uint64 * 2)(HEADS * ROW_BYTES, max(t.shape[1], 1)),  # (0 keys: no copy reads the map)
            (ctypes.c_uint64 * 1)(HEADS * ROW_BYTES),
            (ctypes.c_uint32 * 2)(ROW_BYTES, block_n), (ctypes.c_uint32 * 2)(1, 1),
            ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(l2_promotion), ctypes.c_int(0))  # interleave, swizzle, fill
        if err:
            raise RuntimeError(f"cuTensorMapEncodeTiled failed: CUresult {err}")
        encoded.append(torch.frombuffer(bytearray(ctypes.string_at(addr, 128)), dtype=torch.uint8))
    return torch.cat(encoded).cuda()


def word_sum(*tensors) -> int:
    """The sum of the tensors' 32-bit words mod 2^32 (the kernel's checksum)."""
    return sum(int(t.view(torch.int32).to(torch.int64).sum()) for t in tensors) % 2 ** 32


def streamer(stream: Stream, k, v, arch: str):
    """(launch closure, checksum test) of ``stream`` over ``k``/``v``."""
    plan = stream.plan(k.shape[1])
    out = torch.full((stream.ctas,), 0x7FC00000, device="cuda", dtype=torch.int32)  # poisoned
    maps = tensor_maps(k, v, stream.block_n, stream.l2_promotion) if stream.bulk == 2 and not stream.device_map else k

    def run():  # (reads maps' pointer each call: the closure keeps the tensor maps' buffer alive while it is in use)
        launch(plan, arch, [k.data_ptr(), v.data_ptr(), maps.data_ptr()], [out.data_ptr()],
               stream=torch.cuda.current_stream().cuda_stream)

    def checked(launch: bool = True) -> bool:  # (launch False: what the last launch wrote)
        if launch:
            out.fill_(0x7FC00000)
            run()
        return int(out.to(torch.int64).sum()) % 2 ** 32 == word_sum(k, v)
    return run, checked


def time_stream(stream: Stream, k, v, arch: str) -> float:
    """Median ms of ``stream`` over ``k``/``v`` after a checksum check; nan (the error printed) where it fails, so
    that one bad column does not cost the run."""
    try:
        run, checked = streamer(stream, k, v, arch)
        if not checked():
            raise AssertionError("checksum differs from torch's")
        return time_ms(run)
    except Exception as exc:  # (LaunchError, AssertionError: reported in the table as nan)
        print(f"FAILED {stream.label()}: {exc}", flush=True)
        return float("nan")


def time_decode(q, k, v, out, tuning=None) -> float:
    """Median ms of the decode kernel (the plan's choice, or ``tuning``) on q/k/v, several queries bottom-right
    causal; nan (the error printed) where it fails."""
    causal = q.shape[1] > 1
    try:
        return time_ms(ours(q, k, v, out, causal, tuning, alignment="bottom_right" if causal else "top_left"))
    except Exception as exc:
        print(f"FAILED decode {tuple(q.shape)} x {tuple(k.shape)}: {exc}", flush=True)
        return float("nan")


def rate_row(name: str, nbytes: int, ms: float, read: float, sum_ms: float) -> list:
    return [name, f"{ms * 1e3:.1f}", f"{nbytes / ms / 1e9:.2f}", f"{nbytes / ms / 1e9 / read:.0%}",
            f"{sum_ms / ms:.2f}"]


def table_64mb(arch: str, read: float, gen, streams: list) -> tuple[list, list]:
    k, v = kv_pair(KEYS, gen)
    nbytes = 2 * k.numel() * 2
    flat = torch.cat([k.view(-1), v.view(-1)]).view(torch.float32)
    sum_ms = time_ms(lambda: flat.sum())
    rows = [rate_row("torch sum of the same bytes (float32)", nbytes, sum_ms, read, sum_ms)]
    for lq in (1, 16):
        q = torch.randn(1, lq, 32, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
        o = torch.full_like(q, float("nan"))
        ms = time_decode(q, k, v, o)
        rows.append(rate_row(f"decode kernel, plan: {lq} x 32k x 1, head dim 64", nbytes, ms, read, sum_ms))
    for stream in streams:
        rows.append(rate_row(stream.label(), nbytes, time_stream(stream, k, v, arch), read, sum_ms))
        print(" | ".join(rows[-1]), flush=True)
    return ["what reads the 64 MB", "us", "TB/s", "% of 1 GiB read", "torch sum / it"], rows


def line_fit(points: list) -> tuple[float, float]:
    """(fixed us, TB/s) of t = fixed + bytes / rate, least squares over (bytes, ms) points."""
    n = len(points)
    mx, my = sum(b for b, _ in points) / n, sum(t for _, t in points) / n
    slope = sum((b - mx) * (t - my) for b, t in points) / sum((b - mx) ** 2 for b, _ in points)
    return (my - slope * mx) * 1e3, 1 / slope / 1e9


def table_sweep(arch: str, read: float, gen) -> tuple[list, list, list]:
    empty = Stream(0, HEADS, 64, 8, 128, 64, 3)
    k0, v0 = kv_pair(8, gen)
    run, _ = streamer(empty, k0[:, :0], v0[:, :0], arch)
    summary = [f"an empty launch of the stream kernel (64 CTAs, cluster 8, no keys) in the same graph timing: "
               f"{time_ms(run) * 1e3:.1f} us"]
    # the decode kernel on the tile its plan takes at 32k keys (KV_SPLIT 8: 64 CTAs), at every size
    decoders = {f"decode kernel, {lq} queries, the 32k plan's tile": lq for lq in (1, 16)}
    tunings = {lq: {d: decode_plans(torch.bfloat16, lq, KEYS, 1, 64, arch)[0].defines[d] for d in DECODE_TUNING}
               for lq in decoders.values()}
    names = ["torch sum"] + [s.label() for s in SWEEP] + list(decoders)
    times = {n: [] for n in names}
    for keys in SWEEP_KEYS:
        k, v = kv_pair(keys, gen)
        flat = torch.cat([k.view(-1), v.view(-1)]).view(torch.float32)
        times["torch sum"].append((flat.numel() * 4, time_ms(lambda: flat.sum())))
        for s in SWEEP:
            times[s.label()].append((flat.numel() * 4, time_stream(s, k, v, arch)))
        for name, lq in decoders.items():
            q = torch.randn(1, lq, 32, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
            o = torch.full_like(q, float("nan"))
            times[name].append((flat.numel() * 4, time_decode(q, k, v, o, tunings[lq])))
        del k, v, flat
    header = ["reader"] + [f"{b / 2 ** 20:.0f} MB us (% of read)" for b, _ in times["torch sum"]] + [
        "fixed us (fit above L2)", "asymptotic TB/s (fit)"]
    rows = []
    for n in names:
        fixed, rate = line_fit([(b, t) for b, t in times[n] if b > L2_BYTES])
        rows.append([n] + [f"{t * 1e3:.1f} ({b / t / 1e9 / read:.0%})" for b, t in times[n]] +
                    [f"{fixed:.1f}", f"{rate:.2f}"])
    # four 64 MB K/V pairs in turn: each call's bytes were last read four calls ago (256 MB ago), not in L2
    pairs = [kv_pair(KEYS, gen) for _ in range(4)]
    flats = [torch.cat([k.view(-1), v.view(-1)]).view(torch.float32) for k, v in pairs]
    for name, runs in [("torch sum", [lambda f=f: f.sum() for f in flats])] + [
            (s.label(), [streamer(s, k, v, arch)[0] for k, v in pairs]) for s in SWEEP]:
        turn = iter(range(10 ** 9))
        ms = time_ms(lambda: runs[next(turn) % 4]())
        summary.append(f"64 MB from four buffers in turn, {name}: {ms * 1e3:.1f} us ({flats[0].numel() * 4 / ms / 1e9 / read:.0%})")
    return header, rows, summary


def table_map_cost(arch: str, read: float, gen) -> tuple[list, list, list]:
    """COST_BASE with each map source by K/V size: us, and the device maps' extra us over the host-encoded maps."""
    streams = [COST_BASE._replace(device_map=d, l2_promotion=p) for d, p in ((0, 3), (0, 0), (1, 0), (2, 0))]
    times = {s: [] for s in streams}
    for keys in COST_KEYS:
        k, v = (t[:, :keys] for t in kv_pair(max(keys, 1), gen))  # (0 keys: a view with a real address for the map)
        for s in streams:
            times[s].append((2 * k.numel() * 2, time_stream(s, k, v, arch)))
        del k, v
    header = ["maps"] + [f"{keys} keys ({2 * keys * HEADS * ROW_BYTES / 2 ** 20:g} MB) us" for keys in COST_KEYS] + [
        "fixed us (fit 64-128 MB)", "TB/s (fit)"]
    rows = []
    for s in streams:
        fixed, rate = line_fit([(b, t) for b, t in times[s] if b > L2_BYTES])
        rows.append([s.label()] + [f"{t * 1e3:.2f}" for _, t in times[s]] + [f"{fixed:.1f}", f"{rate:.2f}"])
    host = times[streams[0]]
    summary = [f"{s.label()}, minus the host map (L2 promotion 256 B): " + ", ".join(
        f"{(t - h) * 1e3:+.2f} us at {keys} keys" for keys, (_, t), (_, h) in zip(COST_KEYS, times[s], host))
        for s in streams[1:]]
    return header, rows, summary


def slot_reuse_checks(arch: str) -> None:
    """The per-SM slots under reuse: device-map launches over two K/V of different sizes alternated (each launch's
    checksum checked: a stale map would read the other tensors), then both launched together from two streams."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    pairs = [kv_pair(1000, gen), kv_pair(777, gen)]
    for stream in (Stream(2, HEADS, 64, 8, 128, 64, 3, 1), Stream(2, HEADS, 64, 8, 128, 128, 2, 2)):
        runs = [streamer(stream, k, v, arch) for k, v in pairs]
        alternated = all(runs[i % 2][1]() for i in range(6))
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        torch.cuda.synchronize()
        for i in range(16):  # (the closures launch on the current stream; each stream's launches write its own out)
            with torch.cuda.stream(streams[i % 2]):
                runs[i % 2][0]()
        torch.cuda.synchronize()
        concurrent = all(checked(launch=False) for _, checked in runs)
        print(f"{stream.label()}: alternated K/V {'checksums ok' if alternated else 'CHECKSUM WRONG'}, two streams "
              f"{'checksums ok' if concurrent else 'CHECKSUM WRONG'}", flush=True)


def small(arch: str) -> None:
    """Checked runs on small K/V (uneven parts, a partial last tile) for compute-sanitizer."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    k, v = kv_pair(1000, gen)
    for s in (Stream(0, HEADS, 64, 8, 128, 64, 3), Stream(1, HEADS, 64, 8, 128, 32, 5), Stream(1, 1, 132, 1, 128, 64, 3),
              Stream(0, 1, 132, 1, 256, 128, 3), Stream(2, HEADS, 64, 8, 128, 64, 3), Stream(2, HEADS, 64, 8, 128, 128, 2),
              Stream(2, HEADS, 64, 8, 128, 64, 3, 1), Stream(2, HEADS, 64, 8, 128, 128, 2, 2),
              Stream(2, HEADS, 64, 1, 128, 128, 2, 1)):
        try:
            print(s.label(), "checksum ok" if streamer(s, k, v, arch)[1]() else "CHECKSUM WRONG", flush=True)
        except Exception as exc:
            print(f"FAILED {s.label()}: {exc}", flush=True)
    slot_reuse_checks(arch)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="markdown file for the tables")
    parser.add_argument("--small", action="store_true", help="only a few small checked runs")
    parser.add_argument("--tensor-maps", action="store_true",
                        help="only the 64 MB table's tensor-map columns beside the 32 KB contiguous bulk copies")
    parser.add_argument("--device-maps", action="store_true",
                        help="only the device-written tensor maps: their cost by size, then the 64 MB columns beside "
                             "the host-encoded maps and the 32 KB contiguous bulk copies")
    args = parser.parse_args()
    arch = device_arch(0)
    if args.small:
        return small(arch)
    only = args.tensor_maps or args.device_maps
    streams = (TENSOR_REFERENCES + (DEVICE_MAP_CONFIGS if args.device_maps else TENSOR_CONFIGS) if only else
               configs())
    decode = [decode_plans(torch.bfloat16, lq, KEYS, 1, 64, arch)[0] for lq in (1, 16)]
    precompile([s.plan(KEYS) for s in streams + ([] if only else list(SWEEP))] + decode, arch)
    gen = torch.Generator(device="cuda").manual_seed(0)
    read = read_bandwidth()
    head = (f"# Streaming-read ceiling of decode K/V\n\n{versions()}\n\n{ceilings()}\n\n"
            f"{' '.join(__doc__.split(chr(10) + chr(10))[0].split())}\n\ndevice read {read:.2f} TB/s (sum of 1 GiB "
            "float32, same run)\n\n")
    report = head
    if args.device_maps:
        report = write_report(head, *table_map_cost(arch, read, gen), None) + "\n\n"
        print(report, flush=True)
    header, rows = table_64mb(arch, read, gen, streams)
    report = write_report(report, header, rows, [], None)
    if not only:
        sweep_header, sweep_rows, summary = table_sweep(arch, read, gen)
        report += "\n\n" + write_report("", sweep_header, sweep_rows, summary, None)
    if args.out:
        Path(args.out).write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
