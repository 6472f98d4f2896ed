"""The sm90a run warp's scans (csrc/row_runs.hpp) on the host: C++ that runs a scan's own source on 32 threads, one per
lane (shuffles, ballots and __syncwarp through a std::barrier; each lane's put_run recorded instead of stored in the
ring), and the build of a driver around it (C++20 for std::barrier, threads)."""

from __future__ import annotations

import subprocess

from contiguous_tile_driver import CORE_INCLUDE
from isa import ROOT, require_tool

HOST_WARP = r"""
#include <algorithm>
#include <barrier>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>
#include "row_runs.hpp"
using namespace fp8gemm_sm90a;

// The run warp on the host, one std::thread per lane: a collective puts each lane's value in `slot`, meets the other
// lanes at the barrier, reads, and meets them again (so no lane's next value overwrites one not yet read).
struct HostWarp {
  static inline std::barrier<>* meet = nullptr;
  static inline int slot[32];
  static inline const int32_t* values = nullptr;  // what a lane may load: values[0, count)
  static inline int count = 0;
  static inline thread_local int lane = 0;
  static int exchange(int value, int src) {
    slot[lane] = value;
    meet->arrive_and_wait();
    const int got = slot[src];
    meet->arrive_and_wait();
    return got;
  }
  static int ldg(const int32_t* at) {
    const long long i = at - values;
    if (i < 0 || i >= count) {
      std::fprintf(stderr, "lane %d loads value %lld of %d\n", lane, i, count);
      std::_Exit(3);
    }
    return *at;
  }
  static int shfl_up(int value, int d) { return exchange(value, lane >= d ? lane - d : lane); }
  static int shfl(int value, int src) { return exchange(value, src); }
  static uint32_t ballot(bool pred) {
    slot[lane] = pred;
    meet->arrive_and_wait();
    uint32_t bits = 0;
    for (int l = 0; l < 32; ++l) bits |= uint32_t(slot[l] != 0) << l;
    meet->arrive_and_wait();
    return bits;
  }
  static void sync() { meet->arrive_and_wait(); }
};

// What the lanes handed to put_run: run number n from `lane`, in run-number order (the ring's slots in turn).
struct Put { int n, lane; RowRun run; };

// scan(lane, put_run) on 32 lanes that may load values[0, count).
template <class Scan>
std::vector<Put> run_lanes(const int32_t* values, int count, Scan&& scan) {
  std::vector<Put> puts;
  std::mutex lock;
  std::barrier<> meet(32);
  HostWarp::meet = &meet, HostWarp::values = values, HostWarp::count = count;
  std::vector<std::thread> lanes;
  for (int l = 0; l < 32; ++l)
    lanes.emplace_back([&, l] {
      HostWarp::lane = l;
      scan(l, [&](int n, RowRun run) {
        const std::lock_guard<std::mutex> hold(lock);
        puts.push_back({n, l, run});
      });
    });
  for (auto& lane : lanes) lane.join();
  std::stable_sort(puts.begin(), puts.end(), [](const Put& a, const Put& b) { return a.n < b.n; });
  return puts;
}
"""


def build_threaded_driver(out, source: str):
    """``source`` built with the host compiler over the sm90a package's headers; returned, a run on a stdin text that
    gives back its stdout (a lane's load outside its values fails it)."""
    csrc = ROOT / "packages" / "fp8gemm-cuda-sm90a" / "csrc"
    (out / "driver.cpp").write_text(source)
    build = [require_tool("g++"), "-std=c++20", "-O1", "-pthread", f"-I{csrc}", f"-I{CORE_INCLUDE}"]
    subprocess.run([*build, str(out / "driver.cpp"), "-o", str(out / "driver")], check=True)

    def run(stdin_text: str) -> str:
        # a timeout: a collective that some lanes skip leaves the others waiting at the barrier
        result = subprocess.run([str(out / "driver")], input=stdin_text, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout

    return run
