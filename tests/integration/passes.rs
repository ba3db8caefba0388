//! The optimisation passes do what they promise, beyond verifying (which every library test checks): the
//! pipelining pass staggers slices over steps, and receive-reduce fusion reduces straight out of messages unless the
//! received value is read again.

use collc_compiler::sched::Op;
use collc_compiler::{compile, library, lower, pipelined, Bindings, Limits, Options};

fn ops(source: &str, n_ranks: u32) -> Vec<Vec<Op>> {
    let sched = compile(source, &Bindings::ranks(n_ranks), Options::default(), &Limits::default()).expect("verifies");
    sched.ranks.iter().map(|r| r.instrs.iter().map(|i| i.op).collect()).collect()
}

#[test]
fn pipelining_staggers_k_slices_over_the_steps() {
    let source = library::get("broadcast/chain").expect("in the library");
    let file = collc_grammar::parse(source, &Default::default()).expect("parses");
    for (p, k) in [(2u32, 1u32), (5, 4), (8, 8), (3, 16)] {
        let program = lower(&file, &Bindings::ranks(p), &Limits::default()).expect("lowers");
        let options = Options { pipeline: Some(k), ..Options::default() };
        let sliced = pipelined(&program, options, &Limits::default()).expect("fits the limits");
        assert_eq!(sliced.chunks, program.chunks * k);
        assert_eq!(sliced.n_steps, program.n_steps + k - 1, "p={p} k={k}");
        assert_eq!(sliced.transfers.len(), program.transfers.len() * k as usize);
        // In step s, hop h carries slice s - h: every hop is busy once the pipeline is full.
        for t in &sliced.transfers {
            let hop = (t.from + p - program.root) % p;
            assert_eq!(t.src.index, t.step - hop, "p={p} k={k}: {t:?}");
        }
    }
}

#[test]
fn a_received_chunk_is_reduced_out_of_its_message() {
    // naive: rank 0 receives every buffer into scratch and reduces them one by one.
    let naive = ops(library::get("allreduce/naive").expect("in the library"), 4);
    assert!(naive.iter().flatten().all(|&op| op != Op::Reduce), "{naive:?}");
    assert_eq!(naive[0].iter().filter(|&&op| matches!(op, Op::RecvReduceCopy | Op::RecvReduceCopySend)).count(), 3);
}

#[test]
fn a_received_chunk_read_again_stays_in_scratch() {
    let source = "algorithm twice for allreduce {
        ranks p where p == 2
        scratch t[2]
        step { send in[0] from 1 to 0 as t[0] }
        reduce t[0] into in[0] on 0
        copy t[0] to t[1] on 0
        send in[0] from 0 to 1
    }";
    let ops = ops(source, 2);
    assert_eq!(ops[0][0], Op::Recv, "{ops:?}");
    assert!(ops[0].contains(&Op::Reduce), "{ops:?}");
}
