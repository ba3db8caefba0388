//! The integration test binary: every data-driven suite is a module here.
//!
//! - `library`: every `algorithms/**/*.coll` verifies for 2..=16 ranks; `.sched` snapshots at 2, 3 and 4 ranks.
//! - `fixtures`: `tests/fixtures/ok` must verify, `tests/fixtures/err` must fail with the code in its header.
//! - `roundtrip`: `.sched` text prints, parses back and verifies again; malformed texts are errors.
//! - `mutation`: single mutations of library and fixture schedules, judged by `oracle` (with `contract`), must be
//!   rejected by the verifier whenever they are broken.
//! - `property`: random bytes, token soups and `random_program`s never panic and finish quickly.
//! - `runtime`: every library algorithm runs on both transports for gloo's matrix of ranks, counts, dtypes and
//!   ops, matching the reference interpreter and the collective's definition, guard bytes intact.
//! - `msccl`: MSCCL XML: the real corpus imports and verifies, broken and mutated files are refused, the library
//!   exports for both targets and reads back.
//! - `mscclpp`: every library algorithm exported as an MSCCL++ plan and run by an interpreter of its executor.
//! - `cost`: the cost model against the closed forms, topology and `--algo` errors, selection.
//! - `passes`: pipelining staggers slices over steps; receive-reduce fusion, and when it must not fuse.
//! - `corpus`: the `.coll` files on disk and the pipeline up to the unverified schedule, for all of the above.

mod contract;
mod corpus;
mod cost;
mod differential;
mod fixtures;
mod forge;
mod library;
mod msccl;
mod mscclpp;
mod mutation;
mod oracle;
mod passes;
mod property;
mod random_program;
mod roundtrip;
mod runtime;
