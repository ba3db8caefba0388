//! The alignment `collc diff` reports per rank: a shortest edit script between two lists (Myers' O(ND) longest
//! common subsequence), a removed and an added entry at one place paired as a change, and a positional alignment
//! where the lists are too different for a minimal script to be cheap.

/// One step of an edit script, by index into the old list (`a`) and the new one (`b`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edit {
    Same(usize, usize),
    Removed(usize),
    Added(usize),
    /// `a[i]` gave way to `b[j]` at one place: a removal and an addition between the same two common entries.
    Changed(usize, usize),
}

/// Edits beyond which `align` stops looking for a minimal script (its trace holds about this many squared words).
pub const MAX_EDITS: usize = 1000;

/// An edit script from `a` to `b`, in order, with each removal paired with an addition at the same place as
/// `Changed`; `minimal` when its common entries are a longest common subsequence, else (more than `max_edits`
/// removals and additions needed) `a[i]` faces `b[i]` between the common prefix and suffix.
pub struct Alignment {
    pub edits: Vec<Edit>,
    pub minimal: bool,
}

/// Aligns `a` with `b`: the common prefix and suffix, and between them Myers' shortest edit script, or a positional
/// alignment when that needs more than `max_edits` edits.
pub fn align<T: PartialEq>(a: &[T], b: &[T], max_edits: usize) -> Alignment {
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..].iter().rev().zip(b[prefix..].iter().rev()).take_while(|(x, y)| x == y).count();
    let (middle_a, middle_b) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
    let (middle, minimal) = match shortest_script(middle_a, middle_b, max_edits) {
        Some(script) => (script, true),
        None => (by_position(middle_a, middle_b), false),
    };
    let shift = |edit: Edit| match edit {
        Edit::Same(i, j) => Edit::Same(i + prefix, j + prefix),
        Edit::Removed(i) => Edit::Removed(i + prefix),
        Edit::Added(j) => Edit::Added(j + prefix),
        Edit::Changed(i, j) => Edit::Changed(i + prefix, j + prefix),
    };
    let (tail_a, tail_b) = (a.len() - suffix, b.len() - suffix);
    let mut edits: Vec<Edit> = (0..prefix).map(|i| Edit::Same(i, i)).collect();
    edits.extend(pair_changes(middle).into_iter().map(shift));
    edits.extend((0..suffix).map(|s| Edit::Same(tail_a + s, tail_b + s)));
    Alignment { edits, minimal }
}

/// Between two common entries, the k-th removal and the k-th addition become one `Changed`; the rest stay.
fn pair_changes(script: Vec<Edit>) -> Vec<Edit> {
    let mut out = Vec::with_capacity(script.len());
    let (mut removed, mut added) = (Vec::new(), Vec::new());
    let flush = |out: &mut Vec<Edit>, removed: &mut Vec<usize>, added: &mut Vec<usize>| {
        let paired = removed.len().min(added.len());
        out.extend(removed.iter().zip(added.iter()).map(|(&i, &j)| Edit::Changed(i, j)));
        out.extend(removed.drain(..).skip(paired).map(Edit::Removed));
        out.extend(added.drain(..).skip(paired).map(Edit::Added));
    };
    for edit in script {
        match edit {
            Edit::Removed(i) => removed.push(i),
            Edit::Added(j) => added.push(j),
            other => {
                flush(&mut out, &mut removed, &mut added);
                out.push(other);
            }
        }
    }
    flush(&mut out, &mut removed, &mut added);
    out
}

/// `a[i]` against `b[i]`: equal ones kept, the others removed and added at that place; the longer list's tail too.
fn by_position<T: PartialEq>(a: &[T], b: &[T]) -> Vec<Edit> {
    let mut script = Vec::with_capacity(a.len().max(b.len()) * 2);
    for i in 0..a.len().min(b.len()) {
        match a[i] == b[i] {
            true => script.push(Edit::Same(i, i)),
            false => script.extend([Edit::Removed(i), Edit::Added(i)]),
        }
    }
    script.extend((b.len()..a.len()).map(Edit::Removed));
    script.extend((a.len()..b.len()).map(Edit::Added));
    script
}

/// Myers' greedy search for a shortest edit script (removals and additions only), or `None` when it needs more
/// than `max_edits`. `trace[d]` keeps, for each diagonal k in -d..=d, the furthest x reached with d edits.
fn shortest_script<T: PartialEq>(a: &[T], b: &[T], max_edits: usize) -> Option<Vec<Edit>> {
    let (n, m) = (a.len() as isize, b.len() as isize);
    let limit = (a.len() + b.len()).min(max_edits) as isize;
    let offset = limit + 1;
    let mut furthest = vec![0isize; 2 * limit as usize + 3];
    let mut trace: Vec<Vec<isize>> = Vec::new();
    for d in 0..=limit {
        for k in (-d..=d).step_by(2) {
            let at = (k + offset) as usize;
            let down = k == -d || (k != d && furthest[at - 1] < furthest[at + 1]);
            let mut x = if down { furthest[at + 1] } else { furthest[at - 1] + 1 };
            let mut y = x - k;
            while x < n && y < m && a[x as usize] == b[y as usize] {
                x += 1;
                y += 1;
            }
            furthest[at] = x;
            if x >= n && y >= m {
                trace.push(furthest[(offset - d) as usize..=(offset + d) as usize].to_vec());
                return Some(backtrack(&trace, n, m));
            }
        }
        trace.push(furthest[(offset - d) as usize..=(offset + d) as usize].to_vec());
    }
    None
}

/// The script `trace` found, walked back from (n, m) to (0, 0).
fn backtrack(trace: &[Vec<isize>], n: isize, m: isize) -> Vec<Edit> {
    let mut script = Vec::new();
    let (mut x, mut y) = (n, m);
    for d in (1..trace.len() as isize).rev() {
        let k = x - y;
        let before = |k: isize| trace[(d - 1) as usize][(k + d - 1) as usize];
        let down = k == -d || (k != d && before(k - 1) < before(k + 1));
        let previous_k = if down { k + 1 } else { k - 1 };
        let previous_x = before(previous_k);
        let previous_y = previous_x - previous_k;
        while x > previous_x && y > previous_y {
            x -= 1;
            y -= 1;
            script.push(Edit::Same(x as usize, y as usize));
        }
        script.push(if down { Edit::Added(previous_y as usize) } else { Edit::Removed(previous_x as usize) });
        (x, y) = (previous_x, previous_y);
    }
    while x > 0 && y > 0 {
        x -= 1;
        y -= 1;
        script.push(Edit::Same(x as usize, y as usize));
    }
    script.reverse();
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script is a valid walk: every index of `a` and of `b` once, in order; `Same` only between equal entries.
    fn check_walk(a: &[u8], b: &[u8], edits: &[Edit]) {
        let (mut next_a, mut next_b) = (0, 0);
        for &edit in edits {
            let (i, j) = match edit {
                Edit::Same(i, j) => {
                    assert_eq!(a[i], b[j], "Same({i}, {j}) pairs unequal entries");
                    (Some(i), Some(j))
                }
                Edit::Changed(i, j) => (Some(i), Some(j)),
                Edit::Removed(i) => (Some(i), None),
                Edit::Added(j) => (None, Some(j)),
            };
            if let Some(i) = i {
                assert_eq!(i, next_a, "{edits:?}");
                next_a += 1;
            }
            if let Some(j) = j {
                assert_eq!(j, next_b, "{edits:?}");
                next_b += 1;
            }
        }
        assert_eq!((next_a, next_b), (a.len(), b.len()), "{edits:?}");
    }

    fn lcs_length(a: &[u8], b: &[u8]) -> usize {
        let mut row = vec![0usize; b.len() + 1];
        for &x in a {
            let mut diagonal = 0;
            for (j, &y) in b.iter().enumerate() {
                let above = row[j + 1];
                row[j + 1] = if x == y { diagonal + 1 } else { above.max(row[j]) };
                diagonal = above;
            }
        }
        row[b.len()]
    }

    fn same_count(edits: &[Edit]) -> usize {
        edits.iter().filter(|e| matches!(e, Edit::Same(..))).count()
    }

    #[test]
    fn equal_lists_are_all_same() {
        let a = b"abcdef";
        let aligned = align(a, a, MAX_EDITS);
        assert!(aligned.minimal);
        assert_eq!(aligned.edits, (0..6).map(|i| Edit::Same(i, i)).collect::<Vec<_>>());
        assert!(align::<u8>(&[], &[], MAX_EDITS).edits.is_empty());
    }

    #[test]
    fn one_entry_replaced_is_one_change_at_its_place() {
        let aligned = align(b"abcXef", b"abcYef", MAX_EDITS);
        assert_eq!(aligned.edits[3], Edit::Changed(3, 3));
        assert_eq!(same_count(&aligned.edits), 5);
        check_walk(b"abcXef", b"abcYef", &aligned.edits);
    }

    #[test]
    fn insertions_and_removals_keep_the_rest_aligned() {
        let (a, b) = (b"abcdef".as_slice(), b"aXbcef".as_slice());
        let edits = align(a, b, MAX_EDITS).edits;
        check_walk(a, b, &edits);
        assert_eq!(edits.iter().filter(|e| matches!(e, Edit::Added(1))).count(), 1, "{edits:?}");
        assert_eq!(edits.iter().filter(|e| matches!(e, Edit::Removed(3))).count(), 1, "{edits:?}");
        assert_eq!(same_count(&edits), 5, "a, b, c, e and f stay");
        let everything_new = align(b"", b"xyz", MAX_EDITS).edits;
        assert_eq!(everything_new, vec![Edit::Added(0), Edit::Added(1), Edit::Added(2)]);
    }

    #[test]
    fn the_common_entries_are_a_longest_common_subsequence() {
        let mut state = 0x2545_f491_u32;
        let mut next = |bound: u32| {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (state >> 16) % bound
        };
        for _ in 0..500 {
            let a: Vec<u8> = (0..next(12)).map(|_| b'a' + next(4) as u8).collect();
            let b: Vec<u8> = (0..next(12)).map(|_| b'a' + next(4) as u8).collect();
            let aligned = align(&a, &b, MAX_EDITS);
            assert!(aligned.minimal);
            check_walk(&a, &b, &aligned.edits);
            assert_eq!(same_count(&aligned.edits), lcs_length(&a, &b), "{a:?} {b:?}: {:?}", aligned.edits);
        }
    }

    #[test]
    fn past_the_edit_budget_entries_face_their_position() {
        let (a, b) = (b"pabcdq".as_slice(), b"pxyzq".as_slice());
        let aligned = align(a, b, 2);
        assert!(!aligned.minimal);
        check_walk(a, b, &aligned.edits);
        assert_eq!(aligned.edits[1], Edit::Changed(1, 1));
        assert!(aligned.edits.contains(&Edit::Removed(4)), "{:?}", aligned.edits);
        assert_eq!(aligned.edits.last(), Some(&Edit::Same(5, 4)));
    }
}
