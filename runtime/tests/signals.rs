//! A program that handles SIGUSR1 itself keeps its handler when it makes communicators: the flight recorder only
//! replaces the default disposition (which would kill). (Its own test binary: the recorder's choice is made once per
//! process.)

use collc_runtime::{Communicator, Options, ReduceOp};
use std::sync::atomic::{AtomicU32, Ordering};

static MINE: AtomicU32 = AtomicU32::new(0);

extern "C" fn mine(_: libc::c_int) {
    MINE.fetch_add(1, Ordering::Relaxed);
}

#[test]
fn a_programs_own_sigusr1_handler_is_kept() {
    // SAFETY: the handler only adds to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGUSR1, mine as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    let comms = Communicator::threads(2, Options::default()).expect("threads");
    std::thread::scope(|scope| {
        for mut comm in comms {
            scope.spawn(move || {
                let mut out = [0f32; 4];
                comm.all_reduce(&[1f32; 4], &mut out, ReduceOp::Sum).expect("the call");
                assert_eq!(out, [2f32; 4]);
            });
        }
    });
    // SAFETY: raising a signal this process handles.
    unsafe { libc::raise(libc::SIGUSR1) };
    assert_eq!(MINE.load(Ordering::Relaxed), 1, "the program's handler ran");
}
