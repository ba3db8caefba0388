//! Hostile peers against the ports of a tcp job: its rendezvous and its ranks' data ports. Beside an honest job,
//! a missing or wrong token, a replayed handshake, another protocol version, garbage, a length field of 2^63, a
//! truncated handshake, a peer that sends a byte a second and a second job on the same port are each refused with
//! a logged reason, within the handshake's deadline; the honest job finishes with 0 wrong.

use collc_runtime::transport::tcp::auth::{self, Hello, Purpose, Refusal, Token, ANSWER, CHALLENGE, MAGIC, NONCE};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TOKEN: &str = "hostile-test-token-0123456789abcdef";
/// The handshake deadline and some slack for a loaded machine.
const CUT_OFF: Duration = Duration::from_secs(8);

fn token() -> Token {
    Token::new(TOKEN).expect("long enough")
}

/// Reads what the acceptor sends until it closes (the challenge already read); how long that took, and the
/// verdict's refusal code if one came.
fn until_closed(stream: &mut TcpStream, started: Instant) -> (Duration, Option<u8>) {
    stream.set_read_timeout(Some(CUT_OFF * 2)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let verdict = got.first().copied();
    (started.elapsed(), verdict)
}

fn challenge(stream: &mut TcpStream) -> [u8; NONCE] {
    let mut challenge = [0u8; CHALLENGE];
    stream.read_exact(&mut challenge).expect("a challenge");
    assert_eq!(challenge[..8], MAGIC);
    challenge[12..].try_into().unwrap()
}

/// An answer a holder of the token made for another acceptor's challenge, recorded for replay.
fn recorded_answer(hello: Hello) -> [u8; ANSWER] {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        auth::accept(&mut s, &token(), |_| None).map(|_| ())
    });
    let mut s = TcpStream::connect(addr).unwrap();
    let theirs = challenge(&mut s);
    let answer = auth::answer(&hello, &theirs, &[9u8; NONCE], &token());
    s.write_all(&answer).unwrap();
    let _ = until_closed(&mut s, Instant::now());
    acceptor.join().unwrap().expect("the recorded handshake itself was good");
    answer
}

/// What an attacker does once it has read the acceptor's challenge (its nonce).
type Act = Box<dyn FnOnce(&mut TcpStream, [u8; NONCE]) + Send>;

/// Each attack on `target`; panics unless every one is refused in time.
fn attack(target: SocketAddr, purpose: Purpose) {
    let hello = Hello { purpose, socket: 0, rank: 0, world: 3, job: 0 };
    let attacks: Vec<(&str, Act, Option<Refusal>)> = vec![
        (
            "no token",
            Box::new(|s: &mut TcpStream, _| {
                let mut answer = [0u8; ANSWER];
                answer[..8].copy_from_slice(&MAGIC);
                answer[8..12].copy_from_slice(&auth::VERSION.to_le_bytes());
                answer[12] = 2;
                s.write_all(&answer).unwrap();
            }),
            Some(Refusal::Token),
        ),
        (
            "wrong token",
            Box::new(move |s: &mut TcpStream, theirs| {
                let other = Token::new("another-job-token-0123456789").unwrap();
                s.write_all(&auth::answer(&hello, &theirs, &[1u8; NONCE], &other)).unwrap();
            }),
            Some(Refusal::Token),
        ),
        (
            "replayed handshake",
            Box::new(move |s: &mut TcpStream, _| {
                let answer = recorded_answer(hello);
                s.write_all(&answer).unwrap();
            }),
            Some(Refusal::Token),
        ),
        (
            "another protocol version",
            Box::new(move |s: &mut TcpStream, theirs| {
                let mut answer = auth::answer(&hello, &theirs, &[2u8; NONCE], &token());
                answer[8..12].copy_from_slice(&99u32.to_le_bytes());
                s.write_all(&answer).unwrap();
            }),
            Some(Refusal::Version),
        ),
        (
            "garbage",
            Box::new(|s: &mut TcpStream, _| {
                let garbage: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
                let _ = s.write_all(&garbage);
            }),
            Some(Refusal::Garbage),
        ),
        (
            "a length field of 2^63",
            Box::new(|s: &mut TcpStream, _| {
                let _ = s.write_all(&(1u64 << 63).to_le_bytes());
            }),
            None,
        ),
        (
            "a truncated handshake",
            Box::new(move |s: &mut TcpStream, theirs| {
                let answer = auth::answer(&hello, &theirs, &[3u8; NONCE], &token());
                s.write_all(&answer[..ANSWER / 2]).unwrap();
                s.shutdown(std::net::Shutdown::Write).unwrap();
            }),
            None,
        ),
        (
            "a byte a second",
            Box::new(|s: &mut TcpStream, _| {
                for byte in MAGIC {
                    if s.write_all(&[byte]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            }),
            None,
        ),
    ];
    let threads: Vec<_> = attacks
        .into_iter()
        .map(|(name, act, refusal)| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(target).unwrap_or_else(|e| panic!("{name}: connect {target}: {e}"));
                let started = Instant::now();
                let theirs = challenge(&mut s);
                act(&mut s, theirs);
                let (took, verdict) = until_closed(&mut s, started);
                assert!(took < CUT_OFF + Duration::from_secs(2), "{name} on {target}: open for {took:?}");
                if let Some(refusal) = refusal {
                    assert_eq!(verdict, Some(refusal as u8), "{name} on {target}: the verdict");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("an attack thread");
    }
}

/// Through the network proxy thread and with the executors moving the data themselves (`COLLC_NET_PROXY`).
#[test]
fn hostile_peers_are_refused_and_the_honest_job_beside_them_finishes_right() {
    for (mode, said) in [("1", "(proxy thread)"), ("0", "(inline)")] {
        honest_job_beside_hostile_peers(mode, said);
    }
}

fn honest_job_beside_hostile_peers(mode: &str, said: &str) {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut honest = Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(["run", "allreduce/ring", "--transport", "tcp", "--ranks", "3"])
        .args(["-b", "8", "-e", "4M", "-f", "4", "-n", "1500", "-w", "2", "-c", "1"])
        .env("COLLC_NET_PROXY", mode)
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("COLLC_JOB_TOKEN", TOKEN)
        .env("COLLC_SOCKET_IFNAME", "lo")
        .env("COLLC_DEBUG", "INFO")
        .env("COLLC_TIMEOUT", "60")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("collc starts");
    let (lines, heard) = mpsc::channel();
    let stderr = honest.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines.send(line.clone());
            all.push(line);
        }
        all
    });
    // The data ports, from the ranks' INFO lines.
    let mut data_ports: Vec<SocketAddr> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while data_ports.len() < 3 && Instant::now() < deadline {
        let Ok(line) = heard.recv_timeout(Duration::from_secs(1)) else { continue };
        if let Some(addr) = line.split("data port ").nth(1).and_then(|rest| rest.split_whitespace().next()) {
            data_ports.push(addr.parse().expect("an address"));
        }
    }
    assert_eq!(data_ports.len(), 3, "the ranks' data ports");
    let rendezvous: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    std::thread::scope(|scope| {
        scope.spawn(|| attack(rendezvous, Purpose::Rendezvous));
        scope.spawn(|| attack(data_ports[2], Purpose::Data));
        // A second job on the same port, with its own token: it cannot take the port, nor join this job.
        scope.spawn(|| {
            let started = Instant::now();
            let second = Command::new(env!("CARGO_BIN_EXE_collc"))
                .args(["run", "allreduce/ring", "--transport", "tcp", "--ranks", "2", "-b", "8", "-e", "8"])
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("COLLC_JOB_TOKEN", "the-second-job-token-0123456789")
                .env("COLLC_TIMEOUT", "10")
                .output()
                .expect("collc starts");
            let text = String::from_utf8_lossy(&second.stderr);
            assert!(!second.status.success(), "the second job ran: {text}");
            assert!(text.contains("in use"), "the second job's error: {text}");
            assert!(started.elapsed() < Duration::from_secs(30), "the second job took {:?}", started.elapsed());
        });
    });

    let status = honest.wait().expect("the honest job ends");
    let mut stdout = String::new();
    honest.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    let log = reader.join().unwrap().join("\n");
    assert!(status.success(), "the honest job failed: {status}\n{stdout}\n{log}");
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
    for reason in ["wrong job token", "not a collc handshake", "another protocol version", "timed out"] {
        assert!(log.contains(reason), "no refusal logged with `{reason}`:\n{log}");
    }
    assert!(log.contains(&format!("via NET/Socket/1 {said}")), "COLLC_NET_PROXY={mode}:\n{log}");
}
