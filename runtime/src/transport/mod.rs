//! How the ranks of a job reach each other. `Transport` names the ways, one type for the runtime, the CLI and the
//! tests; a communicator is built for one (`Communicator::threads`, `Communicator::shm`).

pub mod ifname;

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Ranks are threads of one process; segments on its heap.
    Threads,
    /// Ranks are processes on one host; segments are files in /dev/shm that every rank maps.
    Shm,
}

impl Transport {
    pub const ALL: [Transport; 2] = [Transport::Threads, Transport::Shm];

    /// The name `--transport` takes and headers print.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Threads => "threads",
            Transport::Shm => "shm",
        }
    }

    /// One line for `--help`.
    pub fn about(self) -> &'static str {
        match self {
            Transport::Threads => "Ranks are threads of one process",
            Transport::Shm => "Ranks are processes on this host; buffers in /dev/shm",
        }
    }

    /// Whether the ranks are separate processes, whose death another rank can see (`kill(pid, 0)`).
    pub fn processes(self) -> bool {
        self == Transport::Shm
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Transport {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Transport::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(s)).ok_or_else(|| {
            let names = Transport::ALL.map(Transport::name);
            let message = format!("unknown transport `{s}`; expected one of: {}", names.join(", "));
            collc_compiler::diag::with_suggestion(message, s, &names)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Transport;

    #[test]
    fn names_round_trip_and_a_misspelt_one_gets_a_suggestion() {
        for transport in Transport::ALL {
            assert_eq!(transport.name().parse::<Transport>(), Ok(transport));
        }
        let error = "shn".parse::<Transport>().expect_err("not a transport");
        assert!(error.contains("did you mean: shm"), "{error}");
    }
}
