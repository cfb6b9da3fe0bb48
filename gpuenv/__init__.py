"""gpuenv: reproducible CPU and GPU Docker environments from one build matrix."""

__version__ = "0.2.0"
