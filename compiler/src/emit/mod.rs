//! Output forms of a verified schedule: the `.sched` text (with a reader that parses it back) and JSON.

mod json;
mod text;

pub use json::to_json;
pub use text::{parse_sched, parse_sched_located, write_sched, InstrLine, SchedLines};
