//! `collc_compiler::replicas` against real floats: every library allreduce, reducescatter and reduce algorithm runs
//! on random f32 inputs at several rank counts, in both placements, on every host transport. Where the analysis says
//! replicas agree, every rank's output must be the same bit for bit; where it says results are chunk-independent,
//! an element's result must not change with the message size (the same inputs in a longer call). How many of the
//! schedules marked otherwise really differ is printed (`cargo test --test replicas -- --nocapture`).

use collc_compiler::library::LIBRARY;
use collc_compiler::replicas::{self, Replicas};
use collc_compiler::{compile, Bindings, Collective, Limits, Options, Placement};
use collc_runtime::{check, Buffers, CallShape, Communicator, DataType, Options as RunOptions, ReduceOp, Transport};
use std::time::Duration;

const RANKS: [u32; 4] = [3, 4, 5, 8];
/// Two message sizes: the first elements of the longer call are the shorter call's, cut into chunks elsewhere.
const COUNTS: [usize; 2] = [997, 1500];

/// A float with a random sign, mantissa and exponent within 2^-8..2^8: sums of them round differently in
/// different orders, and no reduction of eight overflows.
fn float(seed: u64, rank: u32, block: u32, element: usize) -> f32 {
    let mut z = seed ^ (u64::from(rank) << 48) ^ (u64::from(block) << 32) ^ element as u64;
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let exponent = 127 - 8 + (z >> 23) as u32 % 17;
    f32::from_bits(((z >> 63) as u32) << 31 | exponent << 23 | (z as u32 & 0x7f_ffff))
}

/// Every rank's input for a call of `count` elements per block: element e of block b depends on (rank, b, e) only.
fn inputs(seed: u64, collective: Collective, n_ranks: u32, count: usize) -> Vec<Vec<u8>> {
    let blocks = if collective == Collective::ReduceScatter { n_ranks } else { 1 };
    let block = |rank, b| (0..count).flat_map(move |e| float(seed, rank, b, e).to_le_bytes());
    (0..n_ranks).map(|rank| (0..blocks).flat_map(|b| block(rank, b)).collect()).collect()
}

/// Runs one call on every rank (a thread each) and returns each rank's output window.
fn call(comms: &mut [Communicator], shape: CallShape, placement: Placement, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let n_ranks = comms.len() as u32;
    let in_place = placement == Placement::InPlace;
    std::thread::scope(|scope| {
        let ranks: Vec<_> = comms
            .iter_mut()
            .map(|comm| {
                scope.spawn(move || {
                    let input = &inputs[comm.rank() as usize];
                    let w = check::windows(&shape, n_ranks, comm.rank(), in_place);
                    if in_place {
                        let mut buffer = w.in_place_buffer(input);
                        comm.call(shape, Buffers::InPlace(&mut buffer)).unwrap_or_else(|e| panic!("{shape:?}: {e}"));
                        return buffer[w.output].to_vec();
                    }
                    let mut recv = vec![0xEE; w.recv];
                    comm.call(shape, Buffers::OutOfPlace { send: input, recv: &mut recv })
                        .unwrap_or_else(|e| panic!("{shape:?}: {e}"));
                    recv
                })
            })
            .collect();
        ranks.into_iter().map(|rank| rank.join().expect("a rank thread")).collect()
    })
}

/// One library algorithm bound at one rank count and root, with what the analysis says of each placement.
struct Case {
    name: &'static str,
    source: &'static str,
    collective: Collective,
    params: Vec<(String, i64)>,
    root: u32,
    replicas: [Replicas; 2],
}

/// The reducing algorithms of the library at `n_ranks`: roots 0 and p-1 of reduce; a node split of p / its smallest
/// prime factor ranks per node where the algorithm has one.
fn cases(n_ranks: u32) -> Vec<Case> {
    let mut cases = Vec::new();
    for &(name, source) in LIBRARY {
        let file = collc_grammar::parse(source, &Limits::default().syntax).expect("the library parses");
        let collective: Collective = file.algorithm.collective.name.parse().expect("a collective");
        if !collective.reduces() {
            continue;
        }
        let per_node = n_ranks / (2..=n_ranks).find(|f| n_ranks.is_multiple_of(*f)).unwrap_or(1);
        let roots = if collective.rooted() { vec![0, n_ranks - 1] } else { vec![0] };
        for root in roots {
            let bindings = Bindings { root: collective.rooted().then_some(root), ..Bindings::ranks(n_ranks) }
                .with_default_split(&file.algorithm, per_node);
            let analysed = Placement::BOTH.map(|placement| {
                compile(source, &bindings, Options::placed(placement), &Limits::default())
                    .map(|s| replicas::analyse(&s))
            });
            // A rank count the algorithm's `where` excludes.
            let [Ok(out_of_place), Ok(in_place)] = analysed else { continue };
            let replicas = [out_of_place, in_place];
            cases.push(Case { name, source, collective, params: bindings.params, root, replicas });
        }
    }
    cases
}

/// Whether each output differs between ranks (allreduce's replicas), and each rank's output between the two message
/// sizes (on the shorter call's elements).
struct Seen {
    replicas_differ: bool,
    size_matters: bool,
}

fn observe(comms: &mut [Communicator], case: &Case, placement: Placement, seed: u64) -> Seen {
    let n_ranks = comms.len() as u32;
    let peer = (case.root + 1) % n_ranks;
    let outputs: Vec<Vec<Vec<u8>>> = COUNTS
        .iter()
        .map(|&count| {
            let shape = CallShape {
                collective: case.collective,
                count,
                dtype: DataType::F32,
                op: ReduceOp::Sum,
                root: case.root,
                peer,
            };
            call(comms, shape, placement, &inputs(seed, case.collective, n_ranks, count))
        })
        .collect();
    // Only the root's output of reduce is defined.
    let checked: Vec<usize> = match case.collective {
        Collective::Reduce => vec![case.root as usize],
        _ => (0..n_ranks as usize).collect(),
    };
    let shorter = COUNTS[0] * 4;
    let replicas_differ = case.collective == Collective::AllReduce
        && outputs.iter().any(|by_rank| by_rank.iter().any(|output| *output != by_rank[0]));
    let size_matters = checked.iter().any(|&rank| outputs[0][rank][..shorter] != outputs[1][rank][..shorter]);
    Seen { replicas_differ, size_matters }
}

#[test]
fn replicas_the_analysis_says_agree_are_bitwise_identical_on_random_floats() {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    println!("inputs drawn from seed {seed:#x}");
    let options = RunOptions { timeout: Duration::from_secs(60), slot_bytes: 1024, ..RunOptions::default() };
    let (mut schedules, mut disagreeing, mut differed, mut dependent, mut mattered) = (0, 0, 0, 0, 0);
    for n_ranks in RANKS {
        let cases = cases(n_ranks);
        for transport in Transport::host() {
            let mut comms = Communicator::group(transport, n_ranks, options.clone()).expect("a communicator group");
            for case in &cases {
                for comm in &mut comms {
                    comm.set_algorithm(case.collective, case.name, case.source, case.params.clone());
                }
                for (placement, replicas) in Placement::BOTH.into_iter().zip(&case.replicas) {
                    let seen = observe(&mut comms, case, placement, seed);
                    let at = format!("{} p={n_ranks} root={} {placement} {transport:?}", case.name, case.root);
                    assert!(!(replicas.agree() && seen.replicas_differ), "{at}: marked agreeing, but ranks differ");
                    assert!(
                        !(replicas.chunk_independent() && seen.size_matters),
                        "{at}: marked chunk-independent, but the message size changed results"
                    );
                    schedules += 1;
                    if !replicas.agree() {
                        disagreeing += 1;
                        differed += usize::from(seen.replicas_differ);
                    }
                    if !replicas.chunk_independent() {
                        dependent += 1;
                        mattered += usize::from(seen.size_matters);
                    }
                }
            }
        }
    }
    println!(
        "{schedules} runs: {differed} of the {disagreeing} marked disagreeing had ranks that differ; {mattered} of the \
         {dependent} marked chunk-dependent changed with the message size"
    );
    assert!(disagreeing > 0 && differed > 0, "one-shot's replicas are expected to differ on random floats");
}
