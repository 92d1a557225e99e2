// Cooperative fibers for the device emulators (cuda_emulator, sm90_emulator, hip_emulator): one
// per emulated thread, switched by the emulator's scheduler at every barrier and warp operation.
//
// On x86-64 a switch saves the callee-saved registers, the stack pointer, MXCSR and the x87
// control word and nothing else (fiber.cpp). glibc's swapcontext, used before, also saves the
// signal mask with a system call (rt_sigprocmask) at every switch: about half of the emulation
// tests' CPU time went to the kernel (docs/TESTING.md). Elsewhere, and under AddressSanitizer
// or ThreadSanitizer (which know ucontext's stack switches, not ours), the same interface is
// ucontext.
#pragma once

#include <cstddef>

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FLASHJIT_FIBER_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FLASHJIT_FIBER_SANITIZED 1
#endif
#if defined(__x86_64__) && defined(__linux__) && !defined(FLASHJIT_FIBER_SANITIZED)
#define FLASHJIT_FIBER_ASM 1
#else
#include <ucontext.h>
#endif

namespace flashjit::testing {

struct Fiber {
#if defined(FLASHJIT_FIBER_ASM)
  void* sp = nullptr;  // the saved stack pointer; the registers lie on that stack
#else
  ucontext_t context;
#endif
};

// Prepares `fiber` to run entry() on the stack [stack, stack + bytes) when it is first switched
// to. When entry() returns, the fiber switches to `link` and is never resumed again.
void fiber_start(Fiber& fiber, char* stack, size_t bytes, void (*entry)(), Fiber& link);

// Saves the running context into `from` and runs `to` from where it was saved (or from its
// start); returns when something switches back to `from`.
void fiber_switch(Fiber& from, Fiber& to);

}  // namespace flashjit::testing
