// The device built-ins (gfx942_emu/device.hpp) on the current work-item, and whole-grid launches.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "scheduler.hpp"

namespace gfx942_emu {
namespace {

WorkItem& self() {
  Worker* worker = current_worker();
  if (!worker) {
    std::fputs("gfx942 emulator: a device built-in was called outside a kernel launch\n", stderr);
    std::abort();
  }
  return worker->current();
}

// Every sync point first checks that the previous barrier was followed by its acquire fence.
void check_acquired(WorkItem& w, const char* what) {
  if (w.owes_acquire)
    current_worker()->fail(w, std::string("reached ") + what + " after s_barrier without the acquire fence that must follow it");
}

bool covers_workgroup(const char* scope) {
  return !std::strcmp(scope, "workgroup") || !std::strcmp(scope, "agent") || !std::strcmp(scope, "");
}

}  // namespace

unsigned workitem_id(int dim) { return self().id[dim]; }
unsigned workgroup_id(int dim) {
  self();  // inside a launch
  return current_worker()->group(dim);
}
unsigned lane_id() { return self().lane; }

unsigned workgroup_size(int dim) {
  const dim3 b = current_worker()->launch().block;
  return dim == 0 ? b.x : dim == 1 ? b.y : b.z;
}

unsigned num_workgroups(int dim) {
  const dim3 g = current_worker()->launch().grid;
  return dim == 0 ? g.x : dim == 1 ? g.y : g.z;
}

unsigned grid_size(int dim) {
  const Launch& l = current_worker()->launch();
  return dim == 0 ? l.grid.x * l.block.x : dim == 1 ? l.grid.y * l.block.y : l.grid.z * l.block.z;
}

void fence(int order, const char* scope) {
  WorkItem& w = self();
  if (!covers_workgroup(scope)) return;  // a wavefront-scope fence orders nothing across waves
  if (order == __ATOMIC_RELEASE || order == __ATOMIC_ACQ_REL || order == __ATOMIC_SEQ_CST) w.released = true;
  if (order == __ATOMIC_ACQUIRE || order == __ATOMIC_ACQ_REL || order == __ATOMIC_SEQ_CST) w.owes_acquire = false;
}

void s_barrier() {
  WorkItem& w = self();
  Worker* worker = current_worker();
  check_acquired(w, "s_barrier");
  // HIP's __syncthreads(): fence(release, workgroup); s_barrier; fence(acquire, workgroup). Without
  // the fences the compiler may move LDS accesses across the barrier.
  if (!w.released) worker->fail(w, "s_barrier without a preceding release fence of workgroup scope");
  w.released = false;
  w.owes_acquire = true;
  ++w.barriers;
  w.site = __builtin_return_address(0);
  w.state = State::AtBarrier;
  worker->yield(w);
}

void mfma_lane_f32_32x32x16_fp8(int64_t a, int64_t b, float acc[16], int cbsz, int abid, int blgp) {
  WorkItem& w = self();
  check_acquired(w, "an MFMA");
  w.op = WaveOp::Mfma;
  w.site = __builtin_return_address(0);
  ++w.wave_ops;
  w.a = static_cast<uint64_t>(a), w.b = static_cast<uint64_t>(b);
  w.modifiers = cbsz | abid | blgp;
  for (int r = 0; r < 16; ++r) w.acc[r] = acc[r];
  w.state = State::AtWaveOp;
  current_worker()->yield(w);
  for (int r = 0; r < 16; ++r) acc[r] = w.acc[r];
}

int ds_bpermute(int byte_address, int value) {
  WorkItem& w = self();
  check_acquired(w, "ds_bpermute");
  w.op = WaveOp::Bpermute;
  w.site = __builtin_return_address(0);
  ++w.wave_ops;
  w.address = byte_address, w.value = value;
  w.state = State::AtWaveOp;
  current_worker()->yield(w);
  return w.value;
}

// --- the grid ------------------------------------------------------------------------------------

namespace {

thread_local std::string t_last_error;

constexpr char kThreadsVar[] = "FP8GEMM_GFX942_EMU_THREADS";

// OS threads that run workgroups: $FP8GEMM_GFX942_EMU_THREADS (README.md), else one per CPU core; 0 where the
// variable holds anything but a whole number from 1 to 4096.
unsigned worker_threads(uint64_t groups) {
  const char* env = std::getenv(kThreadsVar);
  unsigned long n = std::max(1u, std::thread::hardware_concurrency());
  if (env && *env) {
    char* end = nullptr;
    n = std::strtoul(env, &end, 10);
    if (*end || *env == '-' || n < 1 || n > 4096) return 0;
  }
  return static_cast<unsigned>(std::min<uint64_t>(n, std::max<uint64_t>(groups, 1)));
}

}  // namespace

void set_last_error_detail(std::string detail) { t_last_error = std::move(detail); }
const std::string& last_error_detail() { return t_last_error; }

hipError_t run_grid(const Launch& launch) {
  const dim3 g = launch.grid;
  const uint64_t groups = uint64_t(g.x) * g.y * g.z;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::string first_error;
  auto work = [&] {
    try {
      Worker worker(launch);
      for (uint64_t i; !failed && (i = next++) < groups;) {
        const unsigned group[3] = {static_cast<unsigned>(i % g.x), static_cast<unsigned>((i / g.x) % g.y),
                                   static_cast<unsigned>(i / (uint64_t(g.x) * g.y))};
        if (worker.run(group, i)) continue;
        std::lock_guard<std::mutex> lock(mutex);
        if (first_error.empty())
          first_error = std::string(launch.kernel->name) + ", workgroup (" + std::to_string(group[0]) + ", " +
                        std::to_string(group[1]) + ", " + std::to_string(group[2]) + "): " + worker.error();
        failed = true;
      }
    } catch (const std::exception& exc) {
      std::lock_guard<std::mutex> lock(mutex);
      if (first_error.empty()) first_error = exc.what();
      failed = true;
    }
  };
  const unsigned workers = worker_threads(groups);
  if (!workers) {
    set_last_error_detail(std::string(kThreadsVar) + "=" + std::getenv(kThreadsVar) +
                          ": set it to a whole number of threads from 1 to 4096, or unset it for one per CPU core");
    return hipErrorInvalidConfiguration;  // its text carries the detail
  }
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < workers; ++t) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  if (!failed) return hipSuccess;
  set_last_error_detail(first_error);
  return hipErrorLaunchFailure;
}

}  // namespace gfx942_emu
