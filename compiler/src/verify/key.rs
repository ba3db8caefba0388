//! The verification key and the field the keyed check computes in.
//!
//! A keyed verification maps each contribution `x[r][c]` to `a_r * b_c` in GF(2^107 - 1), where `a_r`, `b_c` and
//! the image `u` of undefined data are field elements drawn from a 128-bit `Seed`: fresh from the OS for each
//! `Limits` (each `collc check` invocation), printed so that a run can be replayed (`--seed`). A slot's value is the sum of its contributions'
//! images and their count. For a fixed schedule, a wrong multiset whose count is right differs from the right one
//! by integers `d` with `|d| <= p < 2^21 < P` (the count saturates at 2^21 - 1, and `verify` takes fewer ranks), so its image equals the right one only where the nonzero polynomial
//! `sum d_rc a_r b_c + d_u u` (degree 2) vanishes: probability at most 2/P < 2^-105 (Schwartz-Zippel), for keys
//! drawn uniformly; ChaCha20 stands in for uniform draws. docs/language.md states the bound.

use chacha20::ChaCha20Rng;
use rand_core::{Rng, SeedableRng};
use std::fmt;
use std::str::FromStr;

/// Bits of the field's modulus, the Mersenne prime 2^107 - 1.
pub(crate) const FIELD_BITS: u32 = 107;
/// The field's modulus.
pub const P: u128 = (1 << FIELD_BITS) - 1;

/// A keyed verification accepts a wrong schedule with probability below 2^-`ERROR_BOUND_BITS` (2/P, above).
pub const ERROR_BOUND_BITS: u32 = 105;

/// 128 bits from which a verification's key is expanded. Shown as 32 hexadecimal digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Seed(pub u128);

impl Seed {
    /// A seed from the operating system's random source.
    pub fn from_os() -> Seed {
        let mut bytes = [0u8; 16];
        // The OS's random source does not fail on the systems collc runs on; a seed that is not random would only
        // weaken the bound, so failing loudly is right.
        getrandom::fill(&mut bytes).expect("the operating system's random source is available");
        Seed(u128::from_le_bytes(bytes))
    }
}

impl fmt::Display for Seed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl FromStr for Seed {
    type Err = String;

    fn from_str(text: &str) -> Result<Seed, String> {
        let digits = text.trim().trim_start_matches("0x");
        if digits.is_empty() || digits.len() > 32 {
            return Err(format!("`{text}` is not a seed: write the 32 hexadecimal digits a verification printed"));
        }
        u128::from_str_radix(digits, 16)
            .map(Seed)
            .map_err(|_| format!("`{text}` is not a seed: write the 32 hexadecimal digits a verification printed"))
    }
}

/// How the postcondition compares multisets of contributions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verification {
    /// Exactly for schedules of at most `EXACT_AUTO_RANKS` ranks (keyed if the exact run outgrows its budget),
    /// keyed with this seed above.
    Auto(Seed),
    /// Exactly, at any size (an error if the run outgrows `EXACT_BUDGET`).
    Exact,
    /// Keyed with this seed, at any size.
    Keyed(Seed),
}

impl Default for Verification {
    /// `Auto` with a fresh seed from the OS.
    fn default() -> Self {
        Verification::Auto(Seed::from_os())
    }
}

/// `Auto` verifies exactly up to this many ranks.
pub const EXACT_AUTO_RANKS: u32 = 64;

/// Contribution terms an exact run may create in all (each 12 bytes, most freed as values are replaced): past this
/// it stops, and `Auto` verifies keyed instead.
pub const EXACT_BUDGET: u64 = 1 << 26;

/// How a schedule was verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// With the multisets themselves: a proof.
    Exact,
    /// Keyed by `seed`: wrong with probability below 2^-`ERROR_BOUND_BITS`.
    Keyed(Seed),
}

impl fmt::Display for Verdict {
    /// `verified exactly` or `verified, error bound 2^-105`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Exact => f.write_str("verified exactly"),
            Verdict::Keyed(_) => write!(f, "verified, error bound 2^-{ERROR_BOUND_BITS}"),
        }
    }
}

/// A seed expanded for one schedule: `a_r` per rank, `b_c` per input chunk index, `u` for undefined data. Public so
/// that a test can build a program against a fixed key (and show that a fresh one rejects it).
pub struct Keys {
    pub rank: Vec<u128>,
    pub chunk: Vec<u128>,
    pub undefined: u128,
    /// The sum of every `a_r`: `x[q][c]` summed over all ranks q maps to `b_c` times it.
    pub rank_sum: u128,
}

impl Keys {
    pub fn new(seed: Seed, n_ranks: u32, n_chunks: u32) -> Keys {
        // Two streams, so that a rank's element does not depend on how many chunks there are, nor the reverse.
        let stream = |domain: &[u8; 16]| {
            let mut key = [0u8; 32];
            key[..16].copy_from_slice(&seed.0.to_le_bytes());
            key[16..].copy_from_slice(domain);
            ChaCha20Rng::from_seed(key)
        };
        let mut ranks = stream(b"collc verify rnk");
        let mut chunks = stream(b"collc verify chk");
        let undefined = element(&mut ranks);
        let rank: Vec<u128> = (0..n_ranks).map(|_| element(&mut ranks)).collect();
        let chunk = (0..n_chunks).map(|_| element(&mut chunks)).collect();
        let rank_sum = rank.iter().fold(0, |sum, &a| add(sum, a));
        Keys { rank, chunk, undefined, rank_sum }
    }
}

/// `n` ranks below `p` drawn from the seed (for the roots a sweep checks), so that `--seed` replays them, from a
/// ChaCha20 stream of their own, so that which schedules are checked says nothing about the key: each of them is
/// fixed independently of it, and the bound holds for each.
pub fn draw_ranks(seed: Seed, p: u32, n: usize) -> Vec<u32> {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(&seed.0.to_le_bytes());
    key[16..].copy_from_slice(b"collc verify rts");
    let mut rng = ChaCha20Rng::from_seed(key);
    // p < 2^32: a 64-bit draw modulo p is biased by less than 2^-32, which only shifts which roots are spread.
    (0..n).map(|_| (rng.next_u64() % u64::from(p.max(1))) as u32).collect()
}

/// A uniform element of GF(P), by rejection: the low 107 bits of 128 random ones, unless they are P itself.
fn element(rng: &mut ChaCha20Rng) -> u128 {
    loop {
        let bits = ((u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64())) & P;
        if bits != P {
            return bits;
        }
    }
}

/// `a + b` for `a, b <= P`; the result is at most P (P itself stands for 0).
#[inline]
pub fn add(a: u128, b: u128) -> u128 {
    let sum = a + b;
    (sum & P) + (sum >> FIELD_BITS)
}

/// `a * b mod P` for `a, b <= P`, in [0, P): 54-bit halves so that every partial product fits 128 bits.
pub fn mul(a: u128, b: u128) -> u128 {
    const HALF: u32 = 54;
    let low = (1u128 << HALF) - 1;
    let (a1, a0, b1, b0) = (a >> HALF, a & low, b >> HALF, b & low);
    let high = a1 * b1; // weight 2^108, which is 2 mod P
    let middle = a1 * b0 + a0 * b1; // weight 2^54
                                    // middle * 2^54 = (middle >> 53) * 2^107 + (middle mod 2^53) * 2^54, and 2^107 is 1 mod P.
    let middle = (middle >> (FIELD_BITS - HALF)) + ((middle & ((1 << (FIELD_BITS - HALF)) - 1)) << HALF);
    let sum = 2 * high + middle + a0 * b0;
    canonical(add(sum & P, sum >> FIELD_BITS))
}

/// The representative in [0, P).
#[inline]
pub fn canonical(x: u128) -> u128 {
    if x == P {
        0
    } else {
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `a * b mod P` by doubling and adding: slow and obviously right.
    fn slow_mul(a: u128, b: u128) -> u128 {
        let mut result = 0u128;
        for bit in (0..FIELD_BITS).rev() {
            result = canonical(add(result, result));
            if (b >> bit) & 1 == 1 {
                result = canonical(add(result, a));
            }
        }
        result
    }

    #[test]
    fn multiplication_matches_doubling_and_adding() {
        let keys = Keys::new(Seed(7), 64, 64);
        let edges = [0, 1, 2, P - 1, P - 2, 1 << 106, (1 << 54) - 1, 1 << 54, (1 << 53) + 12345];
        let samples = keys.rank.iter().chain(&keys.chunk).copied().chain(edges);
        let samples: Vec<u128> = samples.collect();
        for &a in &samples {
            for &b in &samples[..24] {
                assert_eq!(mul(a, b), slow_mul(a, b), "{a} * {b}");
            }
        }
        assert_eq!(mul(P - 1, P - 1), 1, "(-1)^2 = 1");
    }

    #[test]
    fn addition_stays_reduced() {
        assert_eq!(canonical(add(P - 1, 1)), 0);
        assert_eq!(canonical(add(P - 1, P - 1)), P - 2);
        assert!(add(P, P) <= P);
    }

    #[test]
    fn keys_depend_on_the_seed_and_not_on_the_sizes() {
        let (a, b) = (Keys::new(Seed(1), 4, 8), Keys::new(Seed(1), 16, 2));
        assert_eq!(a.rank[..], b.rank[..4]);
        assert_eq!(a.chunk[..2], b.chunk[..]);
        assert_eq!(a.undefined, b.undefined);
        let c = Keys::new(Seed(2), 4, 8);
        assert_ne!(a.rank, c.rank);
        assert!(a.rank.iter().chain(&a.chunk).all(|&x| x < P));
    }

    #[test]
    fn drawn_ranks_are_replayable_and_spread() {
        let drawn = draw_ranks(Seed(9), 1000, 64);
        assert_eq!(drawn, draw_ranks(Seed(9), 1000, 64));
        assert_ne!(drawn, draw_ranks(Seed(10), 1000, 64));
        assert!(drawn.iter().all(|&r| r < 1000));
        let mut distinct = drawn.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 48, "{drawn:?}");
    }

    #[test]
    fn seeds_print_and_parse_back() {
        let seed = Seed(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        assert_eq!(seed.to_string().parse::<Seed>(), Ok(seed));
        assert_eq!("0x2a".parse::<Seed>(), Ok(Seed(42)));
        assert!("xyz".parse::<Seed>().is_err());
        assert!("1".repeat(33).parse::<Seed>().is_err());
        assert_ne!(Seed::from_os(), Seed::from_os());
    }
}
