// Registering kernels with the emulator: hipLaunchKernel receives a type-erased function pointer,
// so each kernel a launcher may enqueue is listed once (GFX942_EMU_KERNEL), with an invoker that
// unpacks its argument array (one pointer per parameter, as HIP passes them).
#pragma once
#include <cstddef>
#include <type_traits>
#include <utility>

namespace gfx942_emu {

using Invoker = void (*)(void** args);

// `tls_anchor` returns the address of a thread_local in the module that holds the kernels: through
// it the emulator finds that module's thread-local block (its LDS) and poisons it per workgroup.
bool register_kernel(const void* function, Invoker invoke, const char* name, void* (*tls_anchor)());

template <class... P>
constexpr std::size_t arity(void (*)(P...)) {
  return sizeof...(P);
}

template <class... P, std::size_t... I>
void call_with(void (*f)(P...), void** args, std::index_sequence<I...>) {
  f(*static_cast<std::remove_cv_t<std::remove_reference_t<P>>*>(args[I])...);
}

template <auto F>
void invoke(void** args) {
  call_with(F, args, std::make_index_sequence<arity(F)>{});
}

namespace {
thread_local char tls_anchor_byte;
[[maybe_unused]] void* tls_anchor() { return &tls_anchor_byte; }
}  // namespace

}  // namespace gfx942_emu

#define GFX942_EMU_CONCAT_(a, b) a##b
#define GFX942_EMU_CONCAT(a, b) GFX942_EMU_CONCAT_(a, b)
#define GFX942_EMU_KERNEL(...)                                                                         \
  static const bool GFX942_EMU_CONCAT(gfx942_emu_registered_, __COUNTER__) = ::gfx942_emu::register_kernel( \
      reinterpret_cast<const void*>(&__VA_ARGS__), &::gfx942_emu::invoke<&__VA_ARGS__>, #__VA_ARGS__,  \
      &::gfx942_emu::tls_anchor)
