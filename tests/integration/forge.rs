//! A program built to slip past the keyed postcondition under one *fixed* key: a reduce at 768 ranks in which the
//! root adds some inputs 0 or 2 times instead of once, with multiplicities found by a generalised birthday search
//! (Wagner's k-tree, 64 lists) so that their images cancel in GF(2^107 - 1) and the count of contributions is
//! right. It verifies under that key, and is rejected under a fresh key and exactly: the bound holds for programs
//! fixed before the key is drawn, not for programs built against it.

use collc_compiler::verify::key::{self, Keys, Seed, P};
use collc_compiler::{emit, verify_sched, Limits, Verification};

/// Ranks per group (list of the k-tree), groups, and the entries kept per list.
const GROUP: usize = 12;
const GROUPS: usize = 64;
const ENTRIES: usize = 1 << 16;
/// Bits each of the first five merges cancels (the sixth finds an exact zero): 106 - 5 * 16 = 26 bits are left,
/// and 2^32 pairs of the last two lists give about 2^32 / 2^27 = 32 exact zeros.
const BITS_PER_LEVEL: u32 = 16;

/// `x` in (-P/2, P/2].
fn centred(x: u128) -> i128 {
    let x = key::canonical(x) as i128;
    if x > (P / 2) as i128 {
        x - P as i128
    } else {
        x
    }
}

/// Every `d` in {-1, 0, 1}^GROUP with sum 0 and not all zero, as base-3 digits (0 is -1), in counting order.
fn zero_sum_vectors() -> Vec<u32> {
    let digit_sum = |mut v: u32| {
        let mut sum = 0i32;
        for _ in 0..GROUP {
            sum += (v % 3) as i32 - 1;
            v /= 3;
        }
        sum
    };
    let all_zero = (0..GROUP).fold(0u32, |v, _| v * 3 + 1);
    (0..3u32.pow(GROUP as u32)).filter(|&v| digit_sum(v) == 0 && v != all_zero).take(ENTRIES).collect()
}

fn digits(mut v: u32) -> [i8; GROUP] {
    let mut d = [0i8; GROUP];
    for digit in d.iter_mut() {
        *digit = (v % 3) as i8 - 1;
        v /= 3;
    }
    d
}

/// One list of the tree: each entry's value (sum of d_q a_q over its ranks, reduced as its level allows) and the
/// leaf vectors it is made of (`width` per entry).
struct List {
    values: Vec<i128>,
    leaves: Vec<u32>,
    width: usize,
}

fn leaf_list(a: &[u128], group: usize, vectors: &[u32]) -> List {
    let ranks = &a[group * GROUP..(group + 1) * GROUP];
    let values = vectors
        .iter()
        .map(|&v| {
            let mut sum = 0u128;
            for (d, &a) in digits(v).iter().zip(ranks) {
                sum = match d {
                    1 => key::add(sum, a),
                    -1 => key::add(sum, P - a),
                    _ => sum,
                };
            }
            centred(sum)
        })
        .collect();
    List { values, leaves: (0..vectors.len() as u32).collect(), width: 1 }
}

/// Pairs of `left` and `right` whose sum (mod P at the first level) lies within `bound` of 0 (`bound` 0: is 0).
fn merge(left: &List, right: &List, bound: i128, first: bool) -> List {
    let mut order: Vec<u32> = (0..right.values.len() as u32).collect();
    order.sort_unstable_by_key(|&i| right.values[i as usize]);
    let sorted: Vec<i128> = order.iter().map(|&i| right.values[i as usize]).collect();
    let (mut values, mut leaves) = (Vec::new(), Vec::new());
    let wraps: &[i128] = if first { &[0, P as i128, -(P as i128)] } else { &[0] };
    'outer: for (i, &x) in left.values.iter().enumerate() {
        for &wrap in wraps {
            let (lo, hi) = (wrap - x - bound, wrap - x + bound);
            let start = sorted.partition_point(|&y| y < lo);
            for (k, &y) in sorted[start..].iter().enumerate().take_while(|(_, y)| **y <= hi) {
                values.push(x + y - wrap);
                let j = order[start + k] as usize;
                leaves.extend_from_slice(&left.leaves[i * left.width..(i + 1) * left.width]);
                leaves.extend_from_slice(&right.leaves[j * right.width..(j + 1) * right.width]);
                if values.len() >= ENTRIES {
                    break 'outer;
                }
            }
        }
    }
    List { values, leaves, width: left.width + right.width }
}

/// The k-tree over groups `from..from + count`, depth first: the merged list of that subtree.
fn tree(a: &[u128], vectors: &[u32], from: usize, count: usize) -> List {
    if count == 1 {
        return leaf_list(a, from, vectors);
    }
    let (left, right) = (tree(a, vectors, from, count / 2), tree(a, vectors, from + count / 2, count / 2));
    let level = count.trailing_zeros(); // 1 for pairs of leaves
    let bound = match count == GROUPS {
        true => 0,
        false => 1i128 << (106 - BITS_PER_LEVEL * level),
    };
    merge(&left, &right, bound, level == 1)
}

/// Multiplicities 1 + d_q with sum p and sum d_q a_q = 0 mod P, for the ranks' keys of `seed`.
fn forged_multiplicities(seed: Seed) -> Vec<u32> {
    let keys = Keys::new(seed, (GROUP * GROUPS) as u32, 1);
    let vectors = zero_sum_vectors();
    let root = tree(&keys.rank, &vectors, 0, GROUPS);
    assert!(!root.values.is_empty(), "the k-tree found no exact zero (expected about 32)");
    root.leaves[..root.width].iter().flat_map(|&leaf| digits(vectors[leaf as usize])).map(|d| (1 + d) as u32).collect()
}

/// A reduce to rank 0 in which rank q's input is added `times[q]` times: rank q sends it that often, and the root
/// folds each message into `out[0]` (its own input as often as its own multiplicity says).
fn reduce_schedule(times: &[u32]) -> String {
    let p = times.len();
    let mut text = format!(
        "collc-schedule 1\nalgorithm forged for reduce\nplacement out-of-place\nranks {p} chunks 1 root 0 peer 1\n\
         buffer in 1\nbuffer out 1\nspan 0 0..0\nrank 0\n"
    );
    // The root's folds in order: its own input, then each message; the first of all writes out[0], the rest add.
    let folds = std::iter::repeat_n(None, times[0] as usize)
        .chain(times.iter().enumerate().skip(1).flat_map(|(q, &n)| std::iter::repeat_n(Some(q), n as usize)));
    for (index, from) in folds.enumerate() {
        let body = match (index, from) {
            (0, None) => "Copy src=in[0] dst=out[0]".to_string(),
            (_, None) => "Reduce src=in[0] acc=out[0] dst=out[0]".to_string(),
            (0, Some(q)) => format!("Recv dst=out[0] recv={q}"),
            (_, Some(q)) => format!("RecvReduceCopy acc=out[0] dst=out[0] recv={q}"),
        };
        let deps = if index == 0 { String::new() } else { format!(" deps={}", index - 1) };
        text.push_str(&format!("  #{index} {body}{deps} @0\n"));
    }
    for (q, &n) in times.iter().enumerate().skip(1) {
        text.push_str(&format!("rank {q}\n"));
        for k in 0..n {
            let deps = if k == 0 { String::new() } else { format!(" deps={}", k - 1) };
            text.push_str(&format!("  #{k} Send src=in[0] send=0{deps} @0\n"));
        }
    }
    text
}

fn verifies(text: &str, verification: Verification) -> Result<(), Vec<&'static str>> {
    let (sched, lines) = emit::parse_sched_located(text).expect("the forged schedule parses");
    let limits = Limits { verification, ..Limits::default() };
    verify_sched(sched, text, &lines, &limits).map(|_| ()).map_err(|e| e.0.iter().map(|e| e.code).collect())
}

#[test]
fn a_program_forged_against_a_fixed_key_passes_only_that_key() {
    let fixed = Seed(0x5eed_f00d_0123_4567_89ab_cdef_0f1e_d00d);
    let times = forged_multiplicities(fixed);
    assert_eq!(times.iter().sum::<u32>() as usize, times.len(), "the count of contributions is right");
    assert!(times.iter().any(|&t| t != 1), "some input is missing or doubled");
    let text = reduce_schedule(&times);
    assert_eq!(verifies(&text, Verification::Keyed(fixed)), Ok(()), "built to pass under the fixed key");
    let postcondition = Err(vec!["collc::verify::postcondition"]);
    assert_eq!(verifies(&text, Verification::Auto(Seed::from_os())), postcondition, "a fresh key rejects it");
    assert_eq!(verifies(&text, Verification::Exact), postcondition, "exact verification rejects it");
    // The right multiplicities pass under every key, so the rejection is the forgery's, not the schedule shape's.
    let honest = reduce_schedule(&vec![1; times.len()]);
    assert_eq!(verifies(&honest, Verification::Auto(Seed::from_os())), Ok(()));
}
