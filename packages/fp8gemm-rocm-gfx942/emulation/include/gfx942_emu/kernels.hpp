// Registering kernels with the emulator. hipLaunchKernel receives a type-erased function pointer and
// an array of argument addresses, so the emulator must know each kernel's parameter types:
// hipLaunchKernelGGL (typed) registers its kernel itself; a source that calls hipLaunchKernel with a
// void* lists its kernels once with GFX942_EMU_KERNEL next to the #include of that source.
#pragma once
#include <cstddef>
#include <type_traits>
#include <utility>

namespace gfx942_emu {

using Invoker = void (*)(const void* function, void** args);

// `tls_anchor` returns the address of a thread_local in the module that holds the kernel: through it
// the emulator finds that module's thread-local block (its LDS) and poisons it per workgroup.
bool register_kernel(const void* function, Invoker invoke, const char* name, void* (*tls_anchor)());

template <class... P, std::size_t... I>
void call_with(void (*f)(P...), void** args, std::index_sequence<I...>) {
  f(*static_cast<std::remove_cv_t<std::remove_reference_t<P>>*>(args[I])...);
}

template <class... P>
void invoke_as(const void* function, void** args) {
  call_with(reinterpret_cast<void (*)(P...)>(const_cast<void*>(function)), args, std::index_sequence_for<P...>{});
}

namespace {
thread_local char tls_anchor_byte;
[[maybe_unused]] void* tls_anchor() { return &tls_anchor_byte; }
}  // namespace

template <class... P>
bool register_kernel(void (*kernel)(P...), const char* name) {
  return register_kernel(reinterpret_cast<const void*>(kernel), &invoke_as<P...>, name, &tls_anchor);
}

}  // namespace gfx942_emu

#define GFX942_EMU_CONCAT_(a, b) a##b
#define GFX942_EMU_CONCAT(a, b) GFX942_EMU_CONCAT_(a, b)
#define GFX942_EMU_KERNEL(...)                                                  \
  [[maybe_unused]] static const bool GFX942_EMU_CONCAT(gfx942_emu_registered_, __COUNTER__) = \
      ::gfx942_emu::register_kernel(&__VA_ARGS__, #__VA_ARGS__)
