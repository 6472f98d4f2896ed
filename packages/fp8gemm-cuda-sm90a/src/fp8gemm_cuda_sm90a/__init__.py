"""fp8gemm backend for NVIDIA sm_90a (H100/H200). Registered as entry point ``sm90a``."""

__version__ = "0.1.0"
