//! The cost model against the closed forms of REFERENCE.md section 1 on a uniform topology, at several rank
//! counts and sizes; topology files and `--algo` filters that are wrong; selection on a two-level machine.

use collc_compiler::cost::{analyse, fastest, AlgoFilter, Candidate, Link, Links, Topology};
use collc_compiler::library::Library;
use collc_compiler::{library, lower, Bindings, Collective, Limits, Options};

const A: f64 = 2e-6; // alpha: 2 us
const B: f64 = 1e-10; // beta: 10 GB/s
const G: f64 = 2e-10; // gamma: 5 GB/s

fn uniform() -> Topology {
    Topology {
        name: String::new(),
        nodes: 1,
        ranks_per_node: None,
        links: Links { intra: Link::linear(A * 1e6, 1e-9 / B), inter: None },
        reduce_gbps: 1e-9 / G,
        copy_gbps: None,
        cores_per_node: None,
        shared_core_alpha_us: None,
        cached: None,
        llc: None,
        switch: None,
        single_copy: None,
    }
}

/// Where the ranks read each other's memory in place (rank threads), a send of an input as it came costs its
/// receiver the link's alpha and its own pass, not the bytes through the ports: one_shot at p = 2 drops its n·beta
/// term; a reduce-scatter step of the ring that forwards a partial sum still pays it. Where single copy stops at a
/// size, calls above it are priced as copies.
#[test]
fn single_copy_prices_a_send_of_an_input_as_the_receivers_pass() {
    let n = 1e6;
    let by_reference = Topology { single_copy: Some(f64::INFINITY), ..uniform() };
    assert_close("one_shot, copies", predict("allreduce/one_shot", 2, n, None, &uniform()), A + n * B + n * G);
    assert_close("one_shot, by reference", predict("allreduce/one_shot", 2, n, None, &by_reference), A + n * G);
    let (ring, ring_by_reference) =
        (predict("allreduce/ring", 4, n, None, &uniform()), predict("allreduce/ring", 4, n, None, &by_reference));
    assert!(ring_by_reference < ring, "the ring's first sends are inputs: {ring_by_reference:e} < {ring:e}");
    assert!(ring_by_reference > 6.0 * A + 0.5 * n * B, "the rest are partial sums: {ring_by_reference:e}");
    // Up to a size only (shm: `Backend::single_copy_max_bytes`): larger calls are priced through the FIFOs.
    let up_to = Topology { single_copy: Some(n), ..uniform() };
    assert_close("one_shot at the cap", predict("allreduce/one_shot", 2, n, None, &up_to), A + n * G);
    let above = 2.0 * n;
    let fifo = predict("allreduce/one_shot", 2, above, None, &uniform());
    assert_close("one_shot above the cap", predict("allreduce/one_shot", 2, above, None, &up_to), fifo);
}

/// Predicted seconds of library algorithm `name` for `n_ranks` and `bytes`, with `slices` pipelining.
fn predict(name: &str, n_ranks: u32, bytes: f64, slices: Option<u32>, topo: &Topology) -> f64 {
    let source = library::get(name).unwrap_or_else(|| panic!("{name} is in the library"));
    let file = collc_grammar::parse(source, &Default::default()).expect("parses");
    let per_node = topo.per_node(n_ranks);
    let bindings = Bindings::ranks(n_ranks).with_default_split(&file.algorithm, per_node);
    let program = lower(&file, &bindings, &Limits::default()).expect("lowers");
    let options = Options { pipeline: slices, ..Options::default() };
    analyse(&program, source, options, &Limits::default(), topo).expect("verifies").seconds(bytes)
}

fn assert_close(what: &str, got: f64, want: f64) {
    assert!((got - want).abs() <= 1e-9 * want.abs().max(1e-12), "{what}: model {got:e} s, formula {want:e} s");
}

const SIZES: [f64; 4] = [8.0, 4096.0, 1048576.0, 1e9];

#[test]
fn uniform_predictions_equal_the_closed_forms() {
    let topo = uniform();
    for p in [2u32, 4, 8, 16, 32] {
        let (pf, lg) = (p as f64, (p as f64).log2());
        for n in SIZES {
            let case = |name: &str| format!("{name} p={p} n={n}");
            let ring = 2.0 * (pf - 1.0) * A + 2.0 * (pf - 1.0) / pf * n * B + (pf - 1.0) / pf * n * G;
            assert_close(&case("allreduce/ring"), predict("allreduce/ring", p, n, None, &topo), ring);
            // REFERENCE's naive formula leaves out the root's p-1 reductions; the program does them.
            let naive = 2.0 * A + 2.0 * (pf - 1.0) * n * B + (pf - 1.0) * n * G;
            assert_close(&case("allreduce/naive"), predict("allreduce/naive", p, n, None, &topo), naive);
            let rd = lg * A + lg * n * B + lg * n * G;
            let got = predict("allreduce/recursive_doubling", p, n, None, &topo);
            assert_close(&case("allreduce/recursive_doubling"), got, rd);
            let raben = 2.0 * lg * A + 2.0 * (pf - 1.0) / pf * n * B + (pf - 1.0) / pf * n * G;
            assert_close(&case("allreduce/rabenseifner"), predict("allreduce/rabenseifner", p, n, None, &topo), raben);
            let gather_like = (pf - 1.0) * A + (pf - 1.0) / pf * n * B;
            assert_close(&case("allgather/ring"), predict("allgather/ring", p, n, None, &topo), gather_like);
            assert_close(&case("alltoall/pairwise"), predict("alltoall/pairwise", p, n, None, &topo), gather_like);
            let binomial = lg.ceil() * (A + n * B);
            assert_close(&case("broadcast/binomial"), predict("broadcast/binomial", p, n, None, &topo), binomial);
        }
    }
}

#[test]
fn bruck_and_chain_match_for_any_rank_count() {
    let topo = uniform();
    for p in [3u32, 5, 6, 7, 12, 33] {
        let pf = p as f64;
        for n in SIZES {
            let bruck = pf.log2().ceil() * A + (pf - 1.0) / pf * n * B;
            let got = predict("allgather/bruck", p, n, None, &topo);
            assert_close(&format!("allgather/bruck p={p} n={n}"), got, bruck);
            for k in [1u32, 4, 16] {
                let chain = (pf - 1.0 + k as f64 - 1.0) * (A + n / k as f64 * B);
                let got = predict("broadcast/chain", p, n, Some(k), &topo);
                assert_close(&format!("broadcast/chain p={p} k={k} n={n}"), got, chain);
            }
        }
    }
}

/// NCCL's double binary tree: the latency term grows with log p and, pipelined, the bandwidth term stays about
/// 2 n b whatever p (REFERENCE.md: "about 2 log2(p) a + 2 n b").
#[test]
fn the_pipelined_tree_has_a_log_latency_and_a_constant_bandwidth_term() {
    let topo = uniform();
    for p in [4u32, 8, 16, 32, 64] {
        let lg = (p as f64).log2();
        let tiny = predict("allreduce/tree", p, 1.0, Some(1), &topo);
        assert!((tiny - 2.0 * lg * A).abs() < 0.01 * tiny, "tree p={p}: latency {tiny:e} is not 2 log2(p) a");
        let (n1, n2) = (1e9, 2e9);
        let slope = (predict("allreduce/tree", p, n2, Some(64), &topo)
            - predict("allreduce/tree", p, n1, Some(64), &topo))
            / (n2 - n1);
        // Per byte: moving it (b) and reducing it (g), each about twice, plus the pipeline's fill of 2 log2 p slices.
        let bound = (2.0 * B + G) * (1.0 + 2.0 * lg / 64.0) * 1.5;
        assert!(slope > B && slope < bound, "tree p={p}: {slope:e} s per byte, not about 2 b");
        let unpipelined = (predict("allreduce/tree", p, n2, Some(1), &topo)
            - predict("allreduce/tree", p, n1, Some(1), &topo))
            / (n2 - n1);
        // Unpipelined, every level moves the whole half buffer: the bandwidth term grows with log p.
        assert!(unpipelined > lg / 1.5 * slope, "pipelining must pay: {unpipelined:e} vs {slope:e}");
    }
}

const TWO_LEVEL: &str = r#"{
    "name": "2 nodes x 4",
    "nodes": 2, "ranks_per_node": 4,
    "links": { "intra": { "alpha_us": 1, "bandwidth_gbps": 100 }, "inter": { "alpha_us": 5, "bandwidth_gbps": 10 } },
    "reduce_gbps": 50
}"#;

fn candidates(collective: Collective, topo: &Topology, n_ranks: u32) -> Vec<Candidate> {
    let names = AlgoFilter::default().candidates(collective).expect("the library has some");
    names
        .into_iter()
        .map(|name| {
            let full = format!("{collective}/{name}");
            let source = library::get(&full).expect("listed");
            let file = collc_grammar::parse(source, &Default::default()).expect("parses");
            let bindings = Bindings::ranks(n_ranks).with_default_split(&file.algorithm, topo.per_node(n_ranks));
            let program = lower(&file, &bindings, &Limits::default()).expect("lowers");
            let profile = analyse(&program, source, Options::default(), &Limits::default(), topo).expect("verifies");
            Candidate { name: name.to_string(), profile, params: bindings.params.clone(), schedule: None, file: None }
        })
        .collect()
}

#[test]
fn selection_prefers_few_steps_for_small_messages_and_the_hierarchy_for_large_ones() {
    let topo = Topology::from_json(TWO_LEVEL).expect("valid");
    let field = candidates(Collective::AllReduce, &topo, 8);
    let pick = |bytes: f64| field[fastest(&field, bytes).expect("candidates")].name.clone();
    assert_eq!(pick(8.0), "one_shot");
    assert_eq!(pick(256e6), "hierarchical");
    // On one uniform node, the hierarchy is just a ring: it cannot beat the direct two-shot.
    let flat = candidates(Collective::AllReduce, &uniform(), 8);
    assert_ne!(flat[fastest(&flat, 256e6).expect("candidates")].name, "hierarchical");
}

/// On one node the hierarchy compiles to the ring's schedule with its chunks rotated, so the two are predicted the
/// same at every size; the tie goes to the collective's default, the ring, as the candidates list it first.
#[test]
fn a_tie_goes_to_the_default_algorithm() {
    let all = AlgoFilter::default().candidates(Collective::AllReduce).expect("some");
    assert_eq!(all[0], "ring", "{all:?}");
    let field = candidates(Collective::AllReduce, &uniform(), 4);
    let by_name = |name: &str| field.iter().position(|c| c.name == name).expect("a library algorithm");
    let (ring, hierarchical) = (by_name("ring"), by_name("hierarchical"));
    let only_the_two = [field[hierarchical].clone(), field[ring].clone()];
    for bytes in [8.0, 64e3, 1e6, 256e6] {
        let (r, h) = (field[ring].profile.seconds(bytes), field[hierarchical].profile.seconds(bytes));
        assert!((r - h).abs() <= 1e-12 * r, "{bytes} B: ring {r} s, hierarchical {h} s");
        // Listed the other way round, `fastest` keeps the first of equals: the order of the candidates decides.
        assert_eq!(fastest(&only_the_two, bytes), Some(0));
    }
    // The two as the selection lists them (the library's order is alphabetical, hierarchical before ring).
    let pair: Vec<Candidate> = field.iter().filter(|c| c.name == "ring" || c.name == "hierarchical").cloned().collect();
    for bytes in [8.0, 64e3, 1e6, 256e6] {
        assert_eq!(pair[fastest(&pair, bytes).expect("two candidates")].name, "ring", "{bytes} B");
    }
}

#[test]
fn topology_errors_name_the_field() {
    let cases = [
        ("{", "line 1"),
        (
            r#"{"nodes": 1, "links": {"intra": {"alpha_us": 1, "bandwidth_gbps": 0}}, "reduce_gbps": 1}"#,
            "links.intra.bandwidth_gbps",
        ),
        (
            r#"{"nodes": 1, "links": {"intra": {"alpha_us": 1, "bandwidth_gbps": -3}}, "reduce_gbps": 1}"#,
            "links.intra.bandwidth_gbps",
        ),
        (
            r#"{"nodes": 1, "links": {"intra": {"alpha_us": -1, "bandwidth_gbps": 3}}, "reduce_gbps": 1}"#,
            "links.intra.alpha_us",
        ),
        (
            r#"{"nodes": 2, "ranks_per_node": 2, "links": {"intra": {"alpha_us": 1, "bandwidth_gbps": 3}}, "reduce_gbps": 1}"#,
            "links.inter",
        ),
        (
            r#"{"nodes": 2, "links": {"intra": {"alpha_us": 1, "bandwidth_gbps": 3}}, "reduce_gbps": 1}"#,
            "ranks_per_node",
        ),
        (r#"{"nodes": 1, "links": {"intra": {"alpha_us": 1, "bandwidth_gbps": 3}}}"#, "reduce_gbps"),
        (
            r#"{"nodes": 1, "links": {"intra": {"alpha_us": 1, "bandwidth_gbps": 3}}, "reduce_gbps": 1, "colour": 1}"#,
            "colour",
        ),
        (
            r#"{"nodes": 1, "links": {"intra": {"alpha_us": 1, "bandwidth_gbps": 3}}, "reduce_gbps": 1, "cores_per_node": 0}"#,
            "cores_per_node",
        ),
        (
            r#"{"nodes": 1, "links": {"intra": {"alpha_us": 1, "bandwidth_gbps": 3}}, "reduce_gbps": 1, "shared_core_alpha_us": -2}"#,
            "shared_core_alpha_us",
        ),
        (r#"{"nodes": -1, "links": {"intra": {"alpha_us": 1, "bandwidth_gbps": 3}}, "reduce_gbps": 1}"#, "nodes"),
        (
            r#"{"nodes": 1, "links": {"intra": {"alpha_us": "fast", "bandwidth_gbps": 3}}, "reduce_gbps": 1}"#,
            "links.intra.alpha_us",
        ),
    ];
    for (text, field) in cases {
        let error = Topology::from_json(text).expect_err(text);
        assert!(error.field.starts_with(field), "{text}: error names `{}` ({}), not `{field}`", error.field, error);
    }
    let topo = Topology::from_json(TWO_LEVEL).expect("valid");
    let error = topo.check_ranks(6).expect_err("8 ranks described, 6 asked");
    assert!(error.to_string().contains("--ranks is 6"), "{error}");
}

#[test]
fn algo_filters_follow_nccl_algo() {
    let all = AlgoFilter::default().candidates(Collective::AllReduce).expect("some");
    assert!(all.len() >= 8, "{all:?}");
    let only = AlgoFilter::parse("Ring,tree").expect("valid");
    assert_eq!(only.candidates(Collective::AllReduce).expect("two"), vec!["ring", "tree"]);
    let without = AlgoFilter::parse("^ring").expect("valid");
    let left = without.candidates(Collective::AllReduce).expect("the rest");
    assert_eq!(left.len(), all.len() - 1);
    assert!(!left.iter().any(|n| n == "ring"));
    let per = AlgoFilter::parse("allreduce:tree,ring;broadcast:chain").expect("valid");
    assert_eq!(per.candidates(Collective::Broadcast).expect("chain"), vec!["chain"]);
    assert_eq!(per.candidates(Collective::Gather).expect("unrestricted").len(), 2);
    for bad in ["rign", "allreduce:chain", "allreduce:ring;allreduce:tree", "bogus:ring", "^"] {
        assert!(AlgoFilter::parse(bad).is_err(), "`{bad}` must be rejected");
    }
    let error = AlgoFilter::parse("ring").expect("valid").candidates(Collective::Broadcast).expect_err("no ring");
    assert!(error.contains("broadcast"), "{error}");
}

/// The `## Cost:` lines of the rest of the library hold exactly at powers of two (unpipelined where they say so).
#[test]
fn library_cost_lines_hold() {
    let topo = uniform();
    for p in [8u32, 16] {
        let (pf, lg) = (p as f64, (p as f64).log2());
        let share = (pf - 1.0) / pf;
        for n in [4096.0, 1e8] {
            let cases: [(&str, Option<u32>, f64); 10] = [
                ("allreduce/one_shot", None, A + (pf - 1.0) * n * (B + G)),
                ("allreduce/two_shot", None, 2.0 * A + 2.0 * share * n * B + share * n * G),
                ("allreduce/tree", Some(1), 2.0 * lg * A + (2.0 * lg - 1.0) * n * B + (lg - 0.5) * n * G),
                ("allgather/direct", None, A + share * n * B),
                ("allgather/recursive_doubling", None, lg * A + share * n * B),
                ("reducescatter/recursive_halving", None, lg * A + share * n * (B + G)),
                ("broadcast/scatter_allgather", None, (lg + pf - 1.0) * A + 2.0 * share * n * B),
                ("gather/binomial", None, lg * A + share * n * B),
                ("alltoall/bruck", None, lg * A + n / 2.0 * lg * B),
                ("reduce/ring", Some(1), (pf - 1.0) * (A + n * B + n * G)),
            ];
            for (name, slices, want) in cases {
                assert_close(&format!("{name} p={p} n={n}"), predict(name, p, n, slices, &topo), want);
            }
        }
    }
}

/// With fewer cores than ranks, every byte a rank sends, receives, copies or reduces costs its core's time, and the
/// ranks sharing a core take turns: the busiest core bounds the time. Counted here from the fused instructions by
/// hand (a send or receive is one copy pass, a fused receive-reduce one reduction, an extra write half a copy).
#[test]
fn shared_cores_bound_the_time_by_the_busiest_core() {
    const C: f64 = 2e-10; // copy: 5 GB/s
    let n = 256e6;
    let with_cores = |cores: Option<u32>| Topology { copy_gbps: Some(1e-9 / C), cores_per_node: cores, ..uniform() };
    // As many cores as ranks: the step model and its closed forms, unchanged.
    for name in ["allreduce/ring", "allreduce/two_shot"] {
        for bytes in [8.0, 65536.0, n] {
            assert_eq!(predict(name, 4, bytes, None, &with_cores(Some(4))), predict(name, 4, bytes, None, &uniform()));
        }
    }
    // Two ranks per core at p = 4. Per rank, the ring runs Send, 2 RecvReduceSend, RecvReduceCopySend,
    // 2 RecvCopySend, Recv on chunks of n/4; two_shot runs 3 Send, 2 RecvReduceCopy, RecvReduceCopySend, 2 Send,
    // 3 Recv.
    let shared = with_cores(Some(2));
    let ring_rank = C + 2.0 * G + (G + 0.5 * C) + 2.0 * 1.5 * C + C;
    let two_shot_rank = 3.0 * C + 2.0 * G + (G + 0.5 * C) + 2.0 * C + 3.0 * C;
    let close = |got: f64, want: f64| (got - want).abs() <= 1e-9 * want;
    let ring = predict("allreduce/ring", 4, n, None, &shared);
    let two_shot = predict("allreduce/two_shot", 4, n, None, &shared);
    assert!(close(ring, 2.0 * ring_rank * n / 4.0), "ring: {ring} s");
    assert!(close(two_shot, 2.0 * two_shot_rank * n / 4.0), "two_shot: {two_shot} s");
    // Which flips the choice: two_shot's fewer steps win on ports that work in parallel, the ring's fused passes
    // win when the cores do the moving.
    assert!(predict("allreduce/two_shot", 4, n, None, &uniform()) < predict("allreduce/ring", 4, n, None, &uniform()));
    assert!(ring < two_shot);
    let own_cores = Topology { cores_per_node: Some(4), shared_core_alpha_us: Some(7.0), ..shared };
    assert_eq!(
        predict("allreduce/ring", 4, 8.0, None, &own_cores),
        predict("allreduce/ring", 4, 8.0, None, &uniform())
    );
}

/// With fewer cores than ranks, a small call costs what playing its schedule out on the cores takes, calls back to
/// back, worked out here by hand at 8 bytes (where the bandwidth and core terms are below a nanosecond).
#[test]
fn shared_cores_play_the_schedule_out_turn_by_turn() {
    const H: f64 = 7e-6; // a core changing hands, longer than alpha (2 us)
    let shared = |cores: u32, handover: Option<f64>| Topology {
        cores_per_node: Some(cores),
        shared_core_alpha_us: handover.map(|h| h * 1e6),
        ..uniform()
    };
    let near = |what: &str, got: f64, want: f64| assert!((got - want).abs() < 1e-8, "{what}: {got:e} s, want {want:e}");
    // Changing hands for free, ranks wait only for messages: the longest chain of them, one alpha each, and a rank
    // starts its next call once it has finished this one. The ring's 6 dependent hops end on every rank at once;
    // one_shot's single hop (all sends first, then all receives).
    near("ring, free hand-overs", predict("allreduce/ring", 4, 8.0, None, &shared(2, Some(0.0))), 6.0 * A);
    near("one_shot, free hand-overs", predict("allreduce/one_shot", 4, 8.0, None, &shared(2, None)), A);
    // Recursive doubling at p = 2 on one core: each rank sends to the other, then receives. Rank 0 sends at 0 and
    // yields; rank 1 gets the core after a pass P, sends, receives, starts its next call (sends again) and yields;
    // rank 0 at 2P receives, finishing its first call, sends its second, receives rank 1's second, sends its third and
    // yields; and so on: one hand-over per call once the calls run back to back.
    // A pass costs the calibrated time less the link alpha: P = H - A.
    let pass = H - A;
    near(
        "recursive doubling, one core",
        predict("allreduce/recursive_doubling", 2, 8.0, None, &shared(1, Some(H))),
        pass,
    );
    // Sharing cores only adds time. SendRecv's sender runs ahead (8 messages of room) and its receiver takes them all
    // in one turn, so back to back the calls cost no hand-over; they still cost what they do with a core per rank.
    let own = predict("sendrecv/direct", 2, 8.0, None, &uniform());
    near("sendrecv, one core", predict("sendrecv/direct", 2, 8.0, None, &shared(1, Some(H))), own);
    // Cores with unequal numbers of ranks (3 ranks on 2 cores): each algorithm costs at least the step model. Ranks
    // 0 and 2 share core 0; in the ring, Bruck's allgather and the pairwise alltoall each waits in every call for
    // messages that depend on the other's previous call, so core 0 changes hands at least once per call.
    for name in ["allreduce/ring", "allgather/bruck", "alltoall/pairwise", "broadcast/chain"] {
        let (sharing, own) =
            (predict(name, 3, 8.0, None, &shared(2, Some(H))), predict(name, 3, 8.0, None, &uniform()));
        assert!(
            sharing.is_finite() && sharing >= own,
            "{name} at 3 ranks on 2 cores: {sharing:e} s, own cores {own:e} s"
        );
        if name != "broadcast/chain" {
            assert!(sharing >= H - A - 1e-12, "{name} at 3 ranks on 2 cores: {sharing:e} s, less than a hand-over");
        }
    }
    // With a core per rank nothing is shared: the step model.
    let two_cores = predict("allreduce/ring", 2, 8.0, None, &shared(2, Some(H)));
    near("two ranks, two cores", two_cores, predict("allreduce/ring", 2, 8.0, None, &uniform()));
}

/// Calls of at most `cached.max_bytes` take the cached rates (intra-node beta, gamma, copy), larger ones up to
/// `llc.max_bytes` the last-level cache's, and larger ones still the topology's own: the closed forms hold in each
/// regime with its rates.
#[test]
fn cached_rates_apply_up_to_their_size() {
    use collc_compiler::cost::Cached;
    let (b_cached, g_cached) = (1e-11, 4e-11); // 100 GB/s links, 25 GB/s reductions
    let (b_llc, g_llc) = (2e-11, 8e-11); // 50 GB/s links, 12.5 GB/s reductions
    let cached =
        Cached { max_bytes: 65536, bandwidth_gbps: 1e-9 / b_cached, reduce_gbps: 1e-9 / g_cached, copy_gbps: 50.0 };
    let llc = Cached { max_bytes: 1 << 20, bandwidth_gbps: 1e-9 / b_llc, reduce_gbps: 1e-9 / g_llc, copy_gbps: 25.0 };
    let topo = Topology { cached: Some(cached), llc: Some(llc), ..uniform() };
    for p in [2u32, 4, 8] {
        let pf = p as f64;
        let ring =
            |n: f64, b: f64, g: f64| 2.0 * (pf - 1.0) * A + 2.0 * (pf - 1.0) / pf * n * b + (pf - 1.0) / pf * n * g;
        for n in [8.0, 4096.0, 65536.0] {
            assert_close(
                &format!("cached p={p} n={n}"),
                predict("allreduce/ring", p, n, None, &topo),
                ring(n, b_cached, g_cached),
            );
        }
        for n in [65537.0, 524288.0, 1048576.0] {
            assert_close(
                &format!("llc p={p} n={n}"),
                predict("allreduce/ring", p, n, None, &topo),
                ring(n, b_llc, g_llc),
            );
        }
        for n in [1048577.0, 1e8] {
            assert_close(&format!("uncached p={p} n={n}"), predict("allreduce/ring", p, n, None, &topo), ring(n, B, G));
        }
    }
    let error = Topology::from_json(
        r#"{"nodes": 1, "links": {"intra": {"alpha_us": 1, "bandwidth_gbps": 3}}, "reduce_gbps": 1,
            "cached": {"max_bytes": 1024, "bandwidth_gbps": 1, "reduce_gbps": 1, "copy_gbps": 1},
            "llc": {"max_bytes": 1024, "bandwidth_gbps": 1, "reduce_gbps": 1, "copy_gbps": 1}}"#,
    )
    .unwrap_err();
    assert_eq!(error.field, "llc.max_bytes");
    let error = Topology::from_json(
        r#"{"nodes": 1, "links": {"intra": {"alpha_us": 1, "bandwidth_gbps": 3}}, "reduce_gbps": 1,
            "cached": {"max_bytes": 1024, "bandwidth_gbps": 0, "reduce_gbps": 1, "copy_gbps": 1}}"#,
    )
    .unwrap_err();
    assert_eq!(error.field, "cached.bandwidth_gbps");
}

/// A link's measured curve of message times replaces alpha + bytes x beta: a step costs the curve's time for its
/// busiest port's bytes (linear between points, flat below the first, at the link's bandwidth past the last);
/// reductions still cost gamma. Recursive doubling makes log2(p) steps of n bytes per port.
#[test]
fn a_measured_message_curve_sets_the_time_of_a_step() {
    let curve = vec![[512.0, 1.0], [1024.0, 2.0], [65536.0, 10.0]];
    let intra = Link { message_us: Some(curve.clone()), ..Link::linear(A * 1e6, 1e-9 / B) };
    let topo = Topology { links: Links { intra, inter: None }, ..uniform() };
    let message = |n: f64| -> f64 {
        let us = match n {
            n if n <= 512.0 => 1.0,
            n if n <= 1024.0 => 1.0 + (n - 512.0) / 512.0,
            n if n <= 65536.0 => 2.0 + 8.0 * (n - 1024.0) / 64512.0,
            n => 10.0 + (n - 65536.0) * B * 1e6,
        };
        us * 1e-6
    };
    for p in [2u32, 4, 8] {
        let lg = (p as f64).log2();
        for n in [8.0, 512.0, 768.0, 1024.0, 40000.0, 65536.0, 1e6] {
            let got = predict("allreduce/recursive_doubling", p, n, None, &topo);
            assert_close(&format!("p={p} n={n}"), got, lg * (message(n) + n * G));
        }
    }
    // The topology file carries the curve both ways.
    let text = topo.to_json();
    assert!(text.contains("\"message_us\""), "{text}");
    assert_eq!(Topology::from_json(&text).expect("its own output parses").links.intra.message_us, Some(curve));
}

#[test]
fn message_curve_errors_name_the_point() {
    let with = |curve: &str| {
        format!(
            r#"{{"nodes": 1, "links": {{"intra": {{"alpha_us": 1, "bandwidth_gbps": 3, "message_us": {curve}}}}},
                "reduce_gbps": 1}}"#
        )
    };
    let cases = [
        ("[]", "links.intra.message_us"),
        ("7", "links.intra.message_us"),
        ("[[8, 0.2], [64]]", "links.intra.message_us[1]"),
        ("[[8, 0.2], [\"64\", 1]]", "links.intra.message_us[1]"),
        ("[[8, 0.2], [8, 0.3]]", "links.intra.message_us[1]"),
        ("[[64, 0.2], [8, 0.3]]", "links.intra.message_us[1]"),
        ("[[8, 0.2], [64, -1]]", "links.intra.message_us[1]"),
        ("[[-8, 0.2]]", "links.intra.message_us[0]"),
    ];
    for (curve, field) in cases {
        let error = Topology::from_json(&with(curve)).expect_err(curve);
        assert_eq!(error.field, field, "{curve}: {error}");
    }
}

/// The field a library user selects from, as `collc tune` and `collc run COLLECTIVE` do: every candidate the
/// filter leaves is costed and one is fastest at each size; a candidate whose node split does not divide the ranks
/// is left out with why, and none left is `NoneAdmits`; a filter naming no algorithm of the collective is the
/// filter's error, not an empty field.
#[test]
fn the_selection_field_costs_what_admits_the_binding() {
    use collc_compiler::cost::{field, FieldError};
    let (topo, limits) = (uniform(), Limits::default());
    let every =
        field(Collective::AllReduce, Library::embedded(), &AlgoFilter::default(), &Bindings::ranks(6), &limits, &topo)
            .unwrap_or_else(|_| panic!("allreduce has candidates on 6 ranks"));
    let costed: Vec<&str> = every.candidates.iter().map(|c| c.name.as_str()).collect();
    assert!(costed.contains(&"ring") && costed.contains(&"tree") && costed.contains(&"hierarchical"), "{costed:?}");
    for bytes in [8.0, 1e6, 1e9] {
        assert!(fastest(&every.candidates, bytes).is_some());
    }
    let hierarchical = AlgoFilter::parse("hierarchical").expect("parses");
    let split = Bindings { params: vec![("g".into(), 4)], ..Bindings::ranks(6) };
    match field(Collective::AllReduce, Library::embedded(), &hierarchical, &split, &limits, &topo) {
        Err(FieldError::NoneAdmits(message)) => assert!(message.contains("6 ranks"), "{message}"),
        _ => panic!("4 ranks per node do not divide 6 ranks"),
    }
    let other = AlgoFilter::parse("chain").expect("parses");
    match field(Collective::AllReduce, Library::embedded(), &other, &Bindings::ranks(6), &limits, &topo) {
        Err(FieldError::Filter(message)) => assert!(message.contains("leaves no allreduce algorithm"), "{message}"),
        _ => panic!("a filter naming no allreduce algorithm leaves no field"),
    }
}
