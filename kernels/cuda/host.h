// The CUDA built-ins the kernels use, for a host C++ compiler: tests compile kernels/cuda/*.cu for the CPU with
// this prelude and host_launch.cpp after them, so the interpreter's own source runs in CI where no GPU is.
//
// A launch runs each block on an OS thread of its own and the block's threads as coroutines on it (ucontext):
// `__shared__` is thread-local, so it is per block, and `__syncthreads` hands over to the block's next thread, so the
// threads run one barrier interval each, in turn (alternating the order), as a barrier lets them. Fences are full
// fences and `volatile` is the only other ordering, as on the device. Reading the clock is where a waiting block
// gives up the CPU, so blocks that wait on each other make progress on a machine of two cores.

#include <math.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#define COLLC_HOST 1
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local

struct collc_dim3 {
    unsigned x, y, z;
};
extern thread_local collc_dim3 threadIdx, blockIdx, blockDim, gridDim;

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};

inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
inline long long __double_as_longlong(double d) {
    long long l;
    memcpy(&l, &d, 8);
    return l;
}
inline double __longlong_as_double(long long l) {
    double d;
    memcpy(&d, &l, 8);
    return d;
}

inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __syncthreads();

// cvt.f32.f16 and cvt.rn.f16.f32: IEEE conversions, as _Float16's.
inline float collc_host_f16_to_f32(unsigned short bits) {
    _Float16 h;
    memcpy(&h, &bits, 2);
    return (float)h;
}
inline unsigned short collc_host_f32_to_f16(float f) {
    _Float16 h = (_Float16)f;
    unsigned short bits;
    memcpy(&bits, &h, 2);
    return bits;
}

// %globaltimer.
inline unsigned long long collc_host_now_ns() {
    sched_yield();
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}
