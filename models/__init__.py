"""Model generators: real `transformers` architectures with small configs and random weights, exported with the
TorchScript and dynamo ONNX exporters (`python -m models.generate --help`); tiny exports live in `models/samples/`."""
