//! The prefault helper: a thread that faults memory in on the idle core while a `Prefault` is held.

use std::sync::{Condvar, Mutex};

/// What the helper is asked to do.
struct Wanted {
    /// Whether a `Prefault` is held.
    on: bool,
    /// The part of the last grown block still to fault in.
    grown: (usize, usize),
    /// How much reserve to make, how much is made, and the part of the newest piece still to fault in.
    budget: usize,
    reserved: usize,
    piece: (usize, usize),
}

const IDLE: Wanted = Wanted { on: false, grown: (0, 0), budget: 0, reserved: 0, piece: (0, 0) };
static WANTED: Mutex<Wanted> = Mutex::new(IDLE);
static WAKE: Condvar = Condvar::new();
static STARTED: std::sync::Once = std::sync::Once::new();
const STEP: usize = 2 << 20;
/// The reserve is mapped in pieces of this size (each kept as one range once mapped).
const PIECE: usize = 256 << 20;

/// A big block grew to `block` bytes: its new part is `start..end` (only the last growth is worth faulting
/// in, as a block that grows again has moved).
pub(super) fn grown(start: usize, end: usize, block: usize) {
    let mut wanted = WANTED.lock().unwrap_or_else(|e| e.into_inner());
    if wanted.on {
        wanted.grown = (start, end);
        wanted.budget = wanted.budget.max(2 * block);
        WAKE.notify_one();
    }
}

enum Job {
    Fault(usize, usize),
    Reserve(usize),
}

/// The next step of the wanted ranges, the grown block's first.
fn next_job(wanted: &mut Wanted) -> Option<Job> {
    if !wanted.on {
        return None;
    }
    for range in [&mut wanted.grown, &mut wanted.piece] {
        if range.0 < range.1 {
            let end = (range.0 + STEP).min(range.1);
            let start = std::mem::replace(&mut range.0, end);
            return Some(Job::Fault(start, end));
        }
    }
    let bytes = PIECE.min(wanted.budget - wanted.reserved);
    wanted.reserved += bytes;
    (bytes > 0).then_some(Job::Reserve(bytes))
}

/// The helper: takes the next job and does it outside the lock.
fn helper() {
    loop {
        let job = {
            let mut wanted = WANTED.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                match next_job(&mut wanted) {
                    Some(job) => break job,
                    None => wanted = WAKE.wait(wanted).unwrap_or_else(|e| e.into_inner()),
                }
            }
        };
        match job {
            // SAFETY: the advice writes nothing: it faults in pages of anonymous private memory as a write
            // would, leaving what they hold. If the range was handed out meanwhile, its owner sees the same
            // bytes; if it was freed or moved, it is unmapped (the call fails, harmlessly) or belongs to another
            // anonymous block, whose pages it faults in the same way.
            Job::Fault(start, end) => unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_POPULATE_WRITE);
            },
            Job::Reserve(bytes) => {
                let start = super::map(bytes) as usize;
                if start != 0 {
                    // Kept before it is faulted in: a block may take it at once, the rest is faulted after.
                    super::kept::keep(start, bytes, true);
                    let mut wanted = WANTED.lock().unwrap_or_else(|e| e.into_inner());
                    if wanted.on {
                        wanted.piece = (start, start + bytes);
                    }
                }
            }
        }
    }
}

/// While a `Prefault` is held, a helper thread faults in memory on the idle core, so that the kernel clears those
/// pages there: first the part a big block grows by, front to back in steps of 2 MiB, while the block's owner fills
/// it; then, with nothing of that left, a reserve of fresh memory kept for the next blocks and slabs (`kept`), up to
/// twice the size of the largest block that grew. Worth it only where one thread fills a growing array and the
/// other core is idle: lowering, which fills the program's transfer list, took 1.16-1.20 s at p = 4096 with it and
/// 1.26-4.2 s without (bench/README.md), the slow launches being those where the kernel's first touch of its pages
/// was slow; the reserve holds the schedules' first slabs (at p = 4096 they take about twice what the lowered
/// program takes).
pub struct Prefault(());

/// Runs `work` holding a `Prefault`.
pub fn while_prefaulting<T>(work: impl FnOnce() -> T) -> T {
    let _prefault = Prefault::start();
    work()
}

impl Prefault {
    /// Starts faulting in, until the value is dropped. The helper thread is started the first time and then waits
    /// between uses.
    pub fn start() -> Prefault {
        STARTED.call_once(|| {
            let _ = std::thread::Builder::new().name("prefault".into()).spawn(helper);
        });
        WANTED.lock().unwrap_or_else(|e| e.into_inner()).on = true;
        Prefault(())
    }
}

impl Drop for Prefault {
    fn drop(&mut self) {
        *WANTED.lock().unwrap_or_else(|e| e.into_inner()) = IDLE;
    }
}
