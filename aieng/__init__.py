"""aieng: a multi-process inference server for ONNX models over ZeroMQ."""

__version__ = "0.1.0"
