"""Time the rewrite pass (load, rewrite, save; no verification) on generated large models.

A BERT-style transformer of hidden 1024 at 12, 24 and 48 layers (48 layers: 2.4 GB of float32 weights, so
external data; the smaller ones are given external data too, so all three are the same kind of file) shows
the pass is linear in graph size; a ResNet-152-shaped CNN (0.23 GB, one file) is the convolution case.
Models are exported once (TorchScript exporter by default) and cached. Each is timed ``--repeat`` times
(the machine is shared) and the fastest run reported. Writes a markdown table.

    python benchmarks/rewrite.py [--cache DIR] [--exporter torchscript|dynamo] [--layers 12 24 48]
                                 [--repeat 5] [--out benchmarks/results/rewrite.md]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the models package lives at the top of the repository


def export_once(cache: Path, name: str, exporter: str, **overrides) -> Path:
    """The cached export of catalogue model ``name`` with ``overrides``, exported if missing."""
    path = cache / f"{name}_{'_'.join(f'{k}{v}' for k, v in overrides.items())}_{exporter}.onnx".replace(" ", "")
    if not path.exists():
        from models.export import export
        from models.generate import build

        start = time.perf_counter()
        print(f"exporting {path.name} ...", file=sys.stderr, flush=True)
        export(build(name, **overrides), path, exporter)
        print(f"  {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return path


def with_external_data(path: Path) -> Path:
    """``path`` itself when it has external data, else a cached copy of it that has."""
    from trt_fusedattn import io

    if path.with_name(path.name + ".data").exists():
        return path
    external = path.with_name(path.stem + "_external.onnx")
    if not external.exists():
        io.save_model(io.load_model(path)[0], external, external_data=True)
    return external


def fastest(path: Path, repeat: int) -> dict:
    return min((time_pass(path) for _ in range(repeat)), key=lambda r: r["total"])


def time_pass(path: Path) -> dict:
    """Seconds to load, rewrite and save ``path`` (into a scratch folder), and what the pass found."""
    from trt_fusedattn import io, pipeline

    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        start = time.perf_counter()
        model, external = io.load_model(path)
        loaded = time.perf_counter()
        nodes = len(model.graph.node)
        fused, report = pipeline.fuse(model, consume=True)
        rewritten = time.perf_counter()
        files = io.save_model(fused, Path(scratch) / path.name, external_data=True if external else None)
        saved = time.perf_counter()
        size = sum(f.stat().st_size for f in files)
    return {"model": path.name, "nodes": nodes, "GB": size / 1e9, "external": len(files) > 1,
            "sites": report.summary(), "load": loaded - start, "rewrite": rewritten - loaded,
            "save": saved - rewritten, "total": saved - start}


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = ", ".join(f"{p} {metadata.version(p)}" for p in
                         ("onnx", "onnx-graphsurgeon", "onnxruntime", "protobuf", "numpy", "torch", "transformers"))
    return (f"{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB; Python {platform.python_version()}; {versions}; "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")


def table(rows: list[dict]) -> str:
    head = ("| model | nodes | size (GB) | external data | sites | load (s) | rewrite (s) | rewrite per 1000 nodes (s) "
            "| save (s) | total (s) |")
    lines = [head, "|---|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['nodes']} | {r['GB']:.2f} | {'yes' if r['external'] else 'no'} | "
                     f"{r['sites']} | {r['load']:.2f} | {r['rewrite']:.2f} | {1000 * r['rewrite'] / r['nodes']:.2f} | "
                     f"{r['save']:.2f} | {r['total']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "trt_fusedattn_bench")
    parser.add_argument("--exporter", default="torchscript", choices=("torchscript", "dynamo"))
    parser.add_argument("--layers", type=int, nargs="+", default=[12, 24, 48])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "rewrite.md")
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)

    from models.generate import RESNET152

    rows = []
    for layers in args.layers:
        path = export_once(args.cache, "bert_sdpa", args.exporter, layers=layers, hidden=1024, heads=16)
        rows.append(fastest(with_external_data(path), args.repeat))
        print(rows[-1], file=sys.stderr, flush=True)
    path = export_once(args.cache, "resnet", args.exporter, **RESNET152)
    rows.append(fastest(path, args.repeat))
    print(rows[-1], file=sys.stderr, flush=True)

    text = (f"# Rewrite pass timing\n\n`python benchmarks/rewrite.py --exporter {args.exporter}`: load (with "
            f"external data), rewrite (shape inference, attention and conv rewrites, cleanup, toposort) and save "
            f"of generated models, no verification, fastest of {args.repeat} runs. BERT-style encoder (hidden 1024, 16 heads, "
            f"FFN 4096) at {', '.join(map(str, args.layers))} layers; ResNet-152 layout "
            f"(depths 3-8-36-3, widths 256-2048, 224x224). Transformers are read from and written to external data "
            f"(large weights are copied file to file, never through Python), the CNN is one file.\n\n"
            f"Machine: {machine()}\n\n{table(rows)}\n")
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
