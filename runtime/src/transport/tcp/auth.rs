//! Who may talk to a job's ports: ranks that hold its token. Every connection (to the rendezvous and between
//! ranks) opens with an HMAC-SHA256 challenge-response in both directions:
//!
//! 1. the acceptor sends a challenge: magic, protocol version, a fresh 32-byte nonce;
//! 2. the connector answers with what it is (purpose, socket index, rank, world size, job), its own nonce, and the
//!    MAC of both nonces and those fields under the token;
//! 3. the acceptor checks the answer and sends a verdict with its MAC over both nonces, so the connector knows it
//!    reached a holder of the token too.
//!
//! A replayed answer fails (the acceptor's nonce is new each time); another job's token, a wrong version, garbage
//! or a truncated message fail with a reason; the acceptor gives a handshake `HANDSHAKE_TIMEOUT` in all, so a peer
//! that sends a byte a second is cut off. Messages are fixed-size: nothing a peer sends sets a length here.

use crate::log::{self, Subsys};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type HmacSha256 = Hmac<Sha256>;

pub const MAGIC: [u8; 8] = *b"collc-hs";
/// The wire protocol's version: frames, store messages and this handshake.
pub const VERSION: u32 = 1;
/// How long an acceptor gives a connecting peer for the whole handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
pub const NONCE: usize = 32;
const MAC: usize = 32;
pub const CHALLENGE: usize = 8 + 4 + NONCE;
pub const ANSWER: usize = 8 + 4 + 4 + 4 + 4 + 8 + NONCE + MAC;
const VERDICT: usize = 4 + MAC;

/// The secret every rank of a job holds.
#[derive(Clone)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// At least 16 bytes: a short token can be guessed.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Token, String> {
        let bytes = bytes.into();
        if bytes.len() < 16 {
            return Err(format!(
                "a job token needs at least 16 bytes, this one has {}: use `collc run`'s own or `openssl rand -hex 32`",
                bytes.len()
            ));
        }
        Ok(Token(bytes))
    }

    /// `COLLC_JOB_TOKEN`, else the contents of the file `COLLC_JOB_TOKEN_FILE` names (surrounding whitespace cut);
    /// `Ok(None)` when neither is set.
    pub fn from_env() -> Result<Option<Token>, String> {
        if let Ok(text) = std::env::var("COLLC_JOB_TOKEN") {
            return Token::new(text.trim()).map(Some).map_err(|e| format!("COLLC_JOB_TOKEN: {e}"));
        }
        let Ok(path) = std::env::var("COLLC_JOB_TOKEN_FILE") else { return Ok(None) };
        let text = std::fs::read_to_string(&path).map_err(|e| format!("COLLC_JOB_TOKEN_FILE={path}: {e}"))?;
        Token::new(text.trim()).map(Some).map_err(|e| format!("COLLC_JOB_TOKEN_FILE={path}: {e}"))
    }

    /// A fresh token of 32 random bytes, hex: for a launcher that starts every rank itself.
    pub fn generate() -> Result<String, String> {
        let bytes = random::<32>()?;
        Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    fn mac(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        for part in parts {
            mac.update(part);
        }
        mac
    }
}

fn random<const N: usize>() -> Result<[u8; N], String> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness from the OS: {e}"))?;
    Ok(bytes)
}

/// What a connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Purpose {
    Rendezvous = 1,
    Data = 2,
}

/// What the connector says it is; the MAC covers all of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub purpose: Purpose,
    /// Which of the connections between two ranks (data), 0 for the rendezvous.
    pub socket: u8,
    pub rank: u32,
    pub world: u32,
    pub job: u64,
}

/// Why an acceptor refused a peer; the code travels in the verdict so the peer can say it too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Refusal {
    Garbage = 1,
    Version = 2,
    Token = 3,
    Job = 4,
    Purpose = 5,
    Rank = 6,
}

impl Refusal {
    fn from_code(code: u8) -> Option<Refusal> {
        [Refusal::Garbage, Refusal::Version, Refusal::Token, Refusal::Job, Refusal::Purpose, Refusal::Rank]
            .into_iter()
            .find(|r| *r as u8 == code)
    }

    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Garbage => "not a collc handshake",
            Refusal::Version => "another protocol version",
            Refusal::Token => "wrong job token (another job, or COLLC_JOB_TOKEN differs between ranks)",
            Refusal::Job => "another job id",
            Refusal::Purpose => "wrong kind of connection for this port",
            Refusal::Rank => "rank outside the world, or world size differs",
        }
    }
}

/// Why a handshake failed, from either end.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("timed out after {0:.1} s")]
    Timeout(f64),
    #[error("refused: {}", .0.reason())]
    Refused(Refusal),
    #[error("the other end refused us: {}", .0.reason())]
    RefusedByPeer(Refusal),
    #[error("the other end does not hold the job token (its proof does not verify)")]
    Impostor,
    #[error("the other end sent a malformed verdict")]
    BadVerdict,
    #[error("the other end speaks protocol version {0}, this rank {VERSION}")]
    PeerVersion(u32),
    #[error("{0}")]
    Random(String),
}

/// Reads exactly `buf.len()` bytes before `deadline`.
fn read_exact_by(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<(), HandshakeError> {
    let started = deadline.checked_sub(HANDSHAKE_TIMEOUT).unwrap_or_else(Instant::now);
    let mut have = 0;
    while have < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HandshakeError::Timeout(started.elapsed().as_secs_f64()));
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf[have..]) {
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => have += n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(HandshakeError::Timeout(started.elapsed().as_secs_f64()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn hello_bytes(hello: &Hello) -> [u8; 24] {
    let mut b = [0u8; 24];
    b[0] = hello.purpose as u8;
    b[1] = hello.socket;
    b[4..8].copy_from_slice(&hello.rank.to_le_bytes());
    b[8..12].copy_from_slice(&hello.world.to_le_bytes());
    b[12..20].copy_from_slice(&hello.job.to_le_bytes());
    b[20..24].copy_from_slice(&VERSION.to_le_bytes());
    b
}

/// The accepting end: challenges the peer and checks its answer; on success, what it said it is. `expect` checks
/// the hello against what this port serves (purpose, job, world) and returns the refusal if it does not fit.
pub fn accept(
    stream: &mut TcpStream,
    token: &Token,
    expect: impl Fn(&Hello) -> Option<Refusal>,
) -> Result<Hello, HandshakeError> {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let ours = random::<NONCE>().map_err(HandshakeError::Random)?;
    let mut challenge = [0u8; CHALLENGE];
    challenge[..8].copy_from_slice(&MAGIC);
    challenge[8..12].copy_from_slice(&VERSION.to_le_bytes());
    challenge[12..].copy_from_slice(&ours);
    stream.write_all(&challenge)?;
    let mut answer = [0u8; ANSWER];
    // A peer that sends fewer bytes than an answer, or none, is cut off at the deadline.
    read_exact_by(stream, &mut answer, deadline)?;
    let (hello, theirs) = match check_answer(&answer, &ours, token, expect) {
        Ok(checked) => checked,
        Err(why) => {
            let mut verdict = [0u8; VERDICT];
            verdict[0] = why as u8;
            let _ = stream.write_all(&verdict);
            return Err(HandshakeError::Refused(why));
        }
    };
    let theirs = &theirs;
    let mut verdict = [0u8; VERDICT];
    let mac = token.mac(&[b"collc-acceptor", theirs, &ours, &hello_bytes(&hello)]).finalize().into_bytes();
    verdict[4..].copy_from_slice(&mac);
    stream.write_all(&verdict)?;
    Ok(hello)
}

/// Checks a connector's answer to the challenge with nonce `ours`: what it says it is and its nonce, or why it is
/// refused. Total over any bytes.
pub fn check_answer(
    answer: &[u8; ANSWER],
    ours: &[u8; NONCE],
    token: &Token,
    expect: impl Fn(&Hello) -> Option<Refusal>,
) -> Result<(Hello, [u8; NONCE]), Refusal> {
    if answer[..8] != MAGIC {
        return Err(Refusal::Garbage);
    }
    let u32_at = |i: usize| u32::from_le_bytes(answer[i..i + 4].try_into().expect("4 bytes"));
    if u32_at(8) != VERSION {
        return Err(Refusal::Version);
    }
    let purpose = match answer[12] {
        1 => Purpose::Rendezvous,
        2 => Purpose::Data,
        _ => return Err(Refusal::Garbage),
    };
    let hello = Hello {
        purpose,
        socket: answer[13],
        rank: u32_at(16),
        world: u32_at(20),
        job: u64::from_le_bytes(answer[24..32].try_into().expect("8 bytes")),
    };
    let theirs: [u8; NONCE] = answer[32..32 + NONCE].try_into().expect("a nonce");
    let proof = &answer[32 + NONCE..];
    if token.mac(&[b"collc-connector", ours, &theirs, &hello_bytes(&hello)]).verify_slice(proof).is_err() {
        return Err(Refusal::Token);
    }
    match expect(&hello) {
        Some(why) => Err(why),
        None => Ok((hello, theirs)),
    }
}

/// The answer of a connector that is `hello`, with nonce `ours`, to a challenge with nonce `theirs`.
pub fn answer(hello: &Hello, theirs: &[u8; NONCE], ours: &[u8; NONCE], token: &Token) -> [u8; ANSWER] {
    let mut answer = [0u8; ANSWER];
    answer[..8].copy_from_slice(&MAGIC);
    answer[8..12].copy_from_slice(&VERSION.to_le_bytes());
    answer[12] = hello.purpose as u8;
    answer[13] = hello.socket;
    answer[16..20].copy_from_slice(&hello.rank.to_le_bytes());
    answer[20..24].copy_from_slice(&hello.world.to_le_bytes());
    answer[24..32].copy_from_slice(&hello.job.to_le_bytes());
    answer[32..32 + NONCE].copy_from_slice(ours);
    let mac = token.mac(&[b"collc-connector", theirs, ours, &hello_bytes(hello)]).finalize().into_bytes();
    answer[32 + NONCE..].copy_from_slice(&mac);
    answer
}

/// Handshakes an acceptor runs at once; more connections are refused (and logged) until some end.
const MAX_HANDSHAKES: usize = 64;

/// Serves a port until `stop`: every connection is authenticated (`accept` with `expect`) on a thread of its own,
/// bounded in time by `HANDSHAKE_TIMEOUT` and in number by `MAX_HANDSHAKES`, and handed with its hello to
/// `accepted` on that thread (which may serve it there for good). Refusals are logged with the reason, naming
/// the port `what`.
pub fn serve<E, A>(listener: TcpListener, token: Token, stop: Arc<AtomicBool>, what: String, expect: E, accepted: A)
where
    E: Fn(&Hello) -> Option<Refusal> + Send + Sync + 'static,
    A: Fn(TcpStream, Hello) + Send + Sync + 'static,
{
    let (expect, accepted) = (Arc::new(expect), Arc::new(accepted));
    let running = Arc::new(AtomicUsize::new(0));
    // Failed accepts in a row (EMFILE, ENOBUFS, ...): each waits longer, up to a second, and the first is logged.
    let mut failing = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let (mut stream, from) = match listener.accept() {
            Ok(connection) => {
                failing = 0;
                connection
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(e) => {
                if failing == 0 {
                    log::warn(Subsys::Net, format_args!("{what}: accept failed ({e}); backing off"));
                }
                failing = failing.saturating_add(1);
                std::thread::sleep(accept_backoff(failing));
                continue;
            }
        };
        if running.load(Ordering::Relaxed) >= MAX_HANDSHAKES {
            log::warn(Subsys::Net, format_args!("{what}: refused {from}: {MAX_HANDSHAKES} handshakes under way"));
            continue;
        }
        running.fetch_add(1, Ordering::Relaxed);
        let (token, expect, accepted, running, port) =
            (token.clone(), expect.clone(), accepted.clone(), running.clone(), what.clone());
        let spawned = std::thread::Builder::new().name("collc handshake".into()).spawn(move || {
            let _ = stream.set_nonblocking(false);
            let hello = accept(&mut stream, &token, |h| expect(h));
            running.fetch_sub(1, Ordering::Relaxed);
            match hello {
                Ok(hello) => accepted(stream, hello),
                Err(e) => log::warn(Subsys::Net, format_args!("{port}: refused {from}: {e}")),
            }
        });
        if spawned.is_err() {
            log::warn(Subsys::Net, format_args!("{what}: no thread to authenticate {from}; refused"));
        }
    }
}

/// How long the acceptor waits after `failing` failed accepts in a row: 10 ms doubling to a second, so a listener
/// out of file descriptors neither spins nor stops serving once some are free again.
fn accept_backoff(failing: u32) -> Duration {
    Duration::from_millis((10u64 << failing.saturating_sub(1).min(7)).min(1000))
}

/// The connecting end: answers the challenge as `hello` and checks that the acceptor holds the token too.
pub fn connect(stream: &mut TcpStream, token: &Token, hello: &Hello, timeout: Duration) -> Result<(), HandshakeError> {
    let deadline = Instant::now() + timeout;
    stream.set_write_timeout(Some(timeout))?;
    let mut challenge = [0u8; CHALLENGE];
    read_exact_by(stream, &mut challenge, deadline)?;
    if challenge[..8] != MAGIC {
        return Err(HandshakeError::BadVerdict);
    }
    let version = u32::from_le_bytes(challenge[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(HandshakeError::PeerVersion(version));
    }
    let theirs: [u8; NONCE] = challenge[12..].try_into().expect("a nonce");
    let ours = random::<NONCE>().map_err(HandshakeError::Random)?;
    let fields = hello_bytes(hello);
    stream.write_all(&answer(hello, &theirs, &ours, token))?;
    let mut verdict = [0u8; VERDICT];
    read_exact_by(stream, &mut verdict, deadline)?;
    if verdict[0] != 0 {
        return Err(Refusal::from_code(verdict[0]).map_or(HandshakeError::BadVerdict, HandshakeError::RefusedByPeer));
    }
    if token.mac(&[b"collc-acceptor", &ours, &theirs, &fields]).verify_slice(&verdict[4..]).is_err() {
        return Err(HandshakeError::Impostor);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn failed_accepts_back_off_to_a_second() {
        let waits: Vec<u128> = (1..=10).map(|n| super::accept_backoff(n).as_millis()).collect();
        assert_eq!(waits[..4], [10, 20, 40, 80]);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]) && waits[9] == 1000, "{waits:?}");
    }

    fn token(text: &str) -> Token {
        Token::new(text).expect("long enough")
    }

    fn hello() -> Hello {
        Hello { purpose: Purpose::Data, socket: 0, rank: 1, world: 2, job: 9 }
    }

    /// Runs an acceptor with `server` on one end of a loopback connection and `client` on the other.
    fn pair<T: Send>(server: Token, client: impl FnOnce(TcpStream) -> T + Send) -> (Result<Hello, HandshakeError>, T) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::scope(|s| {
            let accepted = s.spawn(move || {
                let (mut stream, _) = listener.accept().unwrap();
                accept(&mut stream, &server, |h| (h.job != 9).then_some(Refusal::Job))
            });
            let out = client(TcpStream::connect(addr).unwrap());
            (accepted.join().unwrap(), out)
        })
    }

    #[test]
    fn holders_of_the_token_get_in_and_others_are_refused_with_a_reason() {
        let good = token("0123456789abcdef-job-a");
        let (server, client) = pair(good.clone(), |mut s| connect(&mut s, &good, &hello(), Duration::from_secs(5)));
        assert_eq!(server.unwrap(), hello());
        client.unwrap();

        let other = token("0123456789abcdef-job-b");
        let (server, client) = pair(good.clone(), |mut s| connect(&mut s, &other, &hello(), Duration::from_secs(5)));
        assert!(matches!(server, Err(HandshakeError::Refused(Refusal::Token))), "{server:?}");
        assert!(matches!(client, Err(HandshakeError::RefusedByPeer(Refusal::Token))), "{client:?}");

        let wrong_job = Hello { job: 10, ..hello() };
        let (server, _) = pair(good.clone(), |mut s| connect(&mut s, &good, &wrong_job, Duration::from_secs(5)));
        assert!(matches!(server, Err(HandshakeError::Refused(Refusal::Job))), "{server:?}");
    }

    #[test]
    fn garbage_a_replay_and_silence_are_refused() {
        let good = token("0123456789abcdef-job-a");
        let (server, _) = pair(good.clone(), |mut s| {
            s.write_all(&[0x5a; ANSWER]).unwrap();
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        });
        assert!(matches!(server, Err(HandshakeError::Refused(Refusal::Garbage))), "{server:?}");

        // Record an honest answer, then replay it to a new challenge.
        let recorded = std::sync::Mutex::new(Vec::new());
        let (server, _) = pair(good.clone(), |s| {
            let mut s = Recorder { inner: s, sent: &recorded };
            connect_through(&mut s, &good);
        });
        server.unwrap();
        let answer = recorded.lock().unwrap().clone();
        let (server, _) = pair(good.clone(), |mut s| {
            let mut challenge = [0u8; CHALLENGE];
            s.read_exact(&mut challenge).unwrap();
            s.write_all(&answer).unwrap();
        });
        assert!(matches!(server, Err(HandshakeError::Refused(Refusal::Token))), "{server:?}");

        let started = Instant::now();
        let (server, _) = pair(good, |mut s| {
            // One byte, then nothing: the acceptor gives up at its deadline.
            s.write_all(b"c").unwrap();
            std::thread::sleep(HANDSHAKE_TIMEOUT + Duration::from_millis(300));
        });
        assert!(matches!(server, Err(HandshakeError::Timeout(_))), "{server:?}");
        assert!(started.elapsed() < HANDSHAKE_TIMEOUT + Duration::from_secs(2));
    }

    proptest::proptest! {
        /// Any bytes as an answer are refused (never a panic), unless they carry the token's proof.
        #[test]
        fn any_answer_without_the_proof_is_refused(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), ANSWER), magic in proptest::prelude::any::<bool>()) {
            let mut answer: [u8; ANSWER] = bytes.try_into().unwrap();
            if magic {
                answer[..8].copy_from_slice(&MAGIC);
                answer[8..12].copy_from_slice(&VERSION.to_le_bytes());
                answer[12] = 2;
            }
            let checked = check_answer(&answer, &[3u8; NONCE], &token("0123456789abcdef-job-a"), |_| None);
            proptest::prop_assert!(checked.is_err());
        }
    }

    /// A stream that keeps what the connector writes after the challenge (its answer).
    struct Recorder<'a> {
        inner: TcpStream,
        sent: &'a std::sync::Mutex<Vec<u8>>,
    }

    fn connect_through(s: &mut Recorder, token: &Token) {
        let mut challenge = [0u8; CHALLENGE];
        s.inner.read_exact(&mut challenge).unwrap();
        let answer = answer(&hello(), &challenge[12..].try_into().unwrap(), &[7u8; NONCE], token);
        s.inner.write_all(&answer).unwrap();
        *s.sent.lock().unwrap() = answer.to_vec();
        let mut verdict = [0u8; VERDICT];
        s.inner.read_exact(&mut verdict).unwrap();
        assert_eq!(verdict[0], 0);
    }
}
