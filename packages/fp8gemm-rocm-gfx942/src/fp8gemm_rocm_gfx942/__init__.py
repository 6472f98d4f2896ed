"""fp8gemm backend for AMD gfx942 (MI300X). Registered as entry point ``gfx942``."""

__version__ = "0.1.0"
