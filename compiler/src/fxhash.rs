//! A fast non-cryptographic hasher for maps keyed by ranks, channels and instruction indices.

use std::hash::{BuildHasherDefault, Hasher};

/// FxHash (rustc's hasher): keys here are small integers, and SipHash would dominate passes over millions of them.
#[derive(Default)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }

    fn write_u8(&mut self, v: u8) {
        self.write_u64(v as u64);
    }
}

pub type FxBuildHasher = BuildHasherDefault<FxHasher>;
