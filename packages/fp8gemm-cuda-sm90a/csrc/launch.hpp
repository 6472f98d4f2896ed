// This package's entry points: the protocol's launch, workspace_bytes and quantize, declared in the core.
#pragma once
#define FP8GEMM_ARCH_NAMESPACE fp8gemm_sm90a
#include "fp8gemm/arch_entry.hpp"
