//! Log lines in NCCL's shape, `host:pid:tid [rank] COLLC LEVEL message`, to stderr (or `COLLC_DEBUG_FILE`).
//! `COLLC_DEBUG` sets the level (`WARN`, the default, `INFO`, `TRACE`; `NONE` silences it) and
//! `COLLC_DEBUG_SUBSYS` the subsystems (`INIT,NET`, `^NET`, `ALL`, the default), as NCCL_DEBUG and
//! NCCL_DEBUG_SUBSYS do.

use std::fmt::Arguments;
use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    None,
    Warn,
    Info,
    Trace,
}

/// What a line is about, for `COLLC_DEBUG_SUBSYS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subsys {
    Init,
    Net,
    Coll,
}

impl Subsys {
    const ALL: [Subsys; 3] = [Subsys::Init, Subsys::Net, Subsys::Coll];

    fn name(self) -> &'static str {
        match self {
            Subsys::Init => "INIT",
            Subsys::Net => "NET",
            Subsys::Coll => "COLL",
        }
    }
}

struct Config {
    level: Level,
    /// Bit per subsystem.
    subsys: u32,
    host: String,
    file: Option<std::sync::Mutex<std::fs::File>>,
}

fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let level = match std::env::var("COLLC_DEBUG").unwrap_or_default().to_ascii_uppercase().as_str() {
            "NONE" => Level::None,
            "INFO" => Level::Info,
            "TRACE" => Level::Trace,
            _ => Level::Warn,
        };
        let subsys = parse_subsys(&std::env::var("COLLC_DEBUG_SUBSYS").unwrap_or_default());
        let host = hostname();
        let file = std::env::var("COLLC_DEBUG_FILE").ok().and_then(|pattern| {
            let path = pattern.replace("%h", &host).replace("%p", &std::process::id().to_string());
            std::fs::OpenOptions::new().create(true).append(true).open(path).ok().map(std::sync::Mutex::new)
        });
        Config { level, subsys, host, file }
    })
}

/// `INIT,NET` turns those on; `^NET` all but those; empty or `ALL` all.
fn parse_subsys(text: &str) -> u32 {
    let all = (1u32 << Subsys::ALL.len()) - 1;
    let (exclude, list) = match text.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    if list.trim().is_empty() || list.eq_ignore_ascii_case("ALL") {
        return if exclude { 0 } else { all };
    }
    let named = list
        .split(',')
        .filter_map(|name| Subsys::ALL.iter().position(|s| s.name().eq_ignore_ascii_case(name.trim())))
        .fold(0u32, |bits, i| bits | 1 << i);
    if exclude {
        all & !named
    } else {
        named
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if ok {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "?".into()
    }
}

/// This host's name, as log lines and flight-recorder dumps give it.
pub fn host() -> &'static str {
    &config().host
}

/// The rank a process's lines carry (`u32::MAX`: not known yet).
static RANK: AtomicU32 = AtomicU32::new(u32::MAX);

/// Lines of this process name `rank` from now on (a rank process; rank threads name none).
pub fn set_rank(rank: u32) {
    RANK.store(rank, Ordering::Relaxed);
}

pub fn enabled(level: Level, subsys: Subsys) -> bool {
    let c = config();
    level <= c.level && c.subsys & (1 << Subsys::ALL.iter().position(|&s| s == subsys).unwrap_or(0)) != 0
}

pub fn line(level: Level, subsys: Subsys, message: Arguments) {
    if !enabled(level, subsys) {
        return;
    }
    let c = config();
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let rank = match RANK.load(Ordering::Relaxed) {
        u32::MAX => String::new(),
        r => format!(" [{r}]"),
    };
    let level = match level {
        Level::Warn => "WARN",
        Level::Info => "INFO",
        Level::Trace => "TRACE",
        Level::None => return,
    };
    let text = format!("{}:{}:{}{rank} COLLC {level} {message}\n", c.host, std::process::id(), tid);
    match &c.file {
        Some(file) => {
            let _ = file.lock().map(|mut f| f.write_all(text.as_bytes()));
        }
        None => {
            let _ = std::io::stderr().write_all(text.as_bytes());
        }
    }
}

pub fn warn(subsys: Subsys, message: Arguments) {
    line(Level::Warn, subsys, message);
}

pub fn info(subsys: Subsys, message: Arguments) {
    line(Level::Info, subsys, message);
}

#[cfg(test)]
mod tests {
    use super::parse_subsys;

    #[test]
    fn subsystems_parse_as_nccl_debug_subsys_does() {
        assert_eq!(parse_subsys(""), 0b111);
        assert_eq!(parse_subsys("ALL"), 0b111);
        assert_eq!(parse_subsys("INIT,net"), 0b011);
        assert_eq!(parse_subsys("^NET"), 0b101);
        assert_eq!(parse_subsys("^ALL"), 0);
    }
}
