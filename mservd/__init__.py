"""mservd: a pure-Python model-hosting service for PyTorch models."""

__version__ = "0.1.0"
