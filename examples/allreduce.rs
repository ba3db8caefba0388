//! Using collc from your own program: NCCL-shaped calls on a `Communicator`.
//!
//! `cargo run --release -p collc-runtime --example allreduce` runs 4 ranks as threads of this process. Started by a
//! launcher (`torchrun --nproc-per-node 4 ...`, `mpirun -np 4 ...`, `srun -n 4 ...`), each process joins the job
//! as one rank over shared memory instead.

use collc_runtime::{Communicator, Options, ReduceOp, RuntimeError};

/// What every rank does: an allreduce and an allgather, checked against what they must give.
pub fn rank_main(comm: &mut Communicator) -> Result<(), RuntimeError> {
    let (rank, n_ranks) = (comm.rank() as usize, comm.n_ranks() as usize);
    let n = 1000;
    let send: Vec<f32> = (0..n).map(|i| (rank + i) as f32).collect();
    let mut sum = vec![0.0f32; n];
    comm.all_reduce(&send, &mut sum, ReduceOp::Sum)?;
    let want = |i: usize| (0..n_ranks).map(|r| (r + i) as f32).sum::<f32>();
    assert!(sum.iter().enumerate().all(|(i, &x)| x == want(i)), "rank {rank}: allreduce gave a wrong sum");

    let mut everyone = vec![0u64; n_ranks];
    comm.all_gather(&[rank as u64 * 10], &mut everyone)?;
    assert_eq!(everyone, (0..n_ranks as u64).map(|r| r * 10).collect::<Vec<_>>());

    comm.all_reduce_in_place(&mut sum, ReduceOp::Max)?;
    println!("rank {rank}/{n_ranks} ({}): allreduce and allgather correct", comm.transport());
    Ok(())
}

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = Options::from_env()?;
    if let Some(mut comm) = Communicator::from_env(options.clone())? {
        return Ok(rank_main(&mut comm)?);
    }
    let comms = Communicator::threads(4, options)?;
    std::thread::scope(|scope| {
        let ranks: Vec<_> = comms.into_iter().map(|mut comm| scope.spawn(move || rank_main(&mut comm))).collect();
        ranks.into_iter().try_for_each(|rank| rank.join().expect("a rank thread panicked"))
    })?;
    Ok(())
}
