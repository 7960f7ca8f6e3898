"""The onnx backend: see docs/architecture.md."""
