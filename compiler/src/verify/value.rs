//! Symbolic chunk values: the multiset of (origin rank, origin chunk) contributions a slot holds. `Hashed` is the
//! fast form (an additive multiset hash and a count); `Exact` lists the contributions, for counterexamples.

/// What the symbolic execution needs of a value.
pub(crate) trait Value: Clone {
    fn input(rank: u32, chunk: u32) -> Self;
    fn undefined() -> Self;
    fn reduce(&mut self, other: &Self);
}

/// Sum of per-contribution hashes modulo 2^64: equal multisets have equal hashes, and a missing, extra or
/// duplicated contribution changes the hash except with probability about 2^-64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hashed {
    pub hash: u64,
    /// Contributions, saturating (16 bytes in all: the simulation holds one per chunk slot and per message).
    pub count: u32,
    pub undefined: bool,
}

pub(crate) fn contribution_hash(rank: u32, chunk: u32) -> u64 {
    let mut z = (((rank as u64) << 32) | chunk as u64) ^ 0x6a09_e667_f3bc_c909;
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Value for Hashed {
    fn input(rank: u32, chunk: u32) -> Self {
        Hashed { hash: contribution_hash(rank, chunk), count: 1, undefined: false }
    }

    fn undefined() -> Self {
        Hashed { hash: 0, count: 0, undefined: true }
    }

    fn reduce(&mut self, other: &Self) {
        self.hash = self.hash.wrapping_add(other.hash);
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
