// Subnormal floats flushed to zero for the duration of one kernel call, in every thread it computes on, and the
// caller's float mode restored on exit (included by attention_cpu.cpp and path_cpu.cpp).
//
// Why: a far-mass bias (ALiBi, a forget gate) drives the softmax weights of far keys into float32's subnormal
// range (below 2^-126 ≈ 1.2e-38), and PaTH's transports shrink far keys geometrically (β < 2 contracts); x86 runs
// each operation on a subnormal operand or result some hundred times slower, so a long sequence spends most of its
// time on weights that round to nothing. Flushing them (FTZ: subnormal results become 0; DAZ: subnormal operands
// read as 0) changes no value at or above 2^-126, and a weight below it is 10^-31 of float32's resolution of the
// row's largest. The kernels set it themselves so that their speed does not depend on a process setting their
// caller never made; they restore it so that they leave no lasting state (an op stays a pure tensor function).
//
// Where: the float mode is per thread (x86: MXCSR's FTZ and DAZ bits; AArch64: FPCR's FZ bit). A kernel computes
// on the calling thread and on the threads of its OpenMP team: ATen's intra-op pool, which this library shares
// (torch's libgomp is loaded first, and the loader binds this library's libgomp.so.1 to it), and which MKL's
// sgemm and ATen's fused attention use too. The guard therefore enters one parallel region of the team's full size
// and sets the mode in each of its threads, saving each thread's own previous mode in thread-local storage, and
// leaves by another region of the same size that restores it. A region inside a parallel region (a kernel called
// from an intra-op thread) is a team of one: the guard then sets and restores the calling thread only. Nested
// guards count their depth per thread, so only the outermost restores. A pool thread that the leaving region does
// not reach (the team size was changed inside the call) keeps its previous mode only if it had it already.

#pragma once

#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace accrot {

#if defined(__x86_64__) || defined(__i386__)
constexpr unsigned kFlushBits = 0x8040u;  // MXCSR: FTZ (bit 15) | DAZ (bit 6)
inline unsigned float_mode() { return _mm_getcsr(); }
inline void set_float_mode(unsigned mode) { _mm_setcsr(mode); }
#elif defined(__aarch64__)
constexpr unsigned kFlushBits = 1u << 24;  // FPCR: FZ (flushes subnormal operands and results)
inline unsigned float_mode() {
  unsigned long fpcr;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
  return static_cast<unsigned>(fpcr);
}
inline void set_float_mode(unsigned mode) {
  unsigned long fpcr = mode;
  __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr));
}
#else
constexpr unsigned kFlushBits = 0u;  // no known flush bits: the guard leaves the mode as it is
inline unsigned float_mode() { return 0u; }
inline void set_float_mode(unsigned) {}
#endif

namespace detail {
inline thread_local int flush_depth = 0;
inline thread_local unsigned saved_mode = 0;

inline void enter_thread() {
  if (flush_depth++ == 0) {
    saved_mode = float_mode();
    set_float_mode(saved_mode | kFlushBits);
  }
}

inline void leave_thread() {
  if (flush_depth > 0 && --flush_depth == 0) set_float_mode(saved_mode);
}
}  // namespace detail

// RAII: subnormals flushed in this thread and its OpenMP team while the guard lives (header comment).
class FlushSubnormals {
 public:
  FlushSubnormals() : threads_(omp_in_parallel() ? 1 : omp_get_max_threads()) {
    if (kFlushBits == 0u) return;
#pragma omp parallel num_threads(threads_)
    detail::enter_thread();
  }
  ~FlushSubnormals() {
    if (kFlushBits == 0u) return;
#pragma omp parallel num_threads(threads_)
    detail::leave_thread();
  }
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
  int threads_;
};

}  // namespace accrot
