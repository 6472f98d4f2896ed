"""The conformance suite every backend passes, as ``fp8gemm check`` runs it: GEMM cases and bad inputs
(``conformance``), grouped GEMMs (``conformance_grouped``), activation quantization and ``linear``
(``conformance_layer``), each against a float64 reference on seeded random data."""

from . import conformance, conformance_grouped, conformance_layer

__all__ = ["conformance", "conformance_grouped", "conformance_layer"]
