"""fp8gemm backend for NVIDIA sm_120 (RTX 5090). Registered as entry point ``sm120``."""

__version__ = "0.1.0"
