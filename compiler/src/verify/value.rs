//! Symbolic chunk values: the multiset of (origin rank, origin chunk) contributions a slot holds, in three forms.
//! `Keyed` is the fast one (16 bytes: the contributions' count and their sum in GF(2^107 - 1) under the
//! verification's key, see `key.rs`); `Exact` is the multiset itself, with multiplicities (small schedules,
//! `--exact`, and the second run that explains a wrong result); `Counted` is how many contributions, to explain a
//! wrong result of a schedule too large to re-run exactly.

use super::key::{self, Keys, FIELD_BITS, P};
use crate::collective::Expected;
use crate::sched::Schedule;
use std::cell::Cell;
use std::rc::Rc;

/// What the symbolic execution needs of a value. `Key` is what values are made from (the expanded key; the exact
/// run's budget).
pub(crate) trait Value: Clone {
    type Key;
    fn input(key: &Self::Key, rank: u32, chunk: u32) -> Self;
    fn undefined(key: &Self::Key) -> Self;
    fn reduce(&mut self, key: &Self::Key, other: &Self);
}

/// Values the postcondition compares with the contract.
pub(crate) trait Checked: Value + PartialEq {
    /// What an output chunk the contract names must hold. `sums` caches the sums over ranks, by chunk.
    fn expected(key: &Self::Key, n_ranks: u32, expected: Expected, sums: &mut Vec<Option<Self>>) -> Self {
        match expected {
            Expected::One { rank, chunk } => Self::input(key, rank, chunk),
            Expected::SumOverRanks { chunk } => {
                if sums.len() <= chunk as usize {
                    sums.resize(chunk as usize + 1, None);
                }
                sums[chunk as usize].get_or_insert_with(|| Self::sum_over_ranks(key, n_ranks, chunk)).clone()
            }
            Expected::Unchecked => Self::undefined(key),
        }
    }

    /// `x[q][chunk]` summed over every rank q.
    fn sum_over_ranks(key: &Self::Key, n_ranks: u32, chunk: u32) -> Self;
}

/// The count of contributions (saturating at `COUNT_MAX`, bits 107..128) and the sum of their images (bits
/// 0..107, at most P, P standing for 0). Undefined data counts as a contribution whose image is `Keys::undefined`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Keyed(u128);

/// Where the count saturates: a saturated count is wrong for every contract, since `verify` takes fewer ranks.
pub(crate) const COUNT_MAX: u128 = (1 << (128 - FIELD_BITS)) - 1;

impl Keyed {
    fn new(count: u128, image: u128) -> Keyed {
        Keyed((count << FIELD_BITS) | image)
    }

    fn count(self) -> u128 {
        self.0 >> FIELD_BITS
    }

    fn image(self) -> u128 {
        key::canonical(self.0 & P)
    }
}

impl PartialEq for Keyed {
    fn eq(&self, other: &Keyed) -> bool {
        self.count() == other.count() && self.image() == other.image()
    }
}

impl Value for Keyed {
    type Key = Keys;

    fn input(key: &Keys, rank: u32, chunk: u32) -> Keyed {
        Keyed::new(1, key::mul(key.rank[rank as usize], key.chunk[chunk as usize]))
    }

    fn undefined(key: &Keys) -> Keyed {
        Keyed::new(1, key.undefined)
    }

    #[inline]
    fn reduce(&mut self, _: &Keys, other: &Keyed) {
        let image = key::add(self.0 & P, other.0 & P);
        *self = Keyed::new((self.count() + other.count()).min(COUNT_MAX), image);
    }
}

impl Checked for Keyed {
    fn sum_over_ranks(key: &Keys, n_ranks: u32, chunk: u32) -> Keyed {
        Keyed::new(u128::from(n_ranks), key::mul(key.rank_sum, key.chunk[chunk as usize]))
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
    type Key = ();

    fn input(_: &(), _rank: u32, _chunk: u32) -> Self {
        Counted { count: 1, undefined: false }
    }

    fn undefined(_: &()) -> Self {
        Counted { count: 0, undefined: true }
    }

    fn reduce(&mut self, _: &(), other: &Self) {
        self.count = self.count.saturating_add(other.count);
        self.undefined |= other.undefined;
    }
}

/// One contribution and how often a value holds it (saturating: every contract wants it once or not at all).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Term {
    pub rank: u32,
    pub chunk: u32,
    pub times: u32,
}

/// Undefined data, as a term that sorts after every contribution (ranks are fewer than 2^32 - 1).
const UNDEFINED: (u32, u32) = (u32::MAX, u32::MAX);

/// The contributions themselves, sorted, shared between the slots and messages that hold one value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Exact(Rc<Vec<Term>>);

impl Exact {
    pub fn terms(&self) -> impl Iterator<Item = &Term> {
        self.0.iter().filter(|t| (t.rank, t.chunk) != UNDEFINED)
    }

    pub fn has_undefined(&self) -> bool {
        self.0.last().is_some_and(|t| (t.rank, t.chunk) == UNDEFINED)
    }
}

/// What exact values are made from: the one undefined value every slot starts as, and the budget of terms.
pub(crate) struct ExactKey {
    undefined: Exact,
    /// Terms left to create; once spent, reductions stop merging and `over_budget` says so.
    budget: Cell<u64>,
    spent: Cell<bool>,
}

impl ExactKey {
    pub fn new(budget: u64) -> ExactKey {
        let undefined = Exact(Rc::new(vec![Term { rank: UNDEFINED.0, chunk: UNDEFINED.1, times: 1 }]));
        ExactKey { undefined, budget: Cell::new(budget), spent: Cell::new(false) }
    }

    /// Whether the run outgrew the budget (its values are then meaningless).
    pub fn over_budget(&self) -> bool {
        self.spent.get()
    }
}

impl ExactKey {
    /// Takes `terms` from the budget; false once it is spent.
    fn charge(&self, terms: usize) -> bool {
        match self.budget.get().checked_sub(terms as u64) {
            Some(left) if !self.spent.get() => {
                self.budget.set(left);
                true
            }
            _ => {
                self.spent.set(true);
                false
            }
        }
    }
}

impl Value for Exact {
    type Key = ExactKey;

    fn input(_: &ExactKey, rank: u32, chunk: u32) -> Self {
        Exact(Rc::new(vec![Term { rank, chunk, times: 1 }]))
    }

    fn undefined(key: &ExactKey) -> Self {
        key.undefined.clone()
    }

    /// Merges the two sorted lists, adding the multiplicities of a contribution both hold.
    fn reduce(&mut self, key: &ExactKey, other: &Self) {
        let (a, b) = (&self.0, &other.0);
        if !key.charge(a.len() + b.len()) {
            return;
        }
        let mut merged = Vec::with_capacity(a.len() + b.len());
        let (mut i, mut j) = (0, 0);
        while i < a.len() && j < b.len() {
            let (x, y) = (a[i], b[j]);
            match (x.rank, x.chunk).cmp(&(y.rank, y.chunk)) {
                std::cmp::Ordering::Less => {
                    merged.push(x);
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    merged.push(y);
                    j += 1;
                }
                std::cmp::Ordering::Equal => {
                    merged.push(Term { times: x.times.saturating_add(y.times), ..x });
                    i += 1;
                    j += 1;
                }
            }
        }
        merged.extend_from_slice(&a[i..]);
        merged.extend_from_slice(&b[j..]);
        self.0 = Rc::new(merged);
    }
}

impl Checked for Exact {
    fn sum_over_ranks(_: &ExactKey, n_ranks: u32, chunk: u32) -> Exact {
        Exact(Rc::new((0..n_ranks).map(|rank| Term { rank, chunk, times: 1 }).collect()))
    }
}

/// Inputs at the start, appended to `values` for every slot of `rank` in the buffers `stored` keeps, in buffer
/// order: `x[r][c]` in the input window where the input is significant, undefined elsewhere. The window is found
/// once per rank, not per slot (at p = 4096 the in-place state took 0.13-0.14 s instead of 0.18-0.28 s).
pub(crate) fn initial_values<V: Value>(
    sched: &Schedule,
    key: &V::Key,
    rank: u32,
    stored: impl Fn(usize) -> bool,
    values: &mut Vec<V>,
) {
    let (in_buf, offset) = sched.input_window(rank);
    let (in_chunks, _) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
    let significant = sched.collective.input_significant(rank, sched.root);
    for (b, decl) in sched.buffers.iter().enumerate() {
        if !stored(b) {
            continue;
        }
        if significant && b == in_buf.0 as usize {
            let input = offset..offset.saturating_add(in_chunks);
            values.extend((0..decl.chunks).map(|index| match input.contains(&index) {
                true => V::input(key, rank, index - offset),
                false => V::undefined(key),
            }));
        } else {
            values.extend(std::iter::repeat_n(V::undefined(key), decl.chunks as usize));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::key::Seed;

    fn keyed(keys: &Keys, terms: &[(u32, u32)]) -> Keyed {
        let mut value = Keyed::input(keys, terms[0].0, terms[0].1);
        for &(r, c) in &terms[1..] {
            value.reduce(keys, &Keyed::input(keys, r, c));
        }
        value
    }

    #[test]
    fn keyed_values_are_multisets() {
        let keys = Keys::new(Seed(3), 4, 4);
        assert_eq!(keyed(&keys, &[(0, 1), (2, 3), (1, 1)]), keyed(&keys, &[(1, 1), (0, 1), (2, 3)]));
        assert_ne!(keyed(&keys, &[(0, 1), (1, 1)]), keyed(&keys, &[(0, 1), (0, 1)]));
        assert_ne!(keyed(&keys, &[(0, 1)]), keyed(&keys, &[(0, 1), (0, 1)]), "the count differs");
        let all = keyed(&keys, &[(0, 2), (1, 2), (2, 2), (3, 2)]);
        assert_eq!(Keyed::sum_over_ranks(&keys, 4, 2), all);
    }

    #[test]
    fn keyed_counts_saturate_instead_of_wrapping() {
        let keys = Keys::new(Seed(5), 2, 1);
        let mut value = Keyed::input(&keys, 0, 0);
        for _ in 0..40 {
            let copy = value;
            value.reduce(&keys, &copy);
        }
        assert_eq!(value.count(), COUNT_MAX);
        let mut again = value;
        again.reduce(&keys, &Keyed::input(&keys, 1, 0));
        assert_eq!(again.count(), COUNT_MAX);
    }

    #[test]
    fn exact_values_merge_multiplicities_within_the_budget() {
        let key = ExactKey::new(100);
        let mut value = Exact::input(&key, 1, 0);
        value.reduce(&key, &Exact::input(&key, 0, 0));
        value.reduce(&key, &Exact::input(&key, 1, 0));
        value.reduce(&key, &Exact::undefined(&key));
        let terms: Vec<_> = value.terms().map(|t| (t.rank, t.chunk, t.times)).collect();
        assert_eq!(terms, [(0, 0, 1), (1, 0, 2)]);
        assert!(value.has_undefined());
        assert!(!key.over_budget());
        let small = ExactKey::new(3);
        let mut value = Exact::input(&small, 1, 0);
        value.reduce(&small, &Exact::input(&small, 0, 0));
        value.reduce(&small, &Exact::input(&small, 2, 0));
        assert!(small.over_budget());
    }
}
