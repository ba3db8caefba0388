//! Hosts for multi-host tests: one network namespace per rank, each with its own address on a veth pair whose
//! other end sits on a bridge in a "switch" namespace of the test's own, so nothing touches the host's network.
//! Everything is removed when the `Hosts` is dropped (a failing test unwinds through the drop too), and namespaces
//! that a killed test run left behind are removed by the next one. Needs root and iproute2 (`ip`, `tc`), which
//! `.ci/run` installs. Shared by the test binaries that run across hosts, each using part of it.
#![allow(dead_code)]

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const PREFIX: &str = "collc-t";

/// One library algorithm of each collective but allreduce, which the tests across hosts run.
pub const ONE_OF_EACH_OTHER: [&str; 8] = [
    "allgather/ring",
    "reducescatter/ring",
    "broadcast/binomial",
    "reduce/binomial",
    "gather/binomial",
    "scatter/binomial",
    "alltoall/pairwise",
    "sendrecv/direct",
];

/// The binary a `Job` runs: the cli package's (the python package's torch tests use `Hosts` alone).
fn collc_binary() -> &'static str {
    match option_env!("CARGO_BIN_EXE_collc") {
        Some(path) => path,
        None => panic!("a Job runs the collc binary: only the cli package's tests have it"),
    }
}

pub struct Hosts {
    switch: String,
    hosts: Vec<String>,
}

fn ip(args: &[&str]) -> Output {
    let out = Command::new("ip").args(args).output().expect("`ip` runs (iproute2; .ci/run installs it)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    out
}

/// Removes namespaces of earlier test processes that are gone (`collc-t<pid>-...`).
fn remove_stale() {
    let Ok(list) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&list.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(pid) = name.strip_prefix(PREFIX).and_then(|rest| rest.split('-').next()) else { continue };
        let Ok(pid) = pid.parse::<i32>() else { continue };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        if pid != std::process::id() as i32 && unsafe { libc::kill(pid, 0) } != 0 {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

impl Hosts {
    /// `n` hosts, 10.77.0.1 .. 10.77.0.n on one switch.
    pub fn new(n: usize) -> Hosts {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "the multi-host tests make network namespaces: run them as root");
        remove_stale();
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let id = format!("{PREFIX}{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let mut made = Hosts { switch: format!("{id}-sw"), hosts: Vec::new() };
        ip(&["netns", "add", &made.switch]);
        ip(&["-n", &made.switch, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &made.switch, "link", "set", "br0", "up"]);
        for i in 0..n {
            let host = format!("{id}-h{i}");
            ip(&["netns", "add", &host]);
            made.hosts.push(host.clone());
            let port = format!("p{i}");
            ip(&["-n", &made.switch, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &host]);
            ip(&["-n", &made.switch, "link", "set", &port, "master", "br0", "up"]);
            ip(&["-n", &host, "addr", "add", &format!("{}/24", Hosts::addr(i)), "dev", "eth0"]);
            ip(&["-n", &host, "link", "set", "eth0", "up"]);
            ip(&["-n", &host, "link", "set", "lo", "up"]);
        }
        made
    }

    pub fn addr(i: usize) -> String {
        format!("10.77.0.{}", i + 1)
    }

    /// `program args` in host `i`.
    pub fn command(&self, i: usize, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.hosts[i], program]);
        command
    }

    /// Cuts host `i` off: its link goes down.
    pub fn link_down(&self, i: usize) {
        ip(&["-n", &self.hosts[i], "link", "set", "eth0", "down"]);
    }

    /// Limits what host `i` sends to `rate` (tc's token bucket filter, e.g. `50mbit`).
    pub fn throttle(&self, i: usize, rate: &str) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.hosts[i], "tc", "qdisc", "add", "dev", "eth0", "root", "tbf"])
            .args(["rate", rate, "burst", "64kb", "latency", "400ms"])
            .output()
            .expect("tc runs (iproute2)");
        assert!(out.status.success(), "tc: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth ends in it, and with them their peers.
        for name in self.hosts.iter().chain([&self.switch]) {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

/// A job of ranks on hosts, started by hand with a launcher's environment.
pub struct Job {
    pub ranks: Vec<Child>,
}

/// How the ranks are told who they are.
#[derive(Clone, Copy)]
pub enum Launcher {
    /// torchrun: RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
    Torchrun,
    /// mpirun (Open MPI): OMPI_COMM_WORLD_*, with the rendezvous in COLLC_RENDEZVOUS.
    OpenMpi,
}

impl Job {
    /// Starts `collc run ARGS` on each of `ranks` hosts (rank i on host i), rank 0's host holding the rendezvous.
    /// `env` goes to every rank; `per_rank(i)` adds arguments of rank i.
    pub fn start(
        hosts: &Hosts,
        ranks: usize,
        launcher: Launcher,
        args: &[&str],
        env: &[(&str, &str)],
        per_rank: impl Fn(usize) -> Vec<String>,
    ) -> Job {
        let per_rank = |i: usize, command: &mut Command| {
            command.args(per_rank(i));
        };
        Job::start_on(hosts, &(0..ranks).collect::<Vec<_>>(), launcher, args, env, per_rank)
    }

    /// As `start`, rank i on host `placement[i]` (several ranks on a host: its local world size says how many);
    /// `per_rank(i, command)` adds what rank i's command has of its own (arguments, variables).
    pub fn start_on(
        hosts: &Hosts,
        placement: &[usize],
        launcher: Launcher,
        args: &[&str],
        env: &[(&str, &str)],
        per_rank: impl Fn(usize, &mut Command),
    ) -> Job {
        static PORT: AtomicUsize = AtomicUsize::new(29500);
        let port = PORT.fetch_add(1, Ordering::Relaxed).to_string();
        let run_id = format!("netns-{}-{port}", std::process::id());
        let ranks = placement.len();
        let ranks = (0..ranks)
            .map(|i| {
                let host = placement[i];
                let local = placement.iter().filter(|&&h| h == host).count().to_string();
                let mut command = hosts.command(host, collc_binary());
                command.arg("run").args(args);
                per_rank(i, &mut command);
                match launcher {
                    Launcher::Torchrun => command
                        .env("RANK", i.to_string())
                        .env("WORLD_SIZE", ranks.to_string())
                        .env("LOCAL_WORLD_SIZE", &local)
                        .env("MASTER_ADDR", Hosts::addr(0))
                        .env("MASTER_PORT", &port)
                        .env("TORCHELASTIC_RUN_ID", &run_id),
                    Launcher::OpenMpi => command
                        .env("OMPI_COMM_WORLD_RANK", i.to_string())
                        .env("OMPI_COMM_WORLD_SIZE", ranks.to_string())
                        .env("OMPI_COMM_WORLD_LOCAL_SIZE", &local)
                        .env("PMIX_NAMESPACE", &run_id)
                        .env("COLLC_RENDEZVOUS", format!("{}:{port}", Hosts::addr(0))),
                };
                command
                    .env("COLLC_JOB_TOKEN", "netns-test-token-0123456789abcdef")
                    .envs(env.iter().copied())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("a rank starts")
            })
            .collect();
        Job { ranks }
    }

    /// Every rank's exit status, stdout and stderr.
    pub fn wait(self) -> Vec<Output> {
        self.ranks.into_iter().map(|child| child.wait_with_output().expect("a rank ends")).collect()
    }
}

/// What a rank printed, stdout then stderr.
pub fn printed(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Every rank's output, each within `limit` of now; a rank still running then is killed and the test fails.
pub fn wait_within(job: Job, limit: Duration, what: &str) -> Vec<Output> {
    let deadline = Instant::now() + limit;
    let mut ranks = job.ranks;
    for (rank, child) in ranks.iter_mut().enumerate() {
        while child.try_wait().expect("try_wait").is_none() {
            if Instant::now() > deadline {
                for child in &mut ranks {
                    let _ = child.kill();
                }
                panic!("{what}: rank {rank} still running after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    ranks.into_iter().map(|child| child.wait_with_output().expect("a rank ends")).collect()
}

pub fn signal(child: &std::process::Child, signal: i32) {
    // SAFETY: signalling a child this test started and has not reaped.
    unsafe { libc::kill(child.id() as i32, signal) };
}

/// The survivors of a fault exit non-zero in time, each with an error that names a rank, the instruction and the
/// `.coll` line it was at.
pub fn assert_survivors_fail(outputs: &[Output], survivors: &[usize], needle: &str, what: &str) {
    for &rank in survivors {
        let text = printed(&outputs[rank]);
        assert!(!outputs[rank].status.success(), "{what}: rank {rank} succeeded:\n{text}");
        assert!(text.contains(&format!("rank {rank}:")), "{what}: rank {rank} does not name itself:\n{text}");
        assert!(text.contains(needle), "{what}: rank {rank} does not mention `{needle}`:\n{text}");
        assert!(text.contains("instruction #") && text.contains(" line "), "{what}: rank {rank}:\n{text}");
    }
}
