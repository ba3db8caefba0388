//! The reference interpreter computes NCCL's results on real data for the library's ring allreduce.

use collc_compiler::{compile, Bindings, Limits, Options, Placement};
use collc_kernels::{DataType, ReduceOp};
use collc_runtime::reference::{run, RankBuffers};

const RING: &str = include_str!("../../algorithms/allreduce/ring.coll");

fn allreduce(p: u32, count: usize, placement: Placement, op: ReduceOp) -> Vec<Vec<i32>> {
    let sched =
        compile(RING, &Bindings::ranks(p), Options::placed(placement), &Limits::default()).expect("ring verifies");
    let input =
        |r: u32| -> Vec<u8> { (0..count).flat_map(|i| ((r as i32 + 1) * 1000 + i as i32).to_le_bytes()).collect() };
    let mut buffers: Vec<RankBuffers> = (0..p)
        .map(|r| match placement {
            Placement::OutOfPlace => vec![input(r), vec![0xAB; count * 4]],
            Placement::InPlace => vec![Vec::new(), input(r)],
        })
        .collect();
    run(&sched, &mut buffers, count, DataType::I32, op).expect("runs");
    buffers.iter().map(|b| b[1].chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()).collect()
}

#[test]
fn ring_allreduce_sums_every_rank_once() {
    for placement in Placement::BOTH {
        for (p, count) in [(2, 7), (3, 1), (4, 1000), (5, 0), (8, 13)] {
            let out = allreduce(p, count, placement, ReduceOp::Sum);
            let expected: Vec<i32> = (0..count).map(|i| (1..=p as i32).map(|r| r * 1000 + i as i32).sum()).collect();
            for rank_out in &out {
                assert_eq!(rank_out, &expected, "p={p} count={count} {placement}");
            }
        }
    }
}

#[test]
fn ring_allreduce_max_and_avg() {
    let out = allreduce(4, 5, Placement::OutOfPlace, ReduceOp::Max);
    assert_eq!(out[2], (0..5).map(|i| 4000 + i).collect::<Vec<_>>());
    let out = allreduce(4, 5, Placement::InPlace, ReduceOp::Avg);
    assert_eq!(out[0], (0..5).map(|i| (10_000 + 4 * i) / 4).collect::<Vec<_>>());
}
