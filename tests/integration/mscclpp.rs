//! MSCCL++ plans: every library algorithm's exported plan is read as the executor reads it (`gpus[r].id == r`, the
//! fields it requires, at most 64 operations per thread block, channel and buffer ids within their lists) and run
//! by a small interpreter of the executor's semantics (thread blocks in order, `wait` consuming one `signal` of the
//! paired channel, semaphores, `put` into the peer's registered scratch) on distinct values: every checked output
//! chunk must be what the collective's contract says, and no run may hang.

use crate::corpus::{self, render_all};
use collc_compiler::collective::Expected;
use collc_compiler::msccl::mscclpp;
use collc_compiler::{compile, Collective, Limits, Options, Placement};
use serde_json::Value;
use std::collections::HashMap;

/// A distinct value per (rank, input chunk): sums of different sets almost surely differ.
fn input_value(rank: usize, chunk: usize) -> u64 {
    let mut x = (rank as u64) << 32 | chunk as u64;
    x = x.wrapping_add(0x9E3779B97F4A7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D049BB133111EB);
    x ^ (x >> 31)
}

struct Tb<'a> {
    rank: usize,
    ops: &'a [Value],
    pc: usize,
    channels: Vec<usize>,
    remote: Vec<usize>,
}

struct Machine<'a> {
    plan: &'a Value,
    /// Per rank: "i", "o", "s" (None: not yet written).
    buffers: Vec<HashMap<&'static str, Vec<Option<u64>>>>,
    /// Per rank, per GPU channel: signals received, waits done.
    inbound: Vec<Vec<(u64, u64)>>,
    /// Per rank, per GPU channel: the peer's index of the paired channel.
    paired: Vec<Vec<usize>>,
    semaphores: Vec<Vec<i64>>,
}

fn buf_name(value: &str) -> &'static str {
    match value {
        "i" => "i",
        "o" => "o",
        "s" => "s",
        other => panic!("unknown buffer type {other}"),
    }
}

impl<'a> Machine<'a> {
    fn new(plan: &'a Value, n_ranks: usize) -> Self {
        let gpus = plan["gpus"].as_array().expect("gpus");
        let mut buffers = Vec::new();
        let mut inbound = Vec::new();
        let mut semaphores = Vec::new();
        for (rank, gpu) in gpus.iter().enumerate() {
            assert_eq!(gpu["id"].as_u64(), Some(rank as u64), "gpus[{rank}].id");
            let size = |k: &str| gpu[k].as_u64().unwrap_or_else(|| panic!("gpus[{rank}].{k}")) as usize;
            let (i, o) = (size("input_chunks"), size("output_chunks"));
            assert!(i >= 1 && o >= 1, "the executor divides by input_chunks and output_chunks");
            let input = (0..i).map(|c| Some(input_value(rank, c))).collect();
            let map = HashMap::from([("i", input), ("o", vec![None; o]), ("s", vec![None; size("scratch_chunks")])]);
            buffers.push(map);
            let n_channels = gpu["channels"][0]["connected_to"].as_array().map_or(0, Vec::len);
            inbound.push(vec![(0, 0); n_channels]);
            semaphores.push(
                gpu["semaphores"]
                    .as_array()
                    .expect("semaphores")
                    .iter()
                    .map(|s| s["init_value"].as_i64().unwrap())
                    .collect(),
            );
        }
        // A rank's k-th channel to a peer pairs with the peer's k-th channel to it.
        let peers: Vec<Vec<usize>> = gpus
            .iter()
            .map(|g| {
                g["channels"][0]["connected_to"]
                    .as_array()
                    .map_or(Vec::new(), |a| a.iter().map(|p| p.as_u64().unwrap() as usize).collect())
            })
            .collect();
        let paired = (0..n_ranks)
            .map(|r| {
                (0..peers[r].len())
                    .map(|k| {
                        let peer = peers[r][k];
                        let nth = peers[r][..k].iter().filter(|&&p| p == peer).count();
                        let back: Vec<usize> =
                            peers[peer].iter().enumerate().filter(|(_, &p)| p == r).map(|(j, _)| j).collect();
                        assert_eq!(
                            back.len(),
                            peers[r].iter().filter(|&&p| p == peer).count(),
                            "rank {r} and {peer} list as many channels to each other"
                        );
                        back[nth]
                    })
                    .collect()
            })
            .collect();
        Machine { plan, buffers, inbound, paired, semaphores }
    }

    fn read(&self, tb: &Tb, b: &Value) -> (usize, &'static str, usize, usize) {
        let (index, size) = (b["index"].as_u64().unwrap() as usize, b["size"].as_u64().unwrap() as usize);
        match b.get("buffer_id") {
            Some(id) => {
                let remote = &self.plan["gpus"][tb.rank]["remote_buffers"][tb.remote[id.as_u64().unwrap() as usize]];
                (remote["rank"].as_u64().unwrap() as usize, buf_name(remote["type"].as_str().unwrap()), index, size)
            }
            None => (tb.rank, buf_name(b["type"].as_str().expect("a local buffer has its type")), index, size),
        }
    }

    fn values(&self, tb: &Tb, b: &Value) -> Vec<Option<u64>> {
        let (rank, name, index, size) = self.read(tb, b);
        let buf = &self.buffers[rank][name];
        assert!(index + size <= buf.len(), "rank {}: {name}[{index}..+{size}] past {} chunks", tb.rank, buf.len());
        buf[index..index + size].to_vec()
    }

    fn write(&mut self, tb: &Tb, b: &Value, values: Vec<Option<u64>>) {
        let (rank, name, index, size) = self.read(tb, b);
        let buf = self.buffers[rank].get_mut(name).unwrap();
        assert!(index + size <= buf.len(), "rank {}: write {name}[{index}..+{size}] past {}", tb.rank, buf.len());
        buf[index..index + size].copy_from_slice(&values);
    }

    /// Runs one operation of `tb` if it can; false when it waits.
    fn step(&mut self, tb: &mut Tb) -> bool {
        let op = &tb.ops[tb.pc];
        let ids = |key: &str| {
            op[key]
                .as_array()
                .map_or(Vec::new(), |a| a.iter().map(|v| v.as_u64().unwrap() as usize).collect::<Vec<_>>())
        };
        match op["name"].as_str().unwrap() {
            "nop" => {}
            "copy" => {
                let v = self.values(tb, &op["src_buff"][0]);
                self.write(tb, &op["dst_buff"][0], v);
            }
            "put" => {
                assert_eq!(op["channel_type"], "memory");
                let v = self.values(tb, &op["src_buff"][0]);
                self.write(tb, &op["dst_buff"][0], v);
            }
            "re" => {
                let sources: Vec<Vec<Option<u64>>> =
                    op["src_buff"].as_array().unwrap().iter().map(|b| self.values(tb, b)).collect();
                let sum = (0..sources[0].len())
                    .map(|k| sources.iter().try_fold(0u64, |acc, s| s[k].map(|v| acc.wrapping_add(v))))
                    .collect();
                self.write(tb, &op["dst_buff"][0], sum);
            }
            "signal" => {
                for k in ids("channel_ids") {
                    let gpu_channel = tb.channels[k];
                    let peer = self.plan["gpus"][tb.rank]["channels"][0]["connected_to"][gpu_channel].as_u64().unwrap()
                        as usize;
                    let theirs = self.paired[tb.rank][gpu_channel];
                    self.inbound[peer][theirs].0 += 1;
                }
            }
            "wait" => {
                for k in ids("channel_ids") {
                    let (got, used) = self.inbound[tb.rank][tb.channels[k]];
                    if got <= used {
                        return false;
                    }
                    self.inbound[tb.rank][tb.channels[k]].1 += 1;
                }
            }
            "sem_acquire" => {
                for s in ids("semaphore_ids") {
                    if self.semaphores[tb.rank][s] <= 0 {
                        return false;
                    }
                    self.semaphores[tb.rank][s] -= 1;
                }
            }
            "sem_release" => {
                for s in ids("semaphore_ids") {
                    self.semaphores[tb.rank][s] += 1;
                }
            }
            other => panic!("an operation the exporter does not write: {other}"),
        }
        tb.pc += 1;
        true
    }
}

/// Runs a plan to the end (every thread block of every rank round-robin, an operation at a time) and returns each
/// rank's buffers.
fn run(plan: &Value, n_ranks: usize) -> Vec<HashMap<&'static str, Vec<Option<u64>>>> {
    let mut machine = Machine::new(plan, n_ranks);
    let mut tbs = Vec::new();
    for (rank, gpu) in plan["gpus"].as_array().unwrap().iter().enumerate() {
        for (t, tb) in gpu["threadblocks"].as_array().unwrap().iter().enumerate() {
            assert_eq!(tb["id"].as_u64(), Some(t as u64));
            let ops = tb["ops"].as_array().unwrap();
            assert!(ops.len() <= 64, "rank {rank} tb {t}: {} operations, the executor takes 64", ops.len());
            let channels = tb["channels"][0]["channel_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            let remote = tb["remote_buffer_refs"][0]["remote_buffer_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            tbs.push(Tb { rank, ops, pc: 0, channels, remote });
        }
    }
    loop {
        let mut progressed = false;
        for tb in tbs.iter_mut().filter(|tb| tb.pc < tb.ops.len()) {
            while tb.pc < tb.ops.len() && machine.step(tb) {
                progressed = true;
            }
        }
        if tbs.iter().all(|tb| tb.pc == tb.ops.len()) {
            return machine.buffers;
        }
        let stuck: Vec<String> = tbs
            .iter()
            .filter(|tb| tb.pc < tb.ops.len())
            .map(|tb| format!("rank {} at {}", tb.rank, tb.ops[tb.pc]))
            .collect();
        assert!(progressed, "the plan hangs: {}", stuck.join("; "));
    }
}

/// Every library algorithm (out of place, root 0) at 2, 3, 4 and 8 ranks: the plan computes its collective.
#[test]
fn every_library_algorithm_runs_as_an_mscclpp_plan() {
    let limits = Limits::default();
    let mut ran = 0;
    let mut failures = Vec::new();
    for algo in corpus::library() {
        for n_ranks in [2u32, 3, 4, 8] {
            let binding = corpus::bindings(&algo.text, n_ranks);
            let Ok(verified) = compile(&algo.text, &binding, Options::placed(Placement::OutOfPlace), &limits) else {
                continue;
            };
            if verified.collective == Collective::SendRecv {
                assert!(mscclpp::export(&verified, &limits).is_err());
                continue;
            }
            let text = match mscclpp::export(&verified, &limits) {
                Ok(text) => text,
                Err(errors) => {
                    failures.push(format!(
                        "{} p={n_ranks}: {}",
                        algo.name,
                        render_all(&errors, &algo.name, &algo.text)
                    ));
                    continue;
                }
            };
            let plan: Value = serde_json::from_str(&text).expect("the plan is JSON");
            assert_eq!(plan["collective"], verified.collective.name());
            let buffers = run(&plan, n_ranks as usize);
            let chunks = verified.chunks;
            for (rank, bufs) in buffers.iter().enumerate() {
                for (c, got) in bufs["o"].iter().enumerate() {
                    let want =
                        match verified.collective.expected(rank as u32, c as u32, chunks, verified.root, verified.peer)
                        {
                            Expected::SumOverRanks { chunk } => Some(
                                (0..n_ranks as usize)
                                    .fold(0u64, |acc, r| acc.wrapping_add(input_value(r, chunk as usize))),
                            ),
                            Expected::One { rank: from, chunk } => Some(input_value(from as usize, chunk as usize)),
                            Expected::Unchecked => continue,
                        };
                    if *got != want {
                        failures
                            .push(format!("{} p={n_ranks}: rank {rank} out[{c}] = {got:?}, want {want:?}", algo.name));
                    }
                }
            }
            ran += 1;
        }
    }
    assert!(failures.is_empty(), "{} plans failed:\n{}", failures.len(), failures.join("\n"));
    assert!(ran > 80, "only {ran} plans ran");
}
