"""The TensorRT conformance suite's machinery: NVIDIA's ``tensorrt.plugin`` sources per TensorRT line
(``wheels.py``), a stand-in for the compiled bindings under them (``standin.py``), and the parser and builder
calls into our plugins (``builder.py``). The tests are ``tests/test_tensorrt_conformance.py``."""
