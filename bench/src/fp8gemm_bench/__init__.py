"""fp8gemm's benchmarks: ``fp8gemm bench`` (cli.py) over the GEMM (bench.py), the Linear layer (layer_bench.py),
grouped GEMMs (grouped_bench.py) and the MoE experts layer (moe_bench.py) against their peers (*_peers.py), the
recipe's accuracy without a GPU (accuracy.py), and whole transformers models (``python3 -m fp8gemm_bench.models``)."""
