//! Which vector instruction set the host kernels use, detected once per process, and the
//! `#[target_feature]` copies of the shared block loop, one per instruction set.
//!
//! The build target is plain x86-64 (SSE2), so without these copies LLVM would vectorise
//! 16 bytes at a time even on an AVX-512 machine. Every copy is the same generic loop, so
//! the copies cannot drift apart in what they compute.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

use super::blocks::combine_all;
use super::lane::{Combine, Lane};

/// The widest vector instruction set the host kernels use, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum VectorIsa {
    /// What the build target guarantees: SSE2 on x86-64, NEON on aarch64.
    Baseline,
    /// 256-bit AVX2, with F16C for `f16` (x86; every AVX2 CPU has F16C).
    Avx2,
    /// 512-bit AVX-512 with the F, BW, DQ and VL extensions, and F16C (x86).
    Avx512,
}

/// The detected `VectorIsa` as `1 + discriminant`, or 0 before the first detection. Two
/// threads may both detect; they store the same value.
static DETECTED: AtomicU8 = AtomicU8::new(0);

impl VectorIsa {
    /// Every instruction set, narrowest first.
    pub const ALL: &'static [VectorIsa] = &[VectorIsa::Baseline, VectorIsa::Avx2, VectorIsa::Avx512];

    /// The instruction set this machine supports, detected on the first call; later calls
    /// are one relaxed atomic load.
    #[inline]
    pub fn detected() -> VectorIsa {
        match DETECTED.load(Ordering::Relaxed) {
            1 => VectorIsa::Baseline,
            2 => VectorIsa::Avx2,
            3 => VectorIsa::Avx512,
            _ => detect_and_remember(),
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            VectorIsa::Baseline => "baseline",
            VectorIsa::Avx2 => "avx2",
            VectorIsa::Avx512 => "avx512",
        }
    }
}

impl fmt::Display for VectorIsa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cold]
fn detect_and_remember() -> VectorIsa {
    let isa = detect();
    DETECTED.store(isa as u8 + 1, Ordering::Relaxed);
    isa
}

fn detect() -> VectorIsa {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl")
        {
            return VectorIsa::Avx512;
        }
        return VectorIsa::Avx2;
    }
    VectorIsa::Baseline
}

/// Runs the block loop compiled for `isa`.
///
/// # Safety
/// As [`combine_all`], and `isa` must not be wider than [`VectorIsa::detected`].
#[inline(always)]
pub(super) unsafe fn combine_with<T: Lane, O: Combine>(
    isa: VectorIsa,
    dst: *mut T,
    a: *const T,
    b: *const T,
    n_elems: usize,
) {
    // SAFETY: forwarded from the caller, who checked `isa` against the CPU.
    unsafe {
        match isa {
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            VectorIsa::Avx512 => x86::combine_avx512::<T, O>(dst, a, b, n_elems),
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            VectorIsa::Avx2 => x86::combine_avx2::<T, O>(dst, a, b, n_elems),
            _ => combine_all::<T, O, false>(dst, a, b, n_elems),
        }
    }
}

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
mod x86 {
    use super::super::blocks::combine_all;
    use super::super::lane::{Combine, Lane};

    /// # Safety
    /// As [`combine_all`], on a CPU with AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn combine_avx2<T: Lane, O: Combine>(dst: *mut T, a: *const T, b: *const T, n_elems: usize) {
        // SAFETY: forwarded from the caller.
        unsafe { combine_all::<T, O, true>(dst, a, b, n_elems) }
    }

    /// # Safety
    /// As [`combine_all`], on a CPU with AVX-512 F, BW, DQ and VL, and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,f16c")]
    pub(super) unsafe fn combine_avx512<T: Lane, O: Combine>(dst: *mut T, a: *const T, b: *const T, n_elems: usize) {
        // SAFETY: forwarded from the caller.
        unsafe { combine_all::<T, O, true>(dst, a, b, n_elems) }
    }
}
