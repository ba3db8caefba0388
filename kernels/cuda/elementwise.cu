// Copy and reduce on the device, for every dtype and op, bit-identical to collc's reference kernels
// (kernels/src/element.rs): integers wrap, f16 and bf16 combine in f32 and round to nearest even, max and min keep
// the non-NaN operand and order -0 below +0, avg divides once at the end (integers truncate toward zero). One
// difference: an f32/f64 sum or product with a NaN operand is the GPU's canonical NaN, where x86 keeps the operand's
// payload (the data checks use no NaNs).
// Each element is combined once, dst[i] = a[i] (op) b[i], so the order of a reduction is the schedule's.
//
// A range is split over the threads of one block (the interpreter) or of the grid (the standalone kernels):
// 16-byte vector loads and stores where the pointers allow, element by element elsewhere.
//
// Compiled with NVRTC at run time (no headers: the half conversions are PTX); tests also compile it for the CPU
// (COLLC_HOST, kernels/cuda/host.h), where the two conversions are the host compiler's _Float16.
// dtype and op codes come as defines from collc_kernels::cuda::program (COLLC_DTYPE_F32, COLLC_REDOP_SUM, ...), the
// Rust enums' own values; a code no case names traps (COLLC_TRAP), so the launch fails rather than skip the work.

#ifdef COLLC_HOST
#define COLLC_TRAP() __builtin_trap()
#else
#define COLLC_TRAP() __trap()
#endif

typedef signed char i8;
typedef unsigned char u8;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

struct f16 { u16 bits; };
struct bf16 { u16 bits; };

__device__ __forceinline__ float to_f32(f16 h) {
#ifdef COLLC_HOST
    return collc_host_f16_to_f32(h.bits);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
    return f;
#endif
}
__device__ __forceinline__ float to_f32(bf16 b) { return __uint_as_float(((u32)b.bits) << 16); }
// f32 -> f16: the hardware's round-to-nearest-even, and NaNs as the half crate makes them (quiet, payload kept).
__device__ __forceinline__ f16 to_f16(float f) {
    u32 x = __float_as_uint(f);
    f16 h;
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        h.bits = (u16)(((x >> 16) & 0x8000u) | 0x7c00u | 0x0200u | ((x & 0x7fffffu) >> 13));
        return h;
    }
#ifdef COLLC_HOST
    h.bits = collc_host_f32_to_f16(f);
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
#endif
    return h;
}
// f32 -> bf16 exactly as the half crate rounds (nearest even; NaNs quiet, payload kept), on every architecture.
__device__ __forceinline__ bf16 to_bf16(float f) {
    u32 x = __float_as_uint(f);
    bf16 b;
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        b.bits = (u16)((x >> 16) | 0x0040u);
        return b;
    }
    const u32 round_bit = 0x8000u;
    b.bits = (u16)((x >> 16) + (((x & round_bit) != 0 && (x & (3 * round_bit - 1)) != 0) ? 1u : 0u));
    return b;
}

__device__ __forceinline__ bool negative(float x) { return (__float_as_uint(x) >> 31) != 0; }
__device__ __forceinline__ bool negative(double x) { return __double_as_longlong(x) < 0; }

template <typename F> __device__ __forceinline__ F max_ref(F a, F b) {
    if (a != a) return b;
    if (b != b || a > b || (a == b && negative(b))) return a;
    return b;
}
template <typename F> __device__ __forceinline__ F min_ref(F a, F b) {
    if (a != a) return b;
    if (b != b || a < b || (a == b && negative(a))) return a;
    return b;
}

enum {
    OP_SUM = COLLC_REDOP_SUM,
    OP_PROD = COLLC_REDOP_PROD,
    OP_MAX = COLLC_REDOP_MAX,
    OP_MIN = COLLC_REDOP_MIN,
    OP_AVG = COLLC_REDOP_AVG,
    OP_PREMULSUM = COLLC_REDOP_PREMULSUM,
    OP_USER = COLLC_REDOP_USER
};

// Integers: arithmetic in the unsigned type of the same width, so overflow wraps as Rust's wrapping_add.
template <typename T, typename U, int OP> struct IntOp {
    __device__ __forceinline__ static T apply(T a, T b) {
        if (OP == OP_PROD) return (T)(U)((U)a * (U)b);
        if (OP == OP_MAX) return a > b ? a : b;
        if (OP == OP_MIN) return a < b ? a : b;
        return (T)(U)((U)a + (U)b);
    }
};
template <typename F, int OP> struct FloatOp {
    __device__ __forceinline__ static F apply(F a, F b) {
        if (OP == OP_PROD) return a * b;
        if (OP == OP_MAX) return max_ref(a, b);
        if (OP == OP_MIN) return min_ref(a, b);
        return a + b;
    }
};
template <typename H, int OP> struct HalfOp {
    __device__ __forceinline__ static H apply(H a, H b);
};
template <int OP> struct HalfOp<f16, OP> {
    __device__ __forceinline__ static f16 apply(f16 a, f16 b) { return to_f16(FloatOp<float, OP>::apply(to_f32(a), to_f32(b))); }
};
template <int OP> struct HalfOp<bf16, OP> {
    __device__ __forceinline__ static bf16 apply(bf16 a, bf16 b) { return to_bf16(FloatOp<float, OP>::apply(to_f32(a), to_f32(b))); }
};

// dst[i] = a[i] (op) b[i] for i in [0, n), split over `nthreads` threads; 16-byte vectors when all three are aligned.
template <typename T, typename Op>
__device__ __forceinline__ void reduce_range(T* dst, const T* a, const T* b, u64 n, u32 tid, u32 nthreads) {
    const u32 V = 16 / sizeof(T);
    u64 start = 0;
    if (((((u64)dst) | ((u64)a) | ((u64)b)) & 15) == 0) {
        u64 vectors = n / V;
        for (u64 v = tid; v < vectors; v += nthreads) {
            uint4 x = ((const uint4*)a)[v];
            uint4 y = ((const uint4*)b)[v];
            uint4 z;
            const T* xs = (const T*)&x;
            const T* ys = (const T*)&y;
            T* zs = (T*)&z;
#pragma unroll
            for (u32 j = 0; j < V; j++) zs[j] = Op::apply(xs[j], ys[j]);
            ((uint4*)dst)[v] = z;
        }
        start = vectors * V;
    }
    for (u64 i = start + tid; i < n; i += nthreads) dst[i] = Op::apply(a[i], b[i]);
}

template <int OP>
__device__ __forceinline__ void reduce_op(u32 dtype, void* dst, const void* a, const void* b, u64 n, u32 tid, u32 nt) {
    switch (dtype) {
    case COLLC_DTYPE_I8: reduce_range<i8, IntOp<i8, u8, OP> >((i8*)dst, (const i8*)a, (const i8*)b, n, tid, nt); break;
    case COLLC_DTYPE_U8: reduce_range<u8, IntOp<u8, u8, OP> >((u8*)dst, (const u8*)a, (const u8*)b, n, tid, nt); break;
    case COLLC_DTYPE_I32: reduce_range<i32, IntOp<i32, u32, OP> >((i32*)dst, (const i32*)a, (const i32*)b, n, tid, nt); break;
    case COLLC_DTYPE_U32: reduce_range<u32, IntOp<u32, u32, OP> >((u32*)dst, (const u32*)a, (const u32*)b, n, tid, nt); break;
    case COLLC_DTYPE_I64: reduce_range<i64, IntOp<i64, u64, OP> >((i64*)dst, (const i64*)a, (const i64*)b, n, tid, nt); break;
    case COLLC_DTYPE_U64: reduce_range<u64, IntOp<u64, u64, OP> >((u64*)dst, (const u64*)a, (const u64*)b, n, tid, nt); break;
    case COLLC_DTYPE_F16: reduce_range<f16, HalfOp<f16, OP> >((f16*)dst, (const f16*)a, (const f16*)b, n, tid, nt); break;
    case COLLC_DTYPE_F32: reduce_range<float, FloatOp<float, OP> >((float*)dst, (const float*)a, (const float*)b, n, tid, nt); break;
    case COLLC_DTYPE_F64: reduce_range<double, FloatOp<double, OP> >((double*)dst, (const double*)a, (const double*)b, n, tid, nt); break;
    case COLLC_DTYPE_BF16: reduce_range<bf16, HalfOp<bf16, OP> >((bf16*)dst, (const bf16*)a, (const bf16*)b, n, tid, nt); break;
    default: COLLC_TRAP();
    }
}

// Users' operators (their structs and collc_user_reduce are generated after this file by
// collc_kernels::operator::device, or collc_user_reduce is a stub that traps): the arithmetic the generated code
// calls. Integers wrap (computed in the unsigned type of their width), / and % never trap (by 0: 0; MIN / -1 wraps),
// a float cast to an integer saturates (NaN: 0); round_f16/round_bf16 round a float to a half type's value.
template <typename T, typename U> __device__ __forceinline__ T uo_add(T x, T y) { return (T)(U)((U)x + (U)y); }
template <typename T, typename U> __device__ __forceinline__ T uo_sub(T x, T y) { return (T)(U)((U)x - (U)y); }
template <typename T, typename U> __device__ __forceinline__ T uo_mul(T x, T y) { return (T)(U)((U)x * (U)y); }
template <typename T, typename U> __device__ __forceinline__ T uo_neg(T x) { return (T)(U)((U)0 - (U)x); }
template <typename T, typename U> __device__ __forceinline__ T uo_abs(T x) { return x < 0 ? uo_neg<T, U>(x) : x; }
template <typename T, typename U> __device__ __forceinline__ T uo_sdiv(T x, T y) {
    return y == 0 ? (T)0 : y == (T)-1 ? uo_neg<T, U>(x) : (T)(x / y);
}
template <typename T> __device__ __forceinline__ T uo_srem(T x, T y) { return (y == 0 || y == (T)-1) ? (T)0 : (T)(x % y); }
template <typename T> __device__ __forceinline__ T uo_udiv(T x, T y) { return y == 0 ? (T)0 : (T)(x / y); }
template <typename T> __device__ __forceinline__ T uo_urem(T x, T y) { return y == 0 ? (T)0 : (T)(x % y); }
template <typename T> __device__ __forceinline__ T uo_min(T x, T y) { return x < y ? x : y; }
template <typename T> __device__ __forceinline__ T uo_max(T x, T y) { return x > y ? x : y; }
__device__ __forceinline__ float uo_fabs(float x) { return __uint_as_float(__float_as_uint(x) & 0x7fffffffu); }
__device__ __forceinline__ double uo_fabs(double x) {
    return __longlong_as_double(__double_as_longlong(x) & 0x7fffffffffffffffll);
}
template <typename T> __device__ __forceinline__ T uo_sat(double v, double lo, double hi, T at_lo, T at_hi) {
    return v != v ? (T)0 : v <= lo ? at_lo : v >= hi ? at_hi : (T)v;
}
__device__ __forceinline__ float round_f16(float v) { return to_f32(to_f16(v)); }
__device__ __forceinline__ float round_bf16(float v) { return to_f32(to_bf16(v)); }
__device__ void collc_user_reduce(u32 dtype, void* dst, const void* a, const void* b, u64 n, u32 tid, u32 nt);

// dst = a (op) b over n elements of `dtype`; avg combines as sum.
__device__ __forceinline__ void reduce_any(u32 dtype, u32 op, void* dst, const void* a, const void* b, u64 n, u32 tid,
                                           u32 nt) {
    switch (op) {
    case OP_PROD: reduce_op<OP_PROD>(dtype, dst, a, b, n, tid, nt); break;
    case OP_MAX: reduce_op<OP_MAX>(dtype, dst, a, b, n, tid, nt); break;
    case OP_MIN: reduce_op<OP_MIN>(dtype, dst, a, b, n, tid, nt); break;
    case OP_SUM:
    case OP_AVG:
    case OP_PREMULSUM: reduce_op<OP_SUM>(dtype, dst, a, b, n, tid, nt); break;
    case OP_USER: collc_user_reduce(dtype, dst, a, b, n, tid, nt); break;
    default: COLLC_TRAP();
    }
}

// PreMulSum's factor, one element of T in the low bytes of `bits` (the encoder's little-endian `factor` word).
template <typename T> __device__ __forceinline__ T from_bits(u64 bits) { return (T)bits; }
template <> __device__ __forceinline__ float from_bits<float>(u64 bits) { return __uint_as_float((u32)bits); }
template <> __device__ __forceinline__ double from_bits<double>(u64 bits) { return __longlong_as_double((long long)bits); }
template <> __device__ __forceinline__ f16 from_bits<f16>(u64 bits) { f16 h; h.bits = (u16)bits; return h; }
template <> __device__ __forceinline__ bf16 from_bits<bf16>(u64 bits) { bf16 h; h.bits = (u16)bits; return h; }

// PreMulSum: dst[i] = a'[i] + b'[i], an operand multiplied by the factor first where its flag says it is the rank's
// input as it came (Prod's arithmetic, then Sum's: reference::premultiply then reduce); with b null, dst[i] = a'[i].
// Element by element: only the reads of a rank's own input take this path.
template <typename T, typename Mul, typename Add>
__device__ __forceinline__ void premul_range(T* dst, const T* a, bool scale_a, const T* b, bool scale_b, u64 factor_bits,
                                             u64 n, u32 tid, u32 nthreads) {
    T factor = from_bits<T>(factor_bits);
    for (u64 i = tid; i < n; i += nthreads) {
        T x = scale_a ? Mul::apply(a[i], factor) : a[i];
        if (b == 0) {
            dst[i] = x;
            continue;
        }
        T y = scale_b ? Mul::apply(b[i], factor) : b[i];
        dst[i] = Add::apply(x, y);
    }
}

// Each type's operators by code, for premul_as.
template <int OP> using OpI8 = IntOp<i8, u8, OP>;
template <int OP> using OpU8 = IntOp<u8, u8, OP>;
template <int OP> using OpI32 = IntOp<i32, u32, OP>;
template <int OP> using OpU32 = IntOp<u32, u32, OP>;
template <int OP> using OpI64 = IntOp<i64, u64, OP>;
template <int OP> using OpU64 = IntOp<u64, u64, OP>;
template <int OP> using OpF16 = HalfOp<f16, OP>;
template <int OP> using OpF32 = FloatOp<float, OP>;
template <int OP> using OpF64 = FloatOp<double, OP>;
template <int OP> using OpBf16 = HalfOp<bf16, OP>;

template <typename T, template <int> class Ops>
__device__ __forceinline__ void premul_as(void* dst, const void* a, bool scale_a, const void* b, bool scale_b, u64 factor,
                                          u64 n, u32 tid, u32 nt) {
    premul_range<T, Ops<OP_PROD>, Ops<OP_SUM> >((T*)dst, (const T*)a, scale_a, (const T*)b, scale_b, factor, n, tid, nt);
}

__device__ __forceinline__ void premul_any(u32 dtype, void* dst, const void* a, bool scale_a, const void* b, bool scale_b,
                                           u64 factor, u64 n, u32 tid, u32 nt) {
    switch (dtype) {
    case COLLC_DTYPE_I8: premul_as<i8, OpI8>(dst, a, scale_a, b, scale_b, factor, n, tid, nt); break;
    case COLLC_DTYPE_U8: premul_as<u8, OpU8>(dst, a, scale_a, b, scale_b, factor, n, tid, nt); break;
    case COLLC_DTYPE_I32: premul_as<i32, OpI32>(dst, a, scale_a, b, scale_b, factor, n, tid, nt); break;
    case COLLC_DTYPE_U32: premul_as<u32, OpU32>(dst, a, scale_a, b, scale_b, factor, n, tid, nt); break;
    case COLLC_DTYPE_I64: premul_as<i64, OpI64>(dst, a, scale_a, b, scale_b, factor, n, tid, nt); break;
    case COLLC_DTYPE_U64: premul_as<u64, OpU64>(dst, a, scale_a, b, scale_b, factor, n, tid, nt); break;
    case COLLC_DTYPE_F16: premul_as<f16, OpF16>(dst, a, scale_a, b, scale_b, factor, n, tid, nt); break;
    case COLLC_DTYPE_F32: premul_as<float, OpF32>(dst, a, scale_a, b, scale_b, factor, n, tid, nt); break;
    case COLLC_DTYPE_F64: premul_as<double, OpF64>(dst, a, scale_a, b, scale_b, factor, n, tid, nt); break;
    case COLLC_DTYPE_BF16: premul_as<bf16, OpBf16>(dst, a, scale_a, b, scale_b, factor, n, tid, nt); break;
    default: COLLC_TRAP();
    }
}

// Copies `bytes` bytes: 16-byte vectors once both pointers are aligned alike (after a head of single bytes), else
// 4-byte words when they allow, else bytes.
__device__ __forceinline__ void copy_range(u8* dst, const u8* src, u64 bytes, u32 tid, u32 nthreads) {
    u64 head = 0;
    if ((((u64)dst ^ (u64)src) & 15) == 0) {
        head = (16 - ((u64)dst & 15)) & 15;
        if (head > bytes) head = bytes;
        u64 vectors = (bytes - head) / 16;
        const uint4* s = (const uint4*)(src + head);
        uint4* d = (uint4*)(dst + head);
        for (u64 v = tid; v < vectors; v += nthreads) d[v] = s[v];
        for (u64 i = tid; i < head; i += nthreads) dst[i] = src[i];
        for (u64 i = head + vectors * 16 + tid; i < bytes; i += nthreads) dst[i] = src[i];
        return;
    }
    if (((((u64)dst) | ((u64)src)) & 3) == 0) {
        u64 words = bytes / 4;
        for (u64 w = tid; w < words; w += nthreads) ((u32*)dst)[w] = ((const u32*)src)[w];
        for (u64 i = words * 4 + tid; i < bytes; i += nthreads) dst[i] = src[i];
        return;
    }
    for (u64 i = tid; i < bytes; i += nthreads) dst[i] = src[i];
}

template <typename T> __device__ __forceinline__ T divide_int(T v, u32 n) { return (T)(v / (T)n); }

// The last step of avg: every element divided by the rank count, as reference::finish_avg.
__device__ __forceinline__ void divide_range(u32 dtype, void* buf, u64 n, u32 ranks, u32 tid, u32 nt) {
    for (u64 i = tid; i < n; i += nt) {
        switch (dtype) {
        case COLLC_DTYPE_I8: ((i8*)buf)[i] = (i8)((i32)((i8*)buf)[i] / (i32)ranks); break;
        case COLLC_DTYPE_U8: ((u8*)buf)[i] = (u8)((u32)((u8*)buf)[i] / ranks); break;
        case COLLC_DTYPE_I32: ((i32*)buf)[i] = (i32)((i64)((i32*)buf)[i] / (i64)ranks); break;
        case COLLC_DTYPE_U32: ((u32*)buf)[i] = ((u32*)buf)[i] / ranks; break;
        case COLLC_DTYPE_I64: ((i64*)buf)[i] = ((i64*)buf)[i] / (i64)ranks; break;
        case COLLC_DTYPE_U64: ((u64*)buf)[i] = ((u64*)buf)[i] / (u64)ranks; break;
        case COLLC_DTYPE_F16: ((f16*)buf)[i] = to_f16(to_f32(((f16*)buf)[i]) / (float)ranks); break;
        case COLLC_DTYPE_F32: ((float*)buf)[i] = ((float*)buf)[i] / (float)ranks; break;
        case COLLC_DTYPE_F64: ((double*)buf)[i] = ((double*)buf)[i] / (double)ranks; break;
        case COLLC_DTYPE_BF16: ((bf16*)buf)[i] = to_bf16(to_f32(((bf16*)buf)[i]) / (float)ranks); break;
        default: COLLC_TRAP();
        }
    }
}

// Standalone kernels over the whole grid: the bandwidth benchmark's copy and reduce, and an empty kernel whose
// launch is the latency floor.
extern "C" __global__ void collc_copy(u8* dst, const u8* src, u64 bytes) {
    copy_range(dst, src, bytes, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}

extern "C" __global__ void collc_reduce(u32 dtype, u32 op, void* dst, const void* a, const void* b, u64 n) {
    reduce_any(dtype, op, dst, a, b, n, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}

extern "C" __global__ void collc_divide(u32 dtype, void* buf, u64 n, u32 ranks) {
    divide_range(dtype, buf, n, ranks, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}

extern "C" __global__ void collc_empty() {}
