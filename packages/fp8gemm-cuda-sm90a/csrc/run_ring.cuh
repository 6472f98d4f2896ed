// The groups of a grouped launch on the device: the run warp (the producer's last warp) reads m_indices, `offs` or
// `masked_m` once, 256 values per round trip, and hands each run of rows (row ids: each stretch of one id in
// [0, groups), row_runs.hpp; offs and masked_m: each group with rows) through a ring of kRunSlots slots in shared
// memory to every role that walks tiles (scheduler.cuh Tiles: GroupCursor turns each run into tiles, so sorted ids
// tile as `offs` does), then a last slot with id -1. Each slot has a full barrier (the run warp's arrival) and an
// empty one (run_walkers: the roles' arrivals). Empty groups cost nothing: a walk reading the group ends one at a time
// spent one dependent load per group before its first tile (decode: 8 of 128 experts with rows).
// Nothing reads the values on the host, and every CTA finds the same runs: the walk is deterministic.
#pragma once

#include "kernel_traits.cuh"
#include "ptx.cuh"
#include "row_runs.hpp"

namespace fp8gemm_sm90a {

static_assert(kRunSlots >= 32 && (kRunSlots & (kRunSlots - 1)) == 0, "a chunk's 32 runs in distinct slots");

// The ring in the kernel's smem.red, as 32-bit shared-memory addresses (the run warp lives in the producer's 40
// registers): [full bars][empty bars][slots of {begin, end, id, -}].
__device__ __forceinline__ uint32_t run_full(uint32_t ring, int slot) { return ring + 8 * slot; }
__device__ __forceinline__ uint32_t run_empty(uint32_t ring, int slot) { return ring + 8 * (kRunSlots + slot); }
__device__ __forceinline__ uint32_t run_slot(uint32_t ring, int slot) { return ring + 16 * (kRunSlots + slot); }
static_assert(kRunRingBytes == kRunSlots * (2 * 8 + 4 * 4), "the ring's layout");

__device__ __forceinline__ void run_bar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void run_bar_arrive(uint32_t bar) {  // release: the stores before it are seen by waiters
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Arrivals that release a slot: the TMA thread and every lane of the B-scale and store warps where they run (the
// producer's roles, in its 40 registers, hold no lane mask), one per consumer warp.
template <class C>
__device__ __forceinline__ int run_walkers(const Params& p) {
  return 1 + (C::kSegmentScalesB ? 32 : 0) + (C::kStoreWarp && !p.partial && !p.out_fp32 ? 32 : 0) +
         4 * C::kConsumerWGs;
}

template <class C>
__device__ __forceinline__ void init_run_ring(float* red, const Params& p) {
  uint64_t* bars = reinterpret_cast<uint64_t*>(red);
  for (int s = 0; s < kRunSlots; ++s) {
    mbar_init(bars + s, 1);
    mbar_init(bars + kRunSlots + s, run_walkers<C>(p));
  }
}

// Run number n into its slot, once every walker has released the slot's previous run.
__device__ __forceinline__ void put_run(uint32_t ring, int n, RowRun run) {
  const int slot = n & (kRunSlots - 1);
  run_bar_wait(run_empty(ring, slot), ((n / kRunSlots) & 1) ^ 1);  // a fresh barrier passes the first round
  asm volatile("st.shared.v2.s32 [%0], {%1, %2};\nst.shared.s32 [%0+8], %3;" ::"r"(run_slot(ring, slot)),
               "r"(run.begin), "r"(run.end), "r"(run.id)
               : "memory");
  run_bar_arrive(run_full(ring, slot));
}

// The run warp's lanes as row_runs.hpp's scans take them: CUDA's load and collectives, every lane taking part.
struct RunWarp {
  __device__ __forceinline__ static int ldg(const int32_t* p) { return __ldg(p); }
  __device__ __forceinline__ static int shfl_up(int v, int d) { return __shfl_up_sync(~0u, v, d); }
  __device__ __forceinline__ static int shfl(int v, int lane) { return __shfl_sync(~0u, v, lane); }
  __device__ __forceinline__ static uint32_t ballot(bool b) { return __ballot_sync(~0u, b); }
  __device__ __forceinline__ static void sync() { __syncwarp(); }
};

// The run warp for `offs` (contiguous) and `masked_m`: every group with rows into the ring, in group order, then the end.
__device__ __forceinline__ void scan_groups(float* red, const Params& p, int lane) {
  const uint32_t ring = smem_u32(red);
  scan_group_ends<RunWarp>(p, lane, [ring](int n, RowRun run) { put_run(ring, n, run); });
}

// The run warp for m_indices: every run of one id in [0, groups) into the ring (long ones in pieces), then the end.
__device__ __forceinline__ void scan_runs(float* red, const Params& p, int lane) {
  const uint32_t ring = smem_u32(red);
  scan_row_runs<RunWarp>(p, lane, [ring](int n, RowRun run) { put_run(ring, n, run); });
}

// A walking role's place in the ring: the ring's shared-memory address and the runs taken. `every_lane`: each
// thread releases the slots it reads (the producer's roles); else a warp's lane 0 does, once the warp has read them.
struct RunReader {
  uint32_t ring;
  bool every_lane;
  int taken = 0;
  __device__ __forceinline__ RunReader(float* red, bool each) : ring(smem_u32(red)), every_lane(each) {}
  __device__ __forceinline__ RowRun next() {
    const int slot = taken & (kRunSlots - 1);
    run_bar_wait(run_full(ring, slot), (taken / kRunSlots) & 1);
    const uint32_t at = run_slot(ring, slot);
    const RowRun run{lds_s32(at), lds_s32(at + 4), lds_s32(at + 8)};
    if (!every_lane) __syncwarp();
    if (every_lane || threadIdx.x % 32 == 0) run_bar_arrive(run_empty(ring, slot));
    ++taken;
    return run;
  }
};

}  // namespace fp8gemm_sm90a
