// Minimal stackful fibers: one context switch saves the callee-saved registers on the current stack
// and swaps stack pointers (x86-64 System V). About 20x cheaper than swapcontext, which makes a
// system call per switch; the emulator switches twice per work-item at every barrier and MFMA.
#pragma once
#include <cstddef>

#if !defined(__x86_64__)
#error "the gfx942 emulator's fibers are written for x86-64"
#endif

extern "C" {
// Saves the current context's stack pointer to *save and continues the one saved in `load`.
void gfx942_emu_switch(void** save, void* load);
}

namespace gfx942_emu {

using FiberMain = void (*)(void* arg);

// The stack pointer of a fiber that, when first switched to, calls main(arg). `top`: the stack's end
// (highest address). main must never return: it switches away for the last time instead.
void* make_fiber(char* top, FiberMain main, void* arg);

}  // namespace gfx942_emu
