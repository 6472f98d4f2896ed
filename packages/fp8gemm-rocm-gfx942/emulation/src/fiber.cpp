#include "fiber.hpp"

#include <cstdint>

// Frame layout, low to high: x87 control word, MXCSR, r15, r14, r13, r12, rbx, rbp, return address.
asm(R"(
  .text
  .globl gfx942_emu_switch
  .type gfx942_emu_switch, @function
gfx942_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  fnstcw (%rsp)
  stmxcsr 8(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  fldcw (%rsp)
  ldmxcsr 8(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size gfx942_emu_switch, .-gfx942_emu_switch

  .globl gfx942_emu_fiber_entry
  .type gfx942_emu_fiber_entry, @function
gfx942_emu_fiber_entry:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size gfx942_emu_fiber_entry, .-gfx942_emu_fiber_entry
)");

extern "C" void gfx942_emu_fiber_entry();

namespace gfx942_emu {

void* make_fiber(char* top, FiberMain main, void* arg) {
  auto aligned = reinterpret_cast<uintptr_t>(top) & ~uintptr_t(15);
  // After the final `ret` of gfx942_emu_switch, rsp = aligned - 16: 16-byte aligned before the call.
  auto* frame = reinterpret_cast<uint64_t*>(aligned - 16 - 9 * 8);
  uint16_t fpu_cw;
  uint32_t mxcsr;
  asm volatile("fnstcw %0" : "=m"(fpu_cw));
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  frame[0] = fpu_cw;
  frame[1] = mxcsr;
  frame[2] = 0;                                       // r15
  frame[3] = 0;                                       // r14
  frame[4] = reinterpret_cast<uint64_t>(main);        // r13
  frame[5] = reinterpret_cast<uint64_t>(arg);         // r12
  frame[6] = 0;                                       // rbx
  frame[7] = 0;                                       // rbp
  frame[8] = reinterpret_cast<uint64_t>(&gfx942_emu_fiber_entry);
  return frame;
}

}  // namespace gfx942_emu
