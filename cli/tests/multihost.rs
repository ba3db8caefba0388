//! Runs across hosts: one rank per network namespace (`netns/`), each started by hand with a torchrun or
//! Open MPI environment, over the tcp transport.

mod netns;

use netns::{assert_survivors_fail, printed, signal, wait_within, Hosts, Job, Launcher, ONE_OF_EACH_OTHER};
use std::time::Duration;

/// Runs `collc run ALGO` on `ranks` hosts with the data check; asserts every rank exits 0 and rank 0 counted no
/// wrong element.
fn run_checked(hosts: &Hosts, ranks: usize, launcher: Launcher, algorithm: &str) {
    let args = [algorithm, "--transport", "tcp", "-b", "8", "-e", "256K", "-f", "32", "-n", "2", "-w", "1", "-c", "1"];
    let outputs = Job::start(hosts, ranks, launcher, &args, &[("COLLC_TIMEOUT", "30")], |_| Vec::new()).wait();
    for (rank, out) in outputs.iter().enumerate() {
        assert!(out.status.success(), "{algorithm} rank {rank}: {}\n{}", out.status, printed(out));
    }
    let table = printed(&outputs[0]);
    assert!(table.contains("transport tcp"), "{algorithm}: {table}");
    assert!(table.contains("# Out of bounds values : 0 OK"), "{algorithm}: {table}");
}

#[test]
fn every_library_allreduce_and_one_of_each_collective_run_across_four_hosts() {
    let hosts = Hosts::new(4);
    let allreduces = ["ring", "tree", "one_shot", "two_shot", "rabenseifner", "recursive_doubling", "naive"];
    for name in allreduces {
        run_checked(&hosts, 4, Launcher::Torchrun, &format!("allreduce/{name}"));
    }
    run_checked(&hosts, 4, Launcher::Torchrun, "allreduce/hierarchical");
    for algorithm in ONE_OF_EACH_OTHER {
        run_checked(&hosts, 4, Launcher::OpenMpi, algorithm);
    }
}

/// A run that lasts until something stops it: 1 MiB allreduces, a million of them.
const ENDLESS: [&str; 13] =
    ["allreduce/ring", "--transport", "tcp", "-b", "1M", "-e", "1M", "-n", "1000000", "-w", "1", "-c", "0"];

fn no_args(_: usize) -> Vec<String> {
    Vec::new()
}

#[test]
fn a_rank_killed_stopped_or_cut_off_becomes_an_error_on_every_survivor() {
    let hosts = Hosts::new(3);
    let env = [("COLLC_TIMEOUT", "4")];

    let job = Job::start(&hosts, 3, Launcher::Torchrun, &ENDLESS, &env, no_args);
    std::thread::sleep(Duration::from_secs(2));
    signal(&job.ranks[2], libc::SIGKILL);
    let outputs = wait_within(job, Duration::from_secs(10), "SIGKILL");
    assert_survivors_fail(&outputs, &[0, 1], "rank 2", "SIGKILL of rank 2");

    // A stopped rank does not close anything: the others wait for it until their timeout.
    let mut job = Job::start(&hosts, 3, Launcher::Torchrun, &ENDLESS, &env, no_args);
    std::thread::sleep(Duration::from_secs(2));
    signal(&job.ranks[1], libc::SIGSTOP);
    let stopped = job.ranks.remove(1);
    let outputs = wait_within(job, Duration::from_secs(15), "SIGSTOP");
    signal(&stopped, libc::SIGKILL);
    let _ = stopped.wait_with_output();
    // With rank 1 taken out, outputs[1] is rank 2's. Both name the stopped rank: it no longer checks in with the
    // rendezvous.
    assert_survivors_fail(&outputs[..1], &[0], "rank 1 did not go on", "SIGSTOP of rank 1");
    let text = printed(&outputs[1]);
    assert!(!outputs[1].status.success() && text.contains("rank 2:"), "SIGSTOP of rank 1, rank 2:\n{text}");
    assert!(text.contains("rank 1 did not go on"), "SIGSTOP of rank 1, rank 2:\n{text}");

    // A host whose link goes down: its connections hang, every rank's wait ends at the timeout, and the survivors
    // name the rank that fell silent.
    let job = Job::start(&hosts, 3, Launcher::Torchrun, &ENDLESS, &env, no_args);
    std::thread::sleep(Duration::from_secs(2));
    hosts.link_down(2);
    let outputs = wait_within(job, Duration::from_secs(15), "link down");
    assert_survivors_fail(&outputs, &[0, 1], "rank 2 did not go on", "link of host 2 down");
}

#[test]
fn a_throttled_link_is_slower_but_right_and_mismatched_calls_fail_at_once() {
    let hosts = Hosts::new(3);
    hosts.throttle(1, "100mbit");
    run_checked(&hosts, 3, Launcher::Torchrun, "allreduce/ring");

    // Rank 1 calls with another count: the first message between them shows both calls.
    let args = ["allreduce/ring", "--transport", "tcp", "-b", "64K", "-e", "64K", "-n", "5", "-w", "0", "-c", "0"];
    let env = [("COLLC_TIMEOUT", "60")];
    let other = |rank: usize| if rank == 1 { vec!["-d".into(), "double".into()] } else { Vec::new() };
    // Within a third of the timeout: the mismatch is seen on the first message, not waited out.
    let outputs =
        wait_within(Job::start(&hosts, 3, Launcher::Torchrun, &args, &env, other), Duration::from_secs(20), "mismatch");
    let texts: Vec<String> = outputs.iter().map(printed).collect();
    assert!(outputs.iter().all(|o| !o.status.success()), "{texts:#?}");
    let shown = texts.iter().find(|t| t.contains("mismatched calls")).unwrap_or_else(|| panic!("{texts:#?}"));
    assert!(shown.matches("fingerprint").count() == 2, "both fingerprints: {shown}");
    assert!(shown.contains("double") && shown.contains("float"), "both calls: {shown}");
}
