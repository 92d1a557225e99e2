#include "support/fiber.hpp"

#include <cstdint>

#if defined(FLASHJIT_FIBER_ASM)
#include <xmmintrin.h>

// flashjit_fiber_switch(save_sp, new_sp): pushes the System V callee-saved registers and the
// floating-point control words, stores the stack pointer in *save_sp, loads new_sp and pops the
// same from there. flashjit_fiber_trampoline: a new fiber's first return address (fiber_start
// lays out its stack); calls rbx(r12, r13) = fiber_main(entry, link) on a 16-byte aligned stack.
asm(R"(
  .pushsection .text
  .globl flashjit_fiber_switch
  .hidden flashjit_fiber_switch
  .type flashjit_fiber_switch, @function
flashjit_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size flashjit_fiber_switch, .-flashjit_fiber_switch

  .globl flashjit_fiber_trampoline
  .hidden flashjit_fiber_trampoline
  .type flashjit_fiber_trampoline, @function
flashjit_fiber_trampoline:
  movq %r12, %rdi
  movq %r13, %rsi
  callq *%rbx
  ud2
  .size flashjit_fiber_trampoline, .-flashjit_fiber_trampoline
  .popsection
)");

extern "C" void flashjit_fiber_switch(void** save_sp, void* new_sp);
extern "C" void flashjit_fiber_trampoline();
#endif

namespace flashjit::testing {

#if defined(FLASHJIT_FIBER_ASM)
namespace {

[[noreturn]] void fiber_main(void (*entry)(), Fiber* link) {
  entry();
  void* finished = nullptr;  // this fiber's last context: never resumed
  flashjit_fiber_switch(&finished, link->sp);
  __builtin_trap();
}

}  // namespace

void fiber_start(Fiber& fiber, char* stack, size_t bytes, void (*entry)(), Fiber& link) {
  // The first switch pops 8 bytes of control words and six registers, then returns to the
  // trampoline with the stack pointer at `top` (16-byte aligned, as a call needs).
  const uintptr_t top = ((reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t{15}) - 16;
  void** frame = reinterpret_cast<void**>(top - 64);
  uint16_t x87_control = 0;
  asm volatile("fnstcw %0" : "=m"(x87_control));
  const uint32_t words[2] = {_mm_getcsr(), x87_control};
  __builtin_memcpy(&frame[0], words, sizeof words);
  frame[1] = nullptr;                                              // r15
  frame[2] = nullptr;                                              // r14
  frame[3] = &link;                                                // r13: fiber_main's link
  frame[4] = reinterpret_cast<void*>(entry);                       // r12: fiber_main's entry
  frame[5] = reinterpret_cast<void*>(&fiber_main);                 // rbx: what the trampoline calls
  frame[6] = nullptr;                                              // rbp
  frame[7] = reinterpret_cast<void*>(&flashjit_fiber_trampoline);  // the return address
  fiber.sp = frame;
}

void fiber_switch(Fiber& from, Fiber& to) { flashjit_fiber_switch(&from.sp, to.sp); }

#else

void fiber_start(Fiber& fiber, char* stack, size_t bytes, void (*entry)(), Fiber& link) {
  getcontext(&fiber.context);
  fiber.context.uc_stack.ss_sp = stack;
  fiber.context.uc_stack.ss_size = bytes;
  fiber.context.uc_link = &link.context;
  makecontext(&fiber.context, entry, 0);
}

void fiber_switch(Fiber& from, Fiber& to) { swapcontext(&from.context, &to.context); }

#endif

}  // namespace flashjit::testing
