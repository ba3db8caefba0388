//! Symbolic chunk values: the multiset of (origin rank, origin chunk) contributions a slot holds. `Hashed` is the
//! fast form (an additive multiset hash, 8 bytes: the simulation holds one per chunk slot and per message);
//! `Counted` and `Exact` describe a wrong result (how many contributions; which ones), from a second run.

/// What the symbolic execution needs of a value.
pub(crate) trait Value: Clone {
    fn input(rank: u32, chunk: u32) -> Self;
    fn undefined() -> Self;
    fn reduce(&mut self, other: &Self);
}

/// Sum of per-contribution hashes modulo 2^64: equal multisets have equal hashes, and a missing, extra or
/// duplicated contribution changes the hash except with probability about 2^-64. Undefined data counts as one more
/// contribution, `UNDEFINED`, which no expected value holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hashed(pub u64);

/// The hash of undefined data: that of a contribution no rank makes (ranks are fewer than 2^32 - 1), made odd so
/// that no number of undefined contributions below 2^64 sums to nothing.
const UNDEFINED: u64 = contribution_hash(u32::MAX, u32::MAX) | 1;

pub(crate) const fn contribution_hash(rank: u32, chunk: u32) -> u64 {
    let mut z = (((rank as u64) << 32) | chunk as u64) ^ 0x6a09_e667_f3bc_c909;
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Value for Hashed {
    fn input(rank: u32, chunk: u32) -> Self {
        Hashed(contribution_hash(rank, chunk))
    }

    fn undefined() -> Self {
        Hashed(UNDEFINED)
    }

    fn reduce(&mut self, other: &Self) {
        self.0 = self.0.wrapping_add(other.0);
    }
}

/// How many contributions a value holds (saturating) and whether undefined data is among them: what a wrong result
/// of a schedule too large to re-run exactly is described by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counted {
    pub count: u32,
    pub undefined: bool,
}

impl Value for Counted {
    fn input(_rank: u32, _chunk: u32) -> Self {
        Counted { count: 1, undefined: false }
    }

    fn undefined() -> Self {
        Counted { count: 0, undefined: true }
    }

    fn reduce(&mut self, other: &Self) {
        self.count = self.count.saturating_add(other.count);
        self.undefined |= other.undefined;
    }
}

/// The contributions themselves, sorted; used only to explain a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Exact {
    pub items: Vec<(u32, u32)>,
    pub undefined: bool,
}

impl Value for Exact {
    fn input(rank: u32, chunk: u32) -> Self {
        Exact { items: vec![(rank, chunk)], undefined: false }
    }

    fn undefined() -> Self {
        Exact { items: Vec::new(), undefined: true }
    }

    fn reduce(&mut self, other: &Self) {
        self.items.extend_from_slice(&other.items);
        self.items.sort_unstable();
        self.undefined |= other.undefined;
    }
}
