// CUDA runtime helpers every CUDA arch package needs on its launch path: error checks that name the
// package, the current device, its SM count cached per device (one attribute query per device, not
// per launch) and a kernel's shared-memory opt-in. Host code; include after <cuda_runtime.h> is available.
#pragma once
#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>

namespace fp8gemm::cuda {

constexpr int kMaxDevices = 64;

class Devices {
 public:
  constexpr explicit Devices(const char* package) : package_(package) {}

  constexpr const char* package() const { return package_; }

  // Throws std::runtime_error "<package>: <what>: <CUDA error>" (a Python RuntimeError through pybind11).
  void check(cudaError_t err, const char* what) const {
    if (err != cudaSuccess) throw std::runtime_error(std::string(package_) + ": " + what + ": " + cudaGetErrorString(err));
  }
  [[noreturn]] void fail(const std::string& what) const { throw std::runtime_error(std::string(package_) + ": " + what); }

  int current() const {
    int dev = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    if (dev < 0 || dev >= kMaxDevices) fail("device index out of range");
    return dev;
  }

  // The opt-in of `kKernel` to `bytes` (> 48 KB) of dynamic shared memory on `dev`, once per device (the attribute
  // is per device).
  template <auto kKernel>
  void allow_shared_memory(int dev, int bytes) const {
    static std::once_flag configured[kMaxDevices];
    std::call_once(configured[dev], [&] {
      check(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), "cudaFuncSetAttribute");
    });
  }

  int sm_count(int dev) const {
    static int cached[kMaxDevices] = {};
    if (!cached[dev]) check(cudaDeviceGetAttribute(&cached[dev], cudaDevAttrMultiProcessorCount, dev), "SM count");
    return cached[dev];
  }

 private:
  const char* package_;
};

}  // namespace fp8gemm::cuda
