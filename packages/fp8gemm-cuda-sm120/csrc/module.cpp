// Python binding: the protocol's module (fp8gemm/arch_module.hpp), no libtorch.
#include "launch.hpp"  // first: it names the namespace fp8gemm/arch_module.hpp binds

#include <cuda_runtime_api.h>

#include "fp8gemm/arch_module.hpp"
#include "fp8gemm/build_info.hpp"

namespace {

pybind11::dict build_info() {
  return fp8gemm::build_info("mma.sync m16n8k32 e4m3, ldmatrix, cp.async pipeline, split-K for small M; grouped "
                             "(contiguous, masked, row ids) in one launch; weight gradient (1x128 B scales per column, "
                             "fp32 out added into), dense or per expert in one launch");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  fp8gemm::define_arch_module(m, &build_info);
  // The optional training entries (fp8gemm/training_entries.hpp): wgrad.cu (wgrad_kernel.cuh), quantize.cu.
  fp8gemm::define_wgrad_entry(m, &fp8gemm_sm120::wgrad_launch, &fp8gemm_sm120::wgrad_workspace_bytes,
                              fp8gemm_sm120::kWgradBScaleLdMultiple);
  fp8gemm::define_kgrouped_wgrad_entry(m, &fp8gemm_sm120::kgrouped_wgrad_launch);
  fp8gemm::define_quantize_transposed_entry(m, &fp8gemm_sm120::quantize_transposed);
  fp8gemm::define_quantize_grouped_transposed_entry(m, &fp8gemm_sm120::quantize_grouped_transposed);
  static const fp8gemm::NativeTrainingEntries training{fp8gemm::kNativeTrainingEntriesVersion,
                                                       sizeof(fp8gemm::NativeTrainingEntries),
                                                       &fp8gemm_sm120::quantize_transposed,
                                                       &fp8gemm_sm120::wgrad_launch,
                                                       &fp8gemm_sm120::wgrad_workspace_bytes,
                                                       fp8gemm_sm120::kWgradBScaleLdMultiple};
  fp8gemm::define_native_training_entries(m, &training);
}
