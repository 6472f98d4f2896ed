// The HIP runtime API subset (hip/hip_runtime_api.h) on the emulator, the kernel registry, and the
// C entry points the Python adapter (gfx942_emulator.py) calls through ctypes.
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "mfma.hpp"
#include "scheduler.hpp"

namespace gfx942_emu {
namespace {

constexpr int kDevices = 64;
constexpr int kDefaultCuCount = 304;  // MI300X

struct Devices {
  std::mutex mutex;
  int current = 0;
  int cu_count[kDevices] = {};
  bool queried[kDevices] = {};
};

Devices& devices() {
  static Devices d;
  return d;
}

std::map<const void*, KernelEntry>& kernels() {
  static std::map<const void*, KernelEntry> table;
  return table;
}

std::mutex& kernels_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

bool register_kernel(const void* function, Invoker invoke, const char* name, void* (*tls_anchor)()) {
  std::lock_guard<std::mutex> lock(kernels_mutex());
  kernels()[function] = KernelEntry{function, invoke, name, tls_anchor};
  return true;
}

}  // namespace gfx942_emu

using namespace gfx942_emu;

extern "C" {

hipError_t hipGetDevice(int* device) {
  if (!device) return hipErrorInvalidValue;
  std::lock_guard<std::mutex> lock(devices().mutex);
  *device = devices().current;
  return hipSuccess;
}

hipError_t hipSetDevice(int device) {
  if (device < 0 || device >= kDevices) return hipErrorInvalidDevice;
  std::lock_guard<std::mutex> lock(devices().mutex);
  devices().current = device;
  return hipSuccess;
}

hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attribute, int device) {
  if (!value) return hipErrorInvalidValue;
  if (device < 0 || device >= kDevices) return hipErrorInvalidDevice;
  Devices& d = devices();
  std::lock_guard<std::mutex> lock(d.mutex);
  switch (attribute) {
    case hipDeviceAttributeMultiprocessorCount:
      d.queried[device] = true;
      *value = d.cu_count[device] ? d.cu_count[device] : kDefaultCuCount;
      return hipSuccess;
    case hipDeviceAttributeWarpSize:
      *value = kWaveSize;
      return hipSuccess;
  }
  return hipErrorInvalidValue;
}

const char* hipGetErrorString(hipError_t error) {
  switch (error) {
    case hipSuccess:
      return "no error";
    case hipErrorInvalidValue:
      return "invalid argument";
    case hipErrorInvalidDevice:
      return "invalid device ordinal";
    case hipErrorInvalidConfiguration:
    case hipErrorInvalidDeviceFunction:
    case hipErrorLaunchFailure: {
      // The emulator's detail for the last failed launch on this thread (the real runtime has only
      // the code's name here).
      thread_local std::string text;
      text = (error == hipErrorLaunchFailure ? "unspecified launch failure: " : "invalid launch: ") + last_error_detail();
      return text.c_str();
    }
  }
  return "unknown error";
}

namespace {
thread_local hipError_t t_last_launch = hipSuccess;

hipError_t launch_kernel(const void* function, dim3 grid, dim3 block, void** args, size_t shared_bytes) {
  const KernelEntry* entry = nullptr;
  {
    std::lock_guard<std::mutex> lock(kernels_mutex());
    auto it = kernels().find(function);
    if (it != kernels().end()) entry = &it->second;
  }
  if (!entry) {
    set_last_error_detail("this kernel is not registered with the emulator (GFX942_EMU_KERNEL in its build)");
    return hipErrorInvalidDeviceFunction;
  }
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (!grid.x || !grid.y || !grid.z || !threads || threads > 1024 || shared_bytes) {
    set_last_error_detail(std::string(entry->name) + ": grid and block must be non-empty, blocks at most 1024 " +
                          "work-items, no dynamic LDS");
    return hipErrorInvalidConfiguration;
  }
  return run_grid(Launch{entry, args, grid, block});
}
}  // namespace

hipError_t hipLaunchKernel(const void* function, dim3 grid, dim3 block, void** args, size_t shared_bytes,
                           hipStream_t) {
  const hipError_t err = launch_kernel(function, grid, block, args, shared_bytes);
  if (err != hipSuccess) t_last_launch = err;
  return err;
}

hipError_t hipGetLastError() {
  const hipError_t err = t_last_launch;
  t_last_launch = hipSuccess;
  return err;
}

hipError_t hipPeekAtLastError() { return t_last_launch; }

// --- for the Python adapter ------------------------------------------------------------------------

// Makes the current device one with `cu_count` compute units: the first device that has that count,
// else the next unused one (launch.cpp caches the count per device, so a device keeps its count).
int gfx942_emu_use_cu_count(int cu_count) {
  if (cu_count < 1) return -1;
  Devices& d = devices();
  std::lock_guard<std::mutex> lock(d.mutex);
  for (int device = 0; device < kDevices; ++device) {
    if (d.cu_count[device] && d.cu_count[device] != cu_count) continue;
    if (!d.cu_count[device] && d.queried[device]) continue;  // already read with the default count
    d.cu_count[device] = cu_count;
    d.current = device;
    return device;
  }
  return -1;
}

const char* gfx942_emu_last_error() { return last_error_detail().c_str(); }

void gfx942_emu_set_last_error(const char* text) { set_last_error_detail(text); }

double gfx942_emu_decode_fp8(int code) { return decode_fp8_e4m3fnuz(static_cast<uint8_t>(code)); }

// One MFMA on a wavefront's registers: a, b [64] 64-bit sources; c, d [64][16] fp32.
void gfx942_emu_mfma_f32_32x32x16_fp8(const uint64_t* a, const uint64_t* b, const float* c, float* d) {
  mfma_wave_f32_32x32x16_fp8(a, b, reinterpret_cast<const float(*)[16]>(c), reinterpret_cast<float(*)[16]>(d));
}

}  // extern "C"
