//! Learning from live calls (opt-in, `COLLC_LEARN=1`): a communicator whose collective is chosen by a selection
//! runs the first (`TRIES` + 1) x (candidates) calls of each size class (sizes from one power of two of bytes to the
//! next) with every candidate in turn, timing each but its first (which compiles and prepares its plan); then the
//! ranks all-gather their medians, and every rank takes the candidate whose slowest
//! rank's median is the least (the same on every rank: they decide on the same numbers). The class runs that one from
//! then on, and rank 0 merges the times into this host's timings (`Measured`) where its ranks share the host.
//! Every rank of a job must learn alike (`Communicator::agree` checks it), since exploring changes which schedule
//! a call runs.

use collc_compiler::Collective;
use std::collections::HashMap;

/// Timed calls per candidate before a class decides (each candidate's first call, which prepares its plan, is not
/// counted).
pub(crate) const TRIES: usize = 3;

/// A size class: the collective and the bit length of a call's bytes (class k holds 2^(k-1)..=2^k - 1 bytes).
pub(crate) type Class = (Collective, u32);

/// The size class of a call of `bytes`.
pub(crate) fn class_of(collective: Collective, bytes: usize) -> Class {
    (collective, usize::BITS - bytes.leading_zeros())
}

/// Whether `COLLC_LEARN` asks for learning from live calls.
pub(crate) fn enabled() -> Result<bool, String> {
    match std::env::var("COLLC_LEARN").as_deref() {
        Err(_) | Ok("") | Ok("0") => Ok(false),
        Ok("1") => Ok(true),
        Ok(other) => Err(format!("COLLC_LEARN=`{other}`: 1 learns from live calls, 0 (or unset) does not")),
    }
}

#[derive(Default)]
struct Explored {
    /// Per candidate, the seconds of its calls so far.
    samples: Vec<Vec<f64>>,
    calls: usize,
    chosen: Option<usize>,
}

/// What one rank has learned so far, per size class.
#[derive(Default)]
pub(crate) struct Live {
    classes: HashMap<Class, Explored>,
}

impl Live {
    /// The candidate (of `n`) the next call of `class` runs while the class explores; `None` once it has decided.
    pub(crate) fn explore(&mut self, class: Class, n: usize) -> Option<usize> {
        let explored = self.classes.entry(class).or_default();
        match explored.chosen {
            Some(_) => None,
            None => Some(explored.calls % n),
        }
    }

    /// The candidate `class` decided on, if it has.
    pub(crate) fn learned(&self, class: Class) -> Option<usize> {
        self.classes.get(&class).and_then(|e| e.chosen)
    }

    /// Records a call of `class` that ran candidate `index` (of `n`) in `seconds`; once every candidate has run
    /// `TRIES` + 1 times, this rank's median per candidate (its first call left out), to all-gather and `settle`.
    pub(crate) fn record(&mut self, class: Class, index: usize, n: usize, seconds: f64) -> Option<Vec<f64>> {
        let explored = self.classes.entry(class).or_default();
        explored.samples.resize(n, Vec::new());
        explored.samples[index].push(seconds);
        explored.calls += 1;
        let timed = |s: &Vec<f64>| median(&s[1.min(s.len())..]);
        (explored.calls >= n * (TRIES + 1)).then(|| explored.samples.iter().map(timed).collect())
    }

    /// Decides `class` on every rank's medians (`per_rank[r][candidate]`): the candidate whose slowest rank is the
    /// fastest (the first on a tie). Returns it and those slowest medians.
    pub(crate) fn settle(&mut self, class: Class, per_rank: &[Vec<f64>]) -> (usize, Vec<f64>) {
        let n = per_rank.iter().map(Vec::len).min().unwrap_or(0);
        let slowest: Vec<f64> = (0..n).map(|c| per_rank.iter().map(|r| r[c]).fold(0.0, f64::max)).collect();
        let chosen = (0..n).min_by(|&a, &b| slowest[a].total_cmp(&slowest[b]).then(a.cmp(&b))).unwrap_or(0);
        self.classes.entry(class).or_default().chosen = Some(chosen);
        (chosen, slowest)
    }
}

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::INFINITY)
}

#[cfg(test)]
mod tests {
    use super::{class_of, Live, TRIES};
    use collc_compiler::Collective;

    /// A class explores its candidates in turn, `TRIES` calls each, then settles on the candidate whose slowest
    /// rank is fastest and explores no more; another class explores on its own.
    #[test]
    fn a_class_explores_each_candidate_then_keeps_the_fastest_slowest_rank() {
        let mut live = Live::default();
        let class = class_of(Collective::AllReduce, 4096);
        assert_eq!(class, class_of(Collective::AllReduce, 8191));
        assert_ne!(class, class_of(Collective::AllReduce, 4095));
        let times = [3e-6, 1e-6, 2e-6];
        let mut medians = None;
        for call in 0..3 * (TRIES + 1) {
            let index = live.explore(class, 3).expect("exploring");
            assert_eq!(index, call % 3);
            // Each candidate's first call prepares its plan: slow, and not counted.
            let first = if call < 3 { 1e-3 } else { 0.0 };
            medians = live.record(class, index, 3, first + times[index] * (1.0 + call as f64 * 1e-3));
            assert_eq!(medians.is_some(), call + 1 == 3 * (TRIES + 1));
        }
        let mine = medians.expect("every candidate ran");
        assert!(mine[1] < mine[2] && mine[2] < mine[0], "{mine:?}");
        // Another rank on which candidate 1 is slow: the slowest ranks decide for candidate 2.
        let (chosen, slowest) = live.settle(class, &[mine.clone(), vec![3e-6, 9e-6, 2.5e-6]]);
        assert_eq!(chosen, 2, "{slowest:?}");
        assert_eq!(live.explore(class, 3), None);
        assert_eq!(live.learned(class), Some(2));
        assert_eq!(live.explore(class_of(Collective::AllReduce, 1 << 20), 3), Some(0));
    }
}
