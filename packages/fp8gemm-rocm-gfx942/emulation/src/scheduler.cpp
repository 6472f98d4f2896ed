// Workgroups as fibers on one OS thread: the scheduler runs each wavefront's lanes until all of them
// wait at a rendezvous (s_barrier, a wave-level instruction, or the end), then resolves it. A wave op
// runs as soon as its 64 lanes arrive and the same wave goes on, so waves drift as far apart as the
// barriers allow: a missing barrier shows up as a read of poisoned or stale LDS.
#include <link.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "fiber.hpp"
#include "mfma.hpp"
#include "scheduler.hpp"

namespace gfx942_emu {
namespace {

thread_local Worker* t_worker = nullptr;
constexpr size_t kStackBytes = 128 * 1024, kGuardBytes = 4096;
constexpr unsigned char kLdsPoison = 0xff;  // an fp32 NaN; FP8 -240 (e4m3fnuz)

struct TlsBlock {
  const void* anchor;
  void* start = nullptr;
  size_t bytes = 0;
};

int find_tls_block(dl_phdr_info* info, size_t, void* data) {
  auto* block = static_cast<TlsBlock*>(data);
  if (!info->dlpi_tls_data) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_TLS) continue;
    auto* start = static_cast<char*>(info->dlpi_tls_data);
    auto* anchor = static_cast<const char*>(block->anchor);
    if (anchor >= start && anchor < start + ph.p_memsz) {
      block->start = start;
      block->bytes = ph.p_memsz;
      return 1;
    }
  }
  return 0;
}

std::string range_list(const std::vector<unsigned>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ids[i]) + (j > i ? "-" + std::to_string(ids[j]) : "");
    i = j + 1;
  }
  return out;
}

const char* op_name(WaveOp op) { return op == WaveOp::Mfma ? "v_mfma_f32_32x32x16_fp8_fp8" : "ds_bpermute_b32"; }

}  // namespace

Worker* current_worker() { return t_worker; }

Worker::Worker(const Launch& launch) : launch_(launch) {
  size_ = launch.block.x * launch.block.y * launch.block.z;
  waves_ = (size_ + kWaveSize - 1) / kWaveSize;
  items_.resize(size_);
  stack_bytes_ = kStackBytes + kGuardBytes;
  mapped_bytes_ = stack_bytes_ * size_;
  void* mem = mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) throw std::runtime_error("gfx942 emulator: cannot map work-item stacks");
  stacks_ = static_cast<char*>(mem);
  for (unsigned i = 0; i < size_; ++i) mprotect(stacks_ + i * stack_bytes_, kGuardBytes, PROT_NONE);  // overflow traps
  t_worker = this;
}

Worker::~Worker() {
  munmap(stacks_, mapped_bytes_);
  t_worker = nullptr;
}

void Worker::poison_lds() {
  // The kernels' __shared__ variables are the thread_locals of their module: one block, found once
  // per thread through the module's anchor (touching it makes the loader allocate the block here).
  if (!lds_) {
    TlsBlock block{launch_.kernel->tls_anchor()};
    dl_iterate_phdr(find_tls_block, &block);
    if (!block.start) throw std::runtime_error("gfx942 emulator: cannot find the kernels' LDS (thread-local block)");
    lds_ = block.start, lds_bytes_ = block.bytes;
  }
  std::memset(lds_, kLdsPoison, lds_bytes_);
}

void Worker::fiber_main(void* arg) {
  auto* w = static_cast<WorkItem*>(arg);
  Worker* self = t_worker;
  self->launch_.kernel->invoke(self->launch_.kernel->function, self->launch_.args);
  if (w->owes_acquire) self->fail(*w, "returned after s_barrier without the acquire fence that must follow it");
  w->state = State::Done;
  gfx942_emu_switch(&w->sp, self->scheduler_sp_);
  __builtin_trap();  // never resumed
}

void Worker::yield(WorkItem& w) { gfx942_emu_switch(&w.sp, scheduler_sp_); }

void Worker::resume(WorkItem& w) {
  current_ = &w;
  gfx942_emu_switch(&scheduler_sp_, w.sp);
  current_ = nullptr;
}

void Worker::fail(WorkItem& w, std::string why) {
  if (error_.empty()) error_ = describe(w) + ": " + why;
  w.state = State::Failed;
  yield(w);
  __builtin_trap();  // a failed workgroup is abandoned, never resumed
}

std::string Worker::describe(const WorkItem& w) const {
  char text[96];
  std::snprintf(text, sizeof text, "work-item %u (wave %u, lane %u)", w.flat, w.wave, w.lane);
  return text;
}

bool Worker::run(const unsigned group[3], uint64_t linear_index) {
  for (int d = 0; d < 3; ++d) group_[d] = group[d];
  error_.clear();
  poison_lds();
  const dim3 b = launch_.block;
  for (unsigned i = 0; i < size_; ++i) {
    WorkItem& w = items_[i];
    w = WorkItem{};
    w.flat = i, w.lane = i % kWaveSize, w.wave = i / kWaveSize;
    w.id[0] = i % b.x, w.id[1] = (i / b.x) % b.y, w.id[2] = i / (b.x * b.y);
    w.sp = make_fiber(stacks_ + (i + 1) * stack_bytes_, &Worker::fiber_main, &w);
  }
  for (uint64_t epoch = 0;; ++epoch) {
    // A different wave leads in every phase and workgroup, so no fixed order hides a race.
    for (unsigned s = 0; s < waves_; ++s)
      if (!run_wave(static_cast<unsigned>((s + linear_index + epoch) % waves_))) return false;
    if (!release_barrier()) return false;
    bool all_done = true;
    for (const WorkItem& w : items_) all_done = all_done && w.state == State::Done;
    if (all_done) return true;
  }
}

bool Worker::run_wave(unsigned wave) {
  const unsigned begin = wave * kWaveSize, end = begin + kWaveSize < size_ ? begin + kWaveSize : size_;
  for (;;) {
    unsigned at_op = 0, done = 0, at_barrier = 0, first = end;
    for (unsigned i = begin; i < end; ++i) {
      if (items_[i].state == State::Ready) resume(items_[i]);
      if (items_[i].state == State::Failed) return false;
      at_op += items_[i].state == State::AtWaveOp;
      done += items_[i].state == State::Done;
      at_barrier += items_[i].state == State::AtBarrier;
      if (items_[i].state == State::AtWaveOp && first == end) first = i;
    }
    if (at_op == 0) return true;
    // Lanes that have returned are inactive, as under an EXEC mask. So are, for ds_bpermute, lanes that went on to a
    // barrier: they left the loop or branch that holds the permute (as whole 16-lane groups leave the row loop of
    // fp8gemm/quantize_tiles.cuh at M), and on the GPU they wait, masked off, until the wavefront reconverges before
    // that barrier; release_barrier() still checks that every work-item reaches the same one. Lanes at a barrier
    // around an MFMA (which needs all 64) mean divergence the emulator cannot order.
    const bool masked_at_barrier = items_[first].op == WaveOp::Bpermute;
    if (at_op + done + (masked_at_barrier ? at_barrier : 0) == end - begin) {
      if (!execute_wave_op(wave, begin, end)) return false;
      continue;
    }
    std::vector<unsigned> waiting, elsewhere;
    for (unsigned i = begin; i < end; ++i) {
      if (items_[i].state == State::AtWaveOp) waiting.push_back(i - begin);
      if (items_[i].state == State::AtBarrier) elsewhere.push_back(i - begin);
    }
    error_ = "wave " + std::to_string(wave) + ": lanes " + range_list(waiting) + " wait at " +
             op_name(items_[begin + waiting[0]].op) + " while lanes " + range_list(elsewhere) +
             " went on to a barrier: divergent control flow around a wave-level instruction";
    return false;
  }
}

bool Worker::execute_wave_op(unsigned wave, unsigned begin, unsigned end) {
  std::vector<WorkItem*> active;
  for (unsigned i = begin; i < end; ++i)
    if (items_[i].state == State::AtWaveOp) active.push_back(&items_[i]);
  const WorkItem& first = *active[0];
  for (const WorkItem* w : active) {
    if (w->op != first.op || w->site != first.site || w->wave_ops != first.wave_ops) {
      error_ = "wave " + std::to_string(wave) + ": lanes " + std::to_string(first.lane) + " and " +
               std::to_string(w->lane) + " wait at different wave-level instructions (" + op_name(first.op) + " #" +
               std::to_string(first.wave_ops) + " vs " + op_name(w->op) + " #" + std::to_string(w->wave_ops) +
               "): divergent control flow";
      return false;
    }
  }
  WorkItem* lanes = &items_[begin];
  if (first.op == WaveOp::Mfma) {
    if (active.size() != kWaveSize) {
      std::vector<unsigned> waiting, gone;
      for (unsigned i = begin; i < end; ++i) (items_[i].state == State::AtWaveOp ? waiting : gone).push_back(i - begin);
      error_ = "wave " + std::to_string(wave) + ": lanes " + range_list(waiting) +
               " wait at v_mfma_f32_32x32x16_fp8_fp8 but lanes " + range_list(gone) +
               " have returned or do not exist: the instruction needs all 64 lanes";
      return false;
    }
    uint64_t a[kWaveSize], b[kWaveSize];
    float c[kWaveSize][16], d[kWaveSize][16];
    for (unsigned l = 0; l < kWaveSize; ++l) {
      if (lanes[l].modifiers) {
        error_ = describe(lanes[l]) + ": MFMA with CBSZ/ABID/BLGP broadcast is not emulated (pass 0, 0, 0)";
        return false;
      }
      a[l] = lanes[l].a, b[l] = lanes[l].b;
      std::memcpy(c[l], lanes[l].acc, sizeof c[l]);
    }
    mfma_wave_f32_32x32x16_fp8(a, b, c, d);
    for (unsigned l = 0; l < kWaveSize; ++l) std::memcpy(lanes[l].acc, d[l], sizeof d[l]);
  } else {
    // ds_bpermute_b32: lane l reads `value` of lane (address[l] / 4) mod 64 (the byte address of a
    // 32-bit lane slot); an inactive or missing source lane reads as 0 (HIP leaves it undefined).
    const unsigned count = end - begin;
    int32_t result[kWaveSize];
    for (const WorkItem* w : active) {
      const unsigned source = (static_cast<uint32_t>(w->address) >> 2) % kWaveSize;
      result[w->lane] = source < count && lanes[source].state == State::AtWaveOp ? lanes[source].value : 0;
    }
    for (WorkItem* w : active) w->value = result[w->lane];
  }
  for (WorkItem* w : active) w->state = State::Ready;
  return true;
}

bool Worker::release_barrier() {
  std::vector<unsigned> done, waiting;
  for (const WorkItem& w : items_) {
    if (w.state == State::Done) done.push_back(w.flat);
    if (w.state == State::AtBarrier) waiting.push_back(w.flat);
  }
  if (waiting.empty()) return true;
  if (!done.empty()) {
    error_ = "work-items " + range_list(waiting) + " wait at s_barrier #" + std::to_string(items_[waiting[0]].barriers) +
             " but work-items " + range_list(done) + " finished without reaching it (deadlock on the GPU)";
    return false;
  }
  const WorkItem& first = items_[0];
  for (const WorkItem& w : items_) {
    if (w.barriers != first.barriers || w.site != first.site) {
      error_ = describe(w) + " is at s_barrier #" + std::to_string(w.barriers) + " while " + describe(first) +
               " is at s_barrier #" + std::to_string(first.barriers) + (w.barriers == first.barriers ? " elsewhere" : "") +
               ": the work-items disagree on which barrier this is (a barrier was skipped)";
      return false;
    }
  }
  for (WorkItem& w : items_) w.state = State::Ready;
  return true;
}

}  // namespace gfx942_emu
