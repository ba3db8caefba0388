//! Bad input to the tcp transport gets a clear error naming what and where, within the timeout: an unreachable
//! rendezvous, world sizes that differ, an interface pattern that matches nothing, no token.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One rank of a torchrun-style job on the loopback.
fn rank(rank: u32, world: u32, port: u16, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_collc"));
    command
        .args(["run", "allreduce/ring", "--transport", "tcp", "-b", "8", "-e", "8", "-n", "1", "-w", "0"])
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("TORCHELASTIC_RUN_ID", format!("tcp-test-{port}"))
        .env("COLLC_JOB_TOKEN", "tcp-bad-input-token-0123456789")
        .env("COLLC_SOCKET_IFNAME", "lo")
        .env("COLLC_TIMEOUT", "3")
        .envs(env.iter().copied());
    command
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn an_unreachable_rendezvous_is_an_error_within_the_timeout() {
    let started = Instant::now();
    let out = rank(1, 2, free_port(), &[]).output().expect("runs");
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("rank 1: could not join the rendezvous at 127.0.0.1:"), "{text}");
    assert!(text.contains("MASTER_ADDR/MASTER_PORT"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
}

#[test]
fn world_sizes_that_differ_are_refused_by_the_rendezvous() {
    let port = free_port();
    let host = rank(0, 2, port, &[]).spawn().expect("rank 0 starts");
    std::thread::sleep(Duration::from_millis(300));
    let out = rank(1, 3, port, &[]).output().expect("runs");
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("started with 3 ranks") && text.contains("another world size"), "{text}");
    let host = host.wait_with_output().expect("rank 0 ends");
    assert!(!host.status.success(), "rank 0 ran alone: {}", stderr(&host));
}

#[test]
fn an_interface_pattern_that_matches_nothing_or_a_missing_token_is_named() {
    let out = rank(0, 1, free_port(), &[("COLLC_SOCKET_IFNAME", "=nosuch0")]).output().expect("runs");
    let text = stderr(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("nosuch0") && text.contains("up here: ") && text.contains("127.0.0.1"),
        "names the pattern and what is up: {text}"
    );

    let mut command = rank(0, 1, free_port(), &[]);
    command.env_remove("COLLC_JOB_TOKEN");
    let out = command.output().expect("runs");
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("COLLC_JOB_TOKEN"), "{text}");
}
