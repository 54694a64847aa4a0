"""The fair anchor for FusedConv: one cuDNN frontend graph per layer, conv_fprop -> bias -> (add residual) ->
activation, float16 NHWC, built with runtime fusion, as TensorRT runs a conv with BatchNorm folded and its epilogue
fused (issue 12). A layer whose graph cuDNN cannot build is reported "n/a" with cuDNN's reason, never a crash.
"""
from __future__ import annotations

import os

import torch


def _point_frontend_at_torchs_cudnn() -> None:
    """The frontend wheel carries no libcudnn: it dlopens one from LD_LIBRARY_PATH, site-packages or the loader's
    path. Point it at the library torch itself runs (torch's nvidia/cudnn/lib where present), so both time the
    same cuDNN."""
    torch_cudnn = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "cudnn", "lib")
    if os.path.isdir(torch_cudnn):
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [torch_cudnn,
                                                                       os.environ.get("LD_LIBRARY_PATH")]))
    if torch.cuda.is_available():
        torch.backends.cudnn.version()  # loads torch's libcudnn.so.9 into the process (the soname fallback finds it)


_point_frontend_at_torchs_cudnn()
try:
    import cudnn
    IMPORT_ERROR = ""
except Exception as exc:  # noqa: BLE001 - any import failure (no wheel, no libcudnn) is reported per row
    cudnn, IMPORT_ERROR = None, f"cudnn frontend not importable: {type(exc).__name__}: {exc}".splitlines()[0]

_HANDLES: dict = {}


def handle_on(stream: torch.cuda.Stream):
    """One cuDNN handle for the benchmark, bound to ``stream`` (the stream the CUDA graph is captured on)."""
    if "handle" not in _HANDLES:
        _HANDLES["handle"] = cudnn.create_handle()
    cudnn.set_stream(_HANDLES["handle"], stream.cuda_stream)
    return _HANDLES["handle"]


class FusedGraph:
    """The cuDNN frontend graph of one layer over the case's own tensors: X, W (BatchNorm folded), bias (the folded
    shift), the residual where the layer has one, and the output. ``reason`` is why it did not build ('' if it
    did); ``run()`` executes it on ``stream``."""

    def __init__(self, x, w, bias, residual, out, *, stride: int, pad: int, act: str, post_relu: bool,
                 stream: torch.cuda.Stream):
        self.reason, self.stream = "", stream
        if cudnn is None:
            self.reason = IMPORT_ERROR
            return
        try:
            self._build(x, w, bias, residual, out, stride, pad, act, post_relu)
        except Exception as exc:  # noqa: BLE001 - cuDNN declines a graph with many exception types
            self.reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:160]

    def _build(self, x, w, bias, residual, out, stride, pad, act, post_relu):
        half, fp32 = cudnn.data_type.HALF, cudnn.data_type.FLOAT
        self.handle = handle_on(self.stream)
        g = cudnn.pygraph(io_data_type=half, intermediate_data_type=fp32, compute_data_type=fp32,
                          handle=self.handle, is_cuda_graph_replay_expected=True)
        bias4 = bias.reshape(1, -1, 1, 1)  # cuDNN broadcasts a [1, K, 1, 1] tensor over N, H, W
        tensors = {"x": x, "w": w, "bias": bias4}
        gx, gw, gb = (g.tensor_like(t, name=name) for name, t in tensors.items())
        y = g.conv_fprop(image=gx, weight=gw, padding=[pad, pad], stride=[stride, stride], dilation=[1, 1],
                         compute_data_type=fp32, name="conv")
        y = g.bias(input=y, bias=gb, name="bias_add")
        if act == "relu":
            y = g.relu(input=y, name="act")
        elif act == "relu6":
            y = g.relu(input=y, lower_clip=0.0, upper_clip=6.0, name="act")
        if residual is not None:
            gr = g.tensor_like(residual, name="residual")
            tensors["residual"] = residual
            y = g.add(a=y, b=gr, name="residual_add")
            if post_relu:
                y = g.relu(input=y, name="post_act")
        y.set_output(True).set_data_type(half).set_dim(list(out.shape)).set_stride(list(out.stride()))
        g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        workspace = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
        graph_tensors = {"x": gx, "w": gw, "bias": gb}
        if residual is not None:
            graph_tensors["residual"] = gr
        self.pack = {graph_tensors[k]: t for k, t in tensors.items()}
        self.pack[y] = out
        self.graph, self.workspace, self.keep = g, workspace, bias4  # bias4 may be a view: keep it alive

    def run(self):
        self.graph.execute(self.pack, self.workspace, handle=self.handle)
