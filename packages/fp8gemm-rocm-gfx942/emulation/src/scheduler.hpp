// One OS thread's view of the emulated GPU: it runs workgroups one at a time, each work-item a fiber.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gfx942_emu/device.hpp"
#include "gfx942_emu/kernels.hpp"
#include "hip/hip_runtime_api.h"

namespace gfx942_emu {

struct KernelEntry {
  const void* function;
  Invoker invoke;
  const char* name;
  void* (*tls_anchor)();
};

struct Launch {
  const KernelEntry* kernel;
  void** args;
  dim3 grid, block;
};

enum class State : uint8_t { Ready, AtBarrier, AtWaveOp, Done, Failed };
enum class WaveOp : uint8_t { Mfma, Bpermute };

struct WorkItem {
  void* sp = nullptr;  // saved stack pointer while not running
  State state = State::Ready;
  unsigned id[3] = {}, flat = 0, lane = 0, wave = 0;
  uint64_t barriers = 0, wave_ops = 0;  // sync points passed, to match them across work-items
  const void* site = nullptr;           // code address of the barrier / wave op it waits at
  bool released = false;                // a release fence since the last barrier
  bool owes_acquire = false;            // passed a barrier, no acquire fence yet
  WaveOp op = WaveOp::Mfma;
  uint64_t a = 0, b = 0;  // MFMA sources
  int modifiers = 0;      // cbsz | abid | blgp, all must be 0
  float acc[16] = {};     // MFMA C in, D out
  int32_t address = 0, value = 0;  // ds_bpermute
};

class Worker {
 public:
  explicit Worker(const Launch& launch);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Runs one workgroup to completion; false with error() set when the kernel broke a rule.
  bool run(const unsigned group[3], uint64_t linear_index);
  const std::string& error() const { return error_; }

  WorkItem& current() { return *current_; }
  const Launch& launch() const { return launch_; }
  unsigned group(int dim) const { return group_[dim]; }
  void yield(WorkItem& w);                // back to the scheduler, until resumed
  void fail(WorkItem& w, std::string why);  // records why and stops the workgroup
  static void fiber_main(void* arg);

 private:
  bool run_wave(unsigned wave);
  bool execute_wave_op(unsigned wave, unsigned begin, unsigned end);
  bool release_barrier();
  void resume(WorkItem& w);
  void poison_lds();
  std::string describe(const WorkItem& w) const;

  Launch launch_;
  unsigned size_ = 0, waves_ = 0;
  unsigned group_[3] = {};
  std::vector<WorkItem> items_;
  char* stacks_ = nullptr;
  size_t stack_bytes_ = 0, mapped_bytes_ = 0;
  void* lds_ = nullptr;  // this thread's copy of the kernel module's thread-local block
  size_t lds_bytes_ = 0;
  void* scheduler_sp_ = nullptr;
  WorkItem* current_ = nullptr;
  std::string error_;
};

// The worker running on this OS thread (null outside a launch).
Worker* current_worker();
// Runs the whole grid on a few OS threads; hipSuccess, or an error with last_error_detail() set.
hipError_t run_grid(const Launch& launch);
void set_last_error_detail(std::string detail);
const std::string& last_error_detail();

}  // namespace gfx942_emu
