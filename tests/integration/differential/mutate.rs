//! Mutations of a schedule the compiler would not make, and the shrinking steps that cut a wrong one down.

use super::{entries, in_place_offsets, physical, program, shared_and_other, Entries, Rng};
use collc_compiler::sched::{BufId, Instr, Op, Operand, NO_RANK};
use collc_compiler::{Placement, Schedule};

/// The instruction on the other end of the connection of `ranks[rank][i]`'s send (`sending`) or receive, by the
/// connection's order: the k-th send of (rank, peer, channel) pairs with the k-th receive.
pub fn partner(ranks: &[Entries], rank: usize, i: usize, sending: bool) -> Option<(usize, usize)> {
    let instr = ranks[rank][i].0;
    let (peer, ch) = (if sending { instr.send_peer() } else { instr.recv_peer() }?, instr.channel);
    let peer = peer as usize;
    if peer >= ranks.len() || peer == rank {
        return None;
    }
    let on_conn = |x: &Instr, to: u32, sending: bool| {
        x.channel == ch && if sending { x.send_peer() == Some(to) } else { x.recv_peer() == Some(to) }
    };
    let k = ranks[rank][..i].iter().filter(|(x, _)| on_conn(x, peer as u32, sending)).count();
    let far = ranks[peer].iter().enumerate().filter(|(_, (x, _))| on_conn(x, rank as u32, !sending));
    far.map(|(j, _)| j).nth(k).map(|j| (peer, j))
}

/// The partners of both of an instruction's ends.
fn partners(ranks: &[Entries], rank: usize, i: usize) -> Vec<(usize, usize)> {
    [true, false].into_iter().filter_map(|s| partner(ranks, rank, i, s)).collect()
}

/// Removes instruction `i`; dependencies on it disappear and later indices shift down.
pub fn remove(list: &mut Entries, i: usize) {
    list.remove(i);
    for (_, deps) in list.iter_mut().skip(i) {
        deps.retain(|&d| d as usize != i);
        deps.iter_mut().filter(|d| **d as usize > i).for_each(|d| *d -= 1);
    }
}

/// Inserts a copy of instruction `i` right after it, ordered after `i` and before everything that followed `i`.
fn duplicate(list: &mut Entries, i: usize) {
    let (instr, mut deps) = list[i].clone();
    deps.push(i as u32);
    for (_, later) in list.iter_mut().skip(i + 1) {
        let after_original = later.contains(&(i as u32));
        later.iter_mut().filter(|d| **d as usize > i).for_each(|d| *d += 1);
        if after_original {
            later.push(i as u32 + 1);
        }
    }
    list.insert(i + 1, (instr, deps));
}

/// Swaps instructions `i` and `j`, dependencies renamed with them (those that now point forward are dropped later).
fn swap(list: &mut Entries, i: usize, j: usize) {
    list.swap(i, j);
    let (i, j) = (i as u32, j as u32);
    for (_, deps) in list.iter_mut() {
        deps.iter_mut().for_each(|d| {
            *d = if *d == i {
                j
            } else if *d == j {
                i
            } else {
                *d
            }
        });
    }
}

/// Removes the given (rank, index) instructions, the highest index of each rank first.
fn remove_all(ranks: &mut [Entries], mut at: Vec<(usize, usize)>) {
    at.sort_unstable();
    at.dedup();
    for &(rank, i) in at.iter().rev() {
        remove(&mut ranks[rank], i);
    }
}

/// Duplicates the given (rank, index) instructions, the highest index of each rank first.
fn duplicate_all(ranks: &mut [Entries], mut at: Vec<(usize, usize)>) {
    at.sort_unstable();
    at.dedup();
    for &(rank, i) in at.iter().rev() {
        duplicate(&mut ranks[rank], i);
    }
}

/// (reads src, reads acc, writes dst, sends, receives).
pub fn shape(op: Op) -> [bool; 5] {
    match op {
        Op::Send => [true, false, false, true, false],
        Op::Recv => [false, false, true, false, true],
        Op::RecvReduceCopy => [false, true, true, false, true],
        Op::RecvReduceSend => [false, true, false, true, true],
        Op::RecvReduceCopySend => [false, true, true, true, true],
        Op::RecvCopySend => [false, false, true, true, true],
        Op::Copy => [true, false, true, false, false],
        Op::Reduce => [true, true, true, false, false],
    }
}

fn other_rank(rng: &mut Rng, p: u32, not: &[u32]) -> Option<u32> {
    let choices: Vec<u32> = (0..p).filter(|q| !not.contains(q)).collect();
    (!choices.is_empty()).then(|| rng.pick(&choices))
}

/// A random index for `count` chunks in a buffer of `chunks`: at the same position as `like` (mod `c`) most times.
fn random_index(rng: &mut Rng, chunks: u32, count: u32, c: u32, like: Option<u32>) -> u32 {
    let room = chunks.saturating_sub(count);
    if let Some(like) = like.filter(|_| rng.chance(60)) {
        let c = c.max(1);
        let starts: Vec<u32> = (0..=room).filter(|i| i % c == like % c).collect();
        if !starts.is_empty() {
            return rng.pick(&starts);
        }
    }
    rng.range(0, room)
}

/// An operand for `physical` memory (buffer, index) of `rank`: in place, through the other name of the shared
/// buffer when the range lies in its window and the coin says so.
pub fn named(sched: &Schedule, rank: u32, (buf, index): (BufId, u32), count: u32, rng: &mut Rng) -> Operand {
    if sched.placement == Placement::InPlace {
        let (shared, other) = shared_and_other(sched);
        if buf == shared && rng.chance(50) {
            let (in_offset, out_offset) = in_place_offsets(sched.collective, rank, sched.chunks);
            let shift = if other == BufId::IN { in_offset } else { out_offset };
            let other_chunks = sched.buffers[other.0 as usize].chunks;
            if index >= shift && index - shift + count <= other_chunks {
                return Operand::new(other, index - shift);
            }
        }
    }
    Operand::new(buf, index)
}

fn operand_mut(instr: &mut Instr, which: usize) -> &mut Operand {
    match which {
        0 => &mut instr.src,
        1 => &mut instr.acc,
        _ => &mut instr.dst,
    }
}

/// The kinds of mutation, each tried on a random instruction; `None` where it does not apply there.
pub const KINDS: [&str; 17] = [
    "swap",
    "duplicate",
    "delete",
    "peer",
    "operand",
    "count",
    "op",
    "overlap",
    "overlap",
    "alias",
    "drop-dep",
    "add-dep",
    "channel",
    "move",
    "split",
    "restage",
    "restage",
];

fn mutate_once(sched: &Schedule, ranks: &mut [Entries], rng: &mut Rng, kind: &str) -> Option<String> {
    let p = sched.n_ranks;
    let rank = rng.below(ranks.len());
    let len = ranks[rank].len();
    if len == 0 {
        return None;
    }
    let i = rng.below(len);
    let instr = ranks[rank][i].0;
    let here = format!("rank {rank} #{i} {}", instr.op.name());
    let c = sched.chunks;
    let chunks_of = |o: Operand| sched.buffers.get(o.buf.0 as usize).map_or(0, |b| b.chunks);
    match kind {
        "swap" => {
            if len < 2 {
                return None;
            }
            let j = if rng.chance(50) && i + 1 < len { i + 1 } else { rng.below(len) };
            if j == i {
                return None;
            }
            let (a, b) = (i.min(j), i.max(j));
            swap(&mut ranks[rank], a, b);
            Some(format!("rank {rank} #{a} and #{b} swapped"))
        }
        "duplicate" => {
            let mut at = vec![(rank, i)];
            let with = rng.chance(70);
            if with {
                at.extend(partners(ranks, rank, i));
            }
            duplicate_all(ranks, at);
            Some(format!("{here} duplicated{}", if with { " with its partners" } else { "" }))
        }
        "delete" => {
            let mut at = vec![(rank, i)];
            let with = rng.chance(60);
            if with {
                at.extend(partners(ranks, rank, i));
            }
            remove_all(ranks, at);
            Some(format!("{here} deleted{}", if with { " with its partners" } else { "" }))
        }
        "peer" => {
            let sending = match (instr.send_peer(), instr.recv_peer()) {
                (Some(_), Some(_)) => rng.chance(50),
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return None,
            };
            let old = if sending { instr.send_peer } else { instr.recv_peer };
            let new = other_rank(rng, p, &[rank as u32, old])?;
            let e = &mut ranks[rank][i].0;
            if sending {
                e.send_peer = new;
            } else {
                e.recv_peer = new;
            }
            Some(format!("{here} {} peer {old} -> {new}", if sending { "send" } else { "receive" }))
        }
        "operand" => {
            let present: Vec<usize> = (0..3).filter(|&w| operand_mut(&mut instr.clone(), w).get().is_some()).collect();
            if present.is_empty() {
                return None;
            }
            let which = rng.pick(&present);
            let old = operand_mut(&mut instr.clone(), which).get()?;
            let buf = if rng.chance(50) { old.buf } else { BufId(rng.below(sched.buffers.len()) as u8) };
            let index = random_index(rng, sched.buffers[buf.0 as usize].chunks, instr.count, c, Some(old.index));
            let new = Operand::new(buf, index);
            *operand_mut(&mut ranks[rank][i].0, which) = new;
            let names = ["src", "acc", "dst"];
            Some(format!("{here} {} {}[{}] -> {}[{}]", names[which], old.buf.0, { old.index }, buf.0, index))
        }
        "count" => {
            let old = instr.count;
            let new = match rng.below(5) {
                0 => 0,
                1 => 1,
                2 => old.saturating_sub(1),
                3 => old + 1,
                _ => rng.range(1, 4),
            };
            if new == old {
                return None;
            }
            let mut at = vec![(rank, i)];
            let with = rng.chance(75);
            if with {
                at.extend(partners(ranks, rank, i));
            }
            for (r, j) in at {
                ranks[r][j].0.count = new;
            }
            Some(format!("{here} count {old} -> {new}{}", if with { " with its partners" } else { "" }))
        }
        "op" => {
            let families: [&[Op]; 3] = [
                &[Op::Recv, Op::RecvReduceCopy],
                &[Op::RecvCopySend, Op::RecvReduceCopySend, Op::RecvReduceSend],
                &[Op::Copy, Op::Reduce],
            ];
            let family = families.iter().find(|f| f.contains(&instr.op)).copied();
            let new = match family {
                Some(f) if rng.chance(80) => rng.pick(f),
                _ => rng.pick(&Op::ALL),
            };
            if new == instr.op {
                return None;
            }
            let [src, acc, dst, sends, receives] = shape(new);
            let existing: Vec<Operand> = [instr.src, instr.acc, instr.dst].iter().filter_map(|o| o.get()).collect();
            let mut e = instr;
            e.op = new;
            for (needed, which) in [(src, 0), (acc, 1), (dst, 2)] {
                let slot = operand_mut(&mut e, which);
                if !needed {
                    *slot = Operand::NONE;
                } else if slot.get().is_none() {
                    *slot = match existing.is_empty() {
                        false => rng.pick(&existing),
                        true => Operand::new(BufId::OUT, 0),
                    };
                }
            }
            if !sends {
                e.send_peer = NO_RANK;
            } else if e.send_peer().is_none() {
                e.send_peer = other_rank(rng, p, &[rank as u32])?;
            }
            if !receives {
                e.recv_peer = NO_RANK;
            } else if e.recv_peer().is_none() {
                e.recv_peer = other_rank(rng, p, &[rank as u32])?;
            }
            ranks[rank][i].0 = e;
            Some(format!("{here} becomes {}", new.name()))
        }
        "overlap" => {
            // Move one operand (a read) onto another (the destination, or the other read), fully or partly.
            let mut e = instr;
            let n0 = e.count.max(1);
            if e.dst.get().is_none() && e.acc.get().is_none() {
                return None;
            }
            // Operands to overlap: (moved, onto).
            let (moved, onto) = match e.op {
                Op::Recv | Op::RecvCopySend => {
                    e.op = if e.op == Op::Recv { Op::RecvReduceCopy } else { Op::RecvReduceCopySend };
                    e.acc = e.dst;
                    (1, 2)
                }
                Op::Copy if rng.chance(50) => {
                    e.op = Op::Reduce;
                    e.acc = e.dst;
                    (1, 2)
                }
                Op::Copy => (0, 2),
                Op::Reduce => rng.pick(&[(1, 2), (1, 2), (0, 2), (0, 1)]),
                Op::RecvReduceCopy | Op::RecvReduceCopySend => (1, 2),
                _ => return None,
            };
            // Most partial overlaps need two chunks or more.
            let mut n = n0;
            let mut grown = false;
            let target = operand_mut(&mut e, onto).get()?;
            if n == 1 && rng.chance(50) && target.index + 2 <= chunks_of(target) {
                n = 2;
                grown = true;
            }
            let room = chunks_of(target).saturating_sub(n);
            let phys = physical(sched, rank as u32, target);
            let shift = rng.range(0, 2 * (n - 1)) as i64 - (n as i64 - 1);
            let shift = if shift == 0 && n > 1 && rng.chance(60) { 1 } else { shift };
            // Stay inside the target's buffer, in physical terms.
            let base_phys = phys.1 as i64 - target.index as i64;
            let start = (target.index as i64 + shift).clamp(0, room as i64);
            let moved_operand = named(sched, rank as u32, (phys.0, (base_phys + start) as u32), n, rng);
            *operand_mut(&mut e, moved) = moved_operand;
            e.count = n;
            ranks[rank][i].0 = e;
            if grown {
                for (r, j) in partners(ranks, rank, i) {
                    ranks[r][j].0.count = n;
                }
            }
            let names = ["src", "acc", "dst"];
            Some(format!(
                "{here} {} moved onto {} shifted by {} (count {n})",
                names[moved],
                names[onto],
                start - target.index as i64
            ))
        }
        "alias" => {
            if sched.placement != Placement::InPlace {
                return None;
            }
            let (shared, other) = shared_and_other(sched);
            let present: Vec<usize> = (0..3).filter(|&w| operand_mut(&mut instr.clone(), w).get().is_some()).collect();
            if present.is_empty() {
                return None;
            }
            let which = rng.pick(&present);
            let old = operand_mut(&mut instr.clone(), which).get()?;
            if old.buf != shared && old.buf != other {
                return None;
            }
            let new = if rng.chance(25) {
                // The same index under the other name: other memory, unless the offsets are 0.
                let to = if old.buf == shared { other } else { shared };
                if old.index + instr.count > sched.buffers[to.0 as usize].chunks {
                    return None;
                }
                Operand::new(to, old.index)
            } else if old.buf == other {
                let (buf, index) = physical(sched, rank as u32, old);
                Operand::new(buf, index)
            } else {
                let (in_offset, out_offset) = in_place_offsets(sched.collective, rank as u32, sched.chunks);
                let shift = if other == BufId::IN { in_offset } else { out_offset };
                let other_chunks = sched.buffers[other.0 as usize].chunks;
                if old.index < shift || old.index - shift + instr.count > other_chunks {
                    return None;
                }
                Operand::new(other, old.index - shift)
            };
            *operand_mut(&mut ranks[rank][i].0, which) = new;
            let names = ["src", "acc", "dst"];
            Some(format!(
                "{here} {} {}[{}] renamed {}[{}]",
                names[which],
                sched.buffers[old.buf.0 as usize].name,
                { old.index },
                sched.buffers[new.buf.0 as usize].name,
                { new.index }
            ))
        }
        "drop-dep" => {
            let deps = &mut ranks[rank][i].1;
            if deps.is_empty() {
                return None;
            }
            let d = deps.remove(rng.below(deps.len()));
            Some(format!("{here} no longer depends on #{d}"))
        }
        "add-dep" => {
            if i == 0 {
                return None;
            }
            let d = rng.below(i) as u32;
            ranks[rank][i].1.push(d);
            Some(format!("{here} depends on #{d}"))
        }
        "channel" => {
            if instr.send_peer().is_none() && instr.recv_peer().is_none() {
                return None;
            }
            let new = if rng.chance(15) { rng.range(29, 31) as u8 } else { rng.range(0, 3) as u8 };
            if new == instr.channel {
                return None;
            }
            let mut at = vec![(rank, i)];
            let with = rng.chance(75);
            if with {
                at.extend(partners(ranks, rank, i));
            }
            for (r, j) in at {
                ranks[r][j].0.channel = new;
            }
            Some(format!("{here} channel {} -> {new}{}", instr.channel, if with { " with its partners" } else { "" }))
        }
        "restage" => {
            // The value an instruction writes, kept somewhere else: its destination and every later read of it
            // (until something writes over it) moved to another buffer or index at the same position, often
            // overlapping where it was, in place often under the other name at the same index (the value staged
            // in `in` while `out` is live, or the reverse). Dependencies stay as they were.
            let d = instr.dst.get()?;
            let n = instr.count;
            let (shared, other) = shared_and_other(sched);
            let in_place = sched.placement == Placement::InPlace;
            let buf = match rng.below(3) {
                0 => d.buf,
                1 if in_place && (d.buf == shared || d.buf == other) => {
                    if d.buf == shared {
                        other
                    } else {
                        shared
                    }
                }
                _ => BufId(rng.below(sched.buffers.len()) as u8),
            };
            // An accumulating instruction (acc = dst) whose result moves by less than its count: the accumulator
            // then partly overlaps the destination.
            let accumulates = instr.acc.get().is_some_and(|a| a == d);
            let short: Vec<u32> = (1..n).filter(|k| k % c.max(1) == 0).collect();
            let buf = if accumulates && !short.is_empty() && rng.chance(50) { d.buf } else { buf };
            let size = sched.buffers[buf.0 as usize].chunks;
            if n == 0 || n > size || (sched.placement == Placement::OutOfPlace && buf == BufId::IN) {
                return None;
            }
            let index = if buf == d.buf && accumulates && !short.is_empty() && rng.chance(70) {
                let k = rng.pick(&short);
                if rng.chance(50) && d.index + k + n <= size {
                    d.index + k
                } else {
                    d.index.checked_sub(k)?
                }
            } else if rng.chance(40) && buf == d.buf {
                // Shifted by whole blocks of chunks (the position stays), so that a long range overlaps itself.
                let k = rng.range(1, 2) * c.max(1);
                let up = d.index + k;
                if rng.chance(50) && up + n <= size {
                    up
                } else {
                    d.index.checked_sub(k)?
                }
            } else if buf != d.buf && rng.chance(50) && d.index + n <= size {
                d.index
            } else {
                random_index(rng, size, n, c, Some(d.index))
            };
            if (buf, index) == (d.buf, { d.index }) {
                return None;
            }
            let to = |o: Operand| Operand::new(buf, index + (o.index - d.index));
            let within = |o: Operand, m: u32| o.buf == d.buf && o.index >= d.index && o.index + m <= d.index + n;
            let overlaps = |o: Operand, m: u32| o.buf == d.buf && o.index < d.index + n && d.index < o.index + m;
            let list = &mut ranks[rank];
            list[i].0.dst = Operand::new(buf, index);
            for (e, _) in list.iter_mut().skip(i + 1) {
                let m = e.count;
                for o in [&mut e.src, &mut e.acc] {
                    if let Some(x) = o.get() {
                        if within(x, m) {
                            *o = to(x);
                        }
                    }
                }
                if e.dst.get().is_some_and(|x| overlaps(x, m)) {
                    break;
                }
            }
            Some(format!("{here} dst and its readers {}[{}] -> {}[{index}]", d.buf.0, { d.index }, buf.0))
        }
        "move" => {
            // To another place in the rank's list, dependencies renamed (those that now point forward drop).
            let j = rng.below(len);
            if j == i {
                return None;
            }
            let list = &mut ranks[rank];
            let moved = list.remove(i);
            list.insert(j, moved);
            let new_index = |d: u32| -> u32 {
                let d = d as usize;
                let at = if d == i {
                    j
                } else if i < j && d > i && d <= j {
                    d - 1
                } else if j < i && d >= j && d < i {
                    d + 1
                } else {
                    d
                };
                at as u32
            };
            for (_, deps) in list.iter_mut() {
                deps.iter_mut().for_each(|d| *d = new_index(*d));
            }
            Some(format!("{here} moved to #{j}"))
        }
        "split" => {
            // An instruction of n > 1 chunks as two, with the ends of its connections split alike: the same
            // computation in more messages.
            if instr.count < 2 {
                return None;
            }
            let k = rng.range(1, instr.count - 1);
            let mut at = vec![(rank, i)];
            at.extend(partners(ranks, rank, i));
            at.sort_unstable();
            at.dedup();
            for &(r, j) in at.iter().rev() {
                duplicate(&mut ranks[r], j);
                let first = &mut ranks[r][j].0;
                first.count = k;
                let mut second = *first;
                second.count = instr.count - k;
                for o in [&mut second.src, &mut second.acc, &mut second.dst] {
                    if o.get().is_some() {
                        *o = Operand::new(o.buf, o.index + k);
                    }
                }
                ranks[r][j + 1].0 = second;
            }
            Some(format!("{here} split {k} + {}", instr.count - k))
        }
        _ => unreachable!("{kind}"),
    }
}

/// `n` random mutations of `sched`, and what they were.
pub fn mutate(sched: &Schedule, rng: &mut Rng, n: usize) -> (Schedule, Vec<String>) {
    let mut ranks: Vec<Entries> = sched.ranks.iter().map(entries).collect();
    let mut what = Vec::new();
    let mut attempts = 0;
    while what.len() < n && attempts < 100 {
        attempts += 1;
        let kind = rng.pick(&KINDS);
        if let Some(done) = mutate_once(sched, &mut ranks, rng, kind) {
            what.push(format!("{kind}: {done}"));
        }
    }
    (rebuild(sched, &ranks), what)
}

pub fn rebuild(sched: &Schedule, ranks: &[Entries]) -> Schedule {
    let mut out = sched.clone();
    out.ranks = ranks.iter().map(program).collect();
    out
}

/// Smaller schedules to try in place of a wrong one: each instruction removed with the ends of its connections,
/// then alone; each dependency dropped; each count above 1 brought to 1 (with its partners).
pub fn shrink_steps(sched: &Schedule) -> Vec<Schedule> {
    let ranks: Vec<Entries> = sched.ranks.iter().map(entries).collect();
    let mut out = Vec::new();
    for rank in 0..ranks.len() {
        for i in 0..ranks[rank].len() {
            let mut at = vec![(rank, i)];
            at.extend(partners(&ranks, rank, i));
            // A forwarding chain: the partners' partners too.
            let mut chain = at.clone();
            for &(r, j) in &at {
                chain.extend(partners(&ranks, r, j));
            }
            for set in [chain, at, vec![(rank, i)]] {
                let mut edited = ranks.clone();
                remove_all(&mut edited, set);
                out.push(rebuild(sched, &edited));
            }
        }
    }
    for rank in 0..ranks.len() {
        for i in 0..ranks[rank].len() {
            for k in 0..ranks[rank][i].1.len() {
                let mut edited = ranks.clone();
                edited[rank][i].1.remove(k);
                out.push(rebuild(sched, &edited));
            }
            if ranks[rank][i].0.count > 1 {
                let mut edited = ranks.clone();
                let mut at = vec![(rank, i)];
                at.extend(partners(&ranks, rank, i));
                for (r, j) in at {
                    edited[r][j].0.count = 1;
                }
                out.push(rebuild(sched, &edited));
            }
        }
    }
    out
}
