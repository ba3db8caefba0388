//! PreMulSum on the host: `dst = a' + b'`, an operand multiplied by its factor first where it is a rank's input as it
//! came, in one pass over vector blocks: each block of an operand is multiplied by a block of its factor (`Prod`'s
//! lane arithmetic) and the two summed (`Sum`'s) while in registers, so it matches [`crate::reference::premultiply`]
//! then [`crate::reference::reduce`] bit for bit and moves no more memory than a sum. The loop is compiled per data
//! type, per which operands carry a factor, and per instruction set, picked like the reduce kernels'.

use half::{bf16, f16};

use super::isa::VectorIsa;
use super::lane::{combine_lane, Block, Lane, Prod, Sum};
use crate::{DataType, Scalar, ScalarError};

/// A factor in one data type: one element, little-endian in the low bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Factor {
    dtype: DataType,
    element: [u8; 8],
}

impl Factor {
    /// `scalar` in `dtype`, or why that type cannot hold it.
    pub fn of(dtype: DataType, scalar: Scalar) -> Result<Factor, ScalarError> {
        Ok(Factor::new(dtype, scalar.element(dtype)?))
    }

    /// A factor from its element bytes (`Scalar::element`'s form), as another rank sent them.
    pub fn new(dtype: DataType, element: [u8; 8]) -> Factor {
        Factor { dtype, element }
    }

    /// The factor as one element, for a message.
    pub fn element(&self) -> [u8; 8] {
        self.element
    }

    /// `dst[i] = src[i] * factor` for `n_elems` elements.
    ///
    /// # Safety
    /// As [`super::reduce`] with `a = src`: `dst` is exactly `src` or does not overlap it.
    pub unsafe fn apply(&self, dst: *mut u8, src: *const u8, n_elems: usize) {
        // SAFETY: forwarded from the caller; `b` is never read in this mode.
        unsafe { run(self.dtype, Mode::Scale, dst, src, std::ptr::null(), self.element, [0; 8], n_elems) }
    }
}

/// `dst[i] = a'[i] + b'[i]`, where an operand with a factor is multiplied by it first (a rank's input as it came,
/// under PreMulSum) and one without is read as it is. Without either factor it is the `Sum` kernel.
///
/// # Safety
/// As [`super::reduce`]; both factors are of `dtype`.
pub unsafe fn premul_sum(
    dtype: DataType,
    dst: *mut u8,
    (a, a_factor): (*const u8, Option<&Factor>),
    (b, b_factor): (*const u8, Option<&Factor>),
    n_elems: usize,
) {
    let element = |factor: Option<&Factor>| factor.map_or([0; 8], |f| f.element);
    let mode = match (a_factor.is_some(), b_factor.is_some()) {
        // SAFETY: forwarded from the caller.
        (false, false) => return unsafe { super::reduce(dtype, crate::ReduceOp::Sum, dst, a, b, n_elems) },
        (true, false) => Mode::ScaleA,
        (false, true) => Mode::ScaleB,
        (true, true) => Mode::ScaleBoth,
    };
    // SAFETY: forwarded from the caller.
    unsafe { run(dtype, mode, dst, a, b, element(a_factor), element(b_factor), n_elems) }
}

/// Which operands a pass multiplies: `Scale` is `dst = a * fa` (no `b`).
#[derive(Clone, Copy)]
enum Mode {
    Scale,
    ScaleA,
    ScaleB,
    ScaleBoth,
}

/// # Safety
/// As [`premul_sum`]; `b` is read unless `mode` is `Scale`.
#[allow(clippy::too_many_arguments)]
unsafe fn run(
    dtype: DataType,
    mode: Mode,
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    fa: [u8; 8],
    fb: [u8; 8],
    n: usize,
) {
    let isa = VectorIsa::detected();
    // SAFETY: forwarded from the caller; each arm reads the factors as the scalar of `dtype`.
    unsafe {
        match dtype {
            DataType::I8 => by_mode::<i8>(isa, mode, dst, a, b, fa, fb, n),
            DataType::U8 => by_mode::<u8>(isa, mode, dst, a, b, fa, fb, n),
            DataType::I32 => by_mode::<i32>(isa, mode, dst, a, b, fa, fb, n),
            DataType::U32 => by_mode::<u32>(isa, mode, dst, a, b, fa, fb, n),
            DataType::I64 => by_mode::<i64>(isa, mode, dst, a, b, fa, fb, n),
            DataType::U64 => by_mode::<u64>(isa, mode, dst, a, b, fa, fb, n),
            DataType::F16 => by_mode::<f16>(isa, mode, dst, a, b, fa, fb, n),
            DataType::F32 => by_mode::<f32>(isa, mode, dst, a, b, fa, fb, n),
            DataType::F64 => by_mode::<f64>(isa, mode, dst, a, b, fa, fb, n),
            DataType::Bf16 => by_mode::<bf16>(isa, mode, dst, a, b, fa, fb, n),
        }
    }
}

/// # Safety
/// As [`run`], with `T` the scalar of its data type.
#[allow(clippy::too_many_arguments)]
unsafe fn by_mode<T: Lane>(
    isa: VectorIsa,
    mode: Mode,
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    fa: [u8; 8],
    fb: [u8; 8],
    n: usize,
) {
    // The factors as lanes, in the buffers' little-endian form.
    // SAFETY: 8 bytes hold one element of any type; read unaligned.
    let (fa, fb) = unsafe { (fa.as_ptr().cast::<T>().read_unaligned(), fb.as_ptr().cast::<T>().read_unaligned()) };
    let (dst, a, b) = (dst.cast::<T>(), a.cast::<T>(), b.cast::<T>());
    // SAFETY: forwarded from the caller; `isa` is what this CPU has.
    unsafe {
        match mode {
            Mode::Scale => with_isa::<T, true, false, false>(isa, dst, a, b, fa, fb, n),
            Mode::ScaleA => with_isa::<T, true, false, true>(isa, dst, a, b, fa, fb, n),
            Mode::ScaleB => with_isa::<T, false, true, true>(isa, dst, a, b, fa, fb, n),
            Mode::ScaleBoth => with_isa::<T, true, true, true>(isa, dst, a, b, fa, fb, n),
        }
    }
}

/// # Safety
/// As [`run`], in elements of `T`; `isa` no wider than the CPU's.
unsafe fn with_isa<T: Lane, const SA: bool, const SB: bool, const B: bool>(
    isa: VectorIsa,
    dst: *mut T,
    a: *const T,
    b: *const T,
    fa: T,
    fb: T,
    n: usize,
) {
    // SAFETY: forwarded from the caller, who checked `isa` against the CPU.
    unsafe {
        match isa {
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            VectorIsa::Avx512 => x86::avx512::<T, SA, SB, B>(dst, a, b, fa, fb, n),
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            VectorIsa::Avx2 => x86::avx2::<T, SA, SB, B>(dst, a, b, fa, fb, n),
            _ => premul_all::<T, SA, SB, B, false>(dst, a, b, fa, fb, n),
        }
    }
}

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
mod x86 {
    use super::{premul_all, Lane};

    /// # Safety
    /// As `premul_all`, on a CPU with AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn avx2<T: Lane, const SA: bool, const SB: bool, const B: bool>(
        dst: *mut T,
        a: *const T,
        b: *const T,
        fa: T,
        fb: T,
        n: usize,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { premul_all::<T, SA, SB, B, true>(dst, a, b, fa, fb, n) }
    }

    /// # Safety
    /// As `premul_all`, on a CPU with AVX-512 F, BW, DQ and VL, and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,f16c")]
    pub(super) unsafe fn avx512<T: Lane, const SA: bool, const SB: bool, const B: bool>(
        dst: *mut T,
        a: *const T,
        b: *const T,
        fa: T,
        fb: T,
        n: usize,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { premul_all::<T, SA, SB, B, true>(dst, a, b, fa, fb, n) }
    }
}

/// `dst[i] = a'[i] (+ b'[i] when B)`, an operand multiplied by its factor when `SA` / `SB`: whole wide blocks, then
/// narrow ones, then single elements.
///
/// # Safety
/// As [`super::reduce`] in elements of `T` (`b` unread unless `B`); with `F16C`, the CPU has F16C.
#[inline(always)]
unsafe fn premul_all<T: Lane, const SA: bool, const SB: bool, const B: bool, const F16C: bool>(
    dst: *mut T,
    a: *const T,
    b: *const T,
    fa: T,
    fb: T,
    n: usize,
) {
    // SAFETY: each access stays below `n`, which the caller vouches for.
    unsafe {
        let done = premul_blocks::<T, T::Wide, SA, SB, B, F16C>(dst, a, b, fa, fb, 0, n);
        let done = premul_blocks::<T, T::Narrow, SA, SB, B, F16C>(dst, a, b, fa, fb, done, n);
        for i in done..n {
            let mut x = a.add(i).read_unaligned();
            if SA {
                x = combine_lane::<T, Prod>(x, fa);
            }
            if B {
                let mut y = b.add(i).read_unaligned();
                if SB {
                    y = combine_lane::<T, Prod>(y, fb);
                }
                x = combine_lane::<T, Sum>(x, y);
            }
            dst.add(i).write_unaligned(x);
        }
    }
}

/// Whole blocks of `K` from element `start` while one fits before `n`; the index of the first element left over.
#[inline(always)]
unsafe fn premul_blocks<T: Lane, K: Block<T>, const SA: bool, const SB: bool, const B: bool, const F16C: bool>(
    dst: *mut T,
    a: *const T,
    b: *const T,
    fa: T,
    fb: T,
    start: usize,
    n: usize,
) -> usize {
    let (mut fa_block, mut fb_block) = (std::mem::MaybeUninit::<K>::uninit(), std::mem::MaybeUninit::<K>::uninit());
    // SAFETY: a block is `K::LEN` lanes of a plain scalar, every one written here before the block is read.
    let (fa_block, fb_block) = unsafe {
        for k in 0..K::LEN {
            fa_block.as_mut_ptr().cast::<T>().add(k).write(fa);
            fb_block.as_mut_ptr().cast::<T>().add(k).write(fb);
        }
        (fa_block.assume_init(), fb_block.assume_init())
    };
    let mut index = start;
    while n - index >= K::LEN {
        // SAFETY: `index + K::LEN <= n`; both operands are read before `dst` is written; `F16C` from the caller.
        unsafe {
            let mut x = a.add(index).cast::<K>().read_unaligned();
            if SA {
                T::combine_block::<Prod, F16C>(x.lanes_mut(), fa_block.lanes());
            }
            if B {
                let mut y = b.add(index).cast::<K>().read_unaligned();
                if SB {
                    T::combine_block::<Prod, F16C>(y.lanes_mut(), fb_block.lanes());
                }
                T::combine_block::<Sum, F16C>(x.lanes_mut(), y.lanes());
            }
            dst.add(index).cast::<K>().write_unaligned(x);
        }
        super::blocks::one_block_at_a_time();
        index += K::LEN;
    }
    index
}
