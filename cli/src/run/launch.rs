//! Starting the ranks of `collc run`: threads of this process, processes this process spawns (`shm`), or this
//! process as one rank of a job a launcher started. Whatever starts them, rank 0 prints and a failure on any rank
//! makes the run exit non-zero.

use super::sweep;
use super::table::{Ending, Header, Report};
use super::{configure, say_error, Job};
use collc_runtime::launch::Launch;
use collc_runtime::{Communicator, HostExecutor, RuntimeError, Shm, Transport};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn header(comm: &Communicator, job: &Job) -> Header {
    let slots = std::env::var("COLLC_SLOT_BYTES").ok().map_or_else(String::new, |b| format!(", slots of {b} B"));
    let backend = comm.transport().backend();
    let mut executor = backend.executor(collc_runtime::transport::SLOTS, comm.gpu_ordinal());
    if comm.executor() == HostExecutor::Jit {
        executor = match backend.compiles_plans() {
            true => format!("jit: each rank's plan compiled with cranelift, {executor}"),
            false => format!(
                "{executor}; --executor jit: interpreted, as this transport's links are not rings in shared memory"
            ),
        };
    }
    Header {
        algorithm: comm.algorithm(job.collective),
        transport: comm.transport().name(),
        executor: format!("{executor}{slots})"),
    }
}

/// What rank 0 has printed so far, for the interrupt watcher to close.
static REPORT: Mutex<Option<Report>> = Mutex::new(None);

fn with_report(f: impl FnOnce(&mut Report)) {
    if let Some(report) = REPORT.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).as_mut() {
        f(report);
    }
}

/// Runs the sweep on one rank; rank 0 prints the header at once and each row as it is measured. Returns the exit
/// code. With `--trace`, the rank's part of the trace goes on as `threads` says (`trace::hand_over`).
fn rank_main(mut comm: Communicator, job: &Job, threads: bool) -> u8 {
    let rank = comm.rank();
    if rank == 0 {
        let report = Report::start(job, &header(&comm, job));
        *REPORT.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(report);
    }
    let on_row = &mut |row| with_report(|report| report.row(row));
    let on_stage = &mut |stage: &str, slow: bool| with_report(|report| report.stage(stage, slow));
    let outcome = sweep::sweep(&mut comm, job, on_row, on_stage);
    let traced = match &job.trace {
        Some(trace) => super::trace::hand_over(&comm, trace, threads).inspect_err(|message| say_error(message)),
        None => Ok(()),
    };
    let mut wrong = false;
    if rank == 0 {
        with_report(|report| {
            report.finish(if outcome.is_ok() { Ending::Done } else { Ending::Failed });
            wrong = report.any_wrong();
        });
    }
    match outcome {
        Ok(()) => u8::from(wrong || traced.is_err()),
        Err(error) => {
            let text = error.to_string();
            match text.starts_with("rank ") {
                true => say_error(text),
                false => say_error(format_args!("rank {rank}: {text}")),
            }
            comm.fail_with(&error);
            1
        }
    }
}

/// Ends this process at an interrupt (SIGINT, SIGTERM) or, for a rank `collc run` spawned, when its launcher is gone
/// (`launcher`: its pid): rank 0's report is closed with what it has, what the job left on this host is removed
/// (`job`: its transport and id), and the process exits 128 + the signal. A thread of its own, so a rank busy in a collective still
/// stops at once.
fn watch_interrupts(job: Option<(Transport, String)>, launcher: Option<libc::pid_t>) {
    catch_interrupts();
    let watcher = std::thread::Builder::new().name("interrupt watch".into()).spawn(move || loop {
        // SAFETY: getppid has no preconditions.
        let orphaned = launcher.is_some_and(|pid| unsafe { libc::getppid() } != pid);
        let signal = INTERRUPTED.load(Ordering::Relaxed);
        if orphaned || signal != 0 {
            let signal = if signal != 0 { signal } else { libc::SIGTERM };
            with_report(|report| report.finish(Ending::Interrupted(signal)));
            if let Some((transport, id)) = &job {
                transport.backend().remove_job(id);
            }
            std::process::exit(128 + signal);
        }
        std::thread::sleep(Duration::from_millis(20));
    });
    if watcher.is_err() {
        // Without the watcher the handlers would swallow the signals: give them back their default.
        for signal in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: restoring the default disposition.
            unsafe { libc::signal(signal, libc::SIG_DFL) };
        }
    }
}

pub fn run_threads(job: &Job) -> u8 {
    watch_interrupts(None, None);
    let comms = match Communicator::group(job.transport, job.n_ranks, job.options.clone()) {
        Ok(comms) => comms,
        Err(error) => return fail(&error),
    };
    let codes: Vec<u8> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let comm = configure(comm, job);
                std::thread::Builder::new()
                    .name(format!("rank {}", comm.rank()))
                    .spawn_scoped(scope, move || rank_main(comm, job, true))
                    .expect("a thread per rank")
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(101)).collect()
    });
    let traced = match &job.trace {
        Some(trace) => super::trace::write_threads(trace).inspect_err(|message| say_error(message)),
        None => Ok(()),
    };
    codes.into_iter().max().unwrap_or(0).max(u8::from(traced.is_err()))
}

fn fail(error: &RuntimeError) -> u8 {
    say_error(error);
    1
}

/// This process is rank `launch.rank` of a job someone else started.
pub fn run_one_rank(job: &Job, launch: &Launch) -> u8 {
    let backend = job.transport.backend();
    if let Err(message) = backend.check_launch(launch) {
        say_error(format_args!("rank {}: {message}", launch.rank));
        return 2;
    }
    collc_runtime::log::set_rank(launch.rank);
    let launcher = std::env::var(LAUNCHER_PID).ok().and_then(|p| p.parse::<libc::pid_t>().ok());
    if launch.launcher == "collc" {
        collc_runtime::launch::spread_over_cores(launch.rank, launch.world_size);
    }
    watch_interrupts(Some((job.transport, launch.job.clone())), launcher.filter(|_| launch.launcher == "collc"));
    match job.transport.join(launch, job.options.clone()) {
        Ok(comm) => rank_main(configure(comm, job), job, false),
        Err(error) => fail(&error),
    }
}

/// Spawns one process per rank (this executable, same arguments, `COLLC_RANK`/`COLLC_WORLD_SIZE`/`COLLC_JOB`
/// set; for tcp also a rendezvous on this host and a fresh job token), watches them, and turns a rank that dies
/// into an abort every other rank sees at once.
pub fn spawn_ranks(job: &Job) -> u8 {
    // SAFETY: the handler only adds to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGUSR1, on_usr1 as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    let stale = Shm::remove_stale_jobs();
    if stale > 0 {
        eprintln!("# removed {stale} /dev/shm files of earlier collc jobs whose launcher is gone");
    }
    // Unique among the jobs on this host: this launcher's pid and the time it started.
    let id = format!("{}-{:x}", std::process::id(), nanos_now());
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return fail(&RuntimeError::Config(format!("cannot find the collc executable: {e}"))),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let backend = job.transport.backend();
    let environment = match backend.spawn_env() {
        Ok(vars) => vars,
        Err(message) => return fail(&RuntimeError::Config(message)),
    };
    let mut children: Vec<Option<Child>> = Vec::new();
    let launcher = std::process::id() as libc::pid_t;
    for rank in 0..job.n_ranks {
        let mut command = Command::new(&exe);
        command
            .args(&args)
            .env("COLLC_RANK", rank.to_string())
            .env("COLLC_WORLD_SIZE", job.n_ranks.to_string())
            .env("COLLC_JOB", &id)
            .env(LAUNCHER_PID, launcher.to_string())
            .envs(environment.iter().map(|(k, v)| (k, v)));
        // SAFETY: between fork and exec the closure calls only async-signal-safe functions (prctl, getppid, _exit).
        unsafe {
            command.pre_exec(move || {
                // The rank gets SIGTERM when the launcher dies (its watcher then removes the job's segments). If the
                // launcher died before this line, no signal comes: the parent is already someone else.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                if libc::getppid() != launcher {
                    libc::_exit(143);
                }
                Ok(())
            });
        }
        let spawned = command.spawn();
        match spawned {
            Ok(child) => children.push(Some(child)),
            Err(e) => {
                say_error(format_args!("cannot start rank {rank}: {e}"));
                let _ = backend.mark_failed(&id, job.n_ranks, rank);
                children.push(None);
            }
        }
    }
    let code = watch(&mut children, &id, job);
    backend.remove_job(&id);
    let traced = match &job.trace {
        Some(trace) => super::trace::merge_processes(trace, job.n_ranks).inspect_err(|message| say_error(message)),
        None => Ok(()),
    };
    code.max(u8::from(traced.is_err()))
}

/// The launcher's pid, for a spawned rank to tell that it has gone.
const LAUNCHER_PID: &str = "COLLC_LAUNCHER_PID";

fn nanos_now() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// The signal (SIGINT or SIGTERM) that interrupted this process, 0 before one comes: the launcher stops its ranks
/// and removes the job's segments, a rank removes them, and either exits 128 + the signal. The first one counts:
/// the SIGTERM a launcher sends after a Ctrl-C does not replace the SIGINT its ranks got too.
static INTERRUPTED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_interrupt(signal: libc::c_int) {
    let _ = INTERRUPTED.compare_exchange(0, signal, Ordering::Relaxed, Ordering::Relaxed);
}

/// SIGUSR1s the launcher has received, which it passes on to its ranks (each then dumps its flight recorder).
static DUMP_REQUESTS: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_usr1(_: libc::c_int) {
    DUMP_REQUESTS.fetch_add(1, Ordering::Relaxed);
}

fn catch_interrupts() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
}

/// Stops the ranks: `signal` (the one that interrupted the launcher), so that rank 0 prints what it has measured
/// and names it, then SIGKILL for any still running a second later.
fn stop(children: &mut [Option<Child>], signal: libc::c_int) {
    for child in children.iter().flatten() {
        // SAFETY: signalling a child this process spawned and has not yet reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    }
    let asked = Instant::now();
    for child in children.iter_mut().flatten() {
        while matches!(child.try_wait(), Ok(None)) && asked.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Waits for every rank; the first that dies by a signal or fails is reported and marked failed in the job. A
/// SIGUSR1 to the launcher goes on to every rank (the job goes on).
fn watch(children: &mut [Option<Child>], job_id: &str, job: &Job) -> u8 {
    let mut worst = 0u8;
    let mut failed_since: Option<Instant> = None;
    let mut forwarded = 0;
    catch_interrupts();
    loop {
        let signal = INTERRUPTED.load(Ordering::Relaxed);
        if signal != 0 {
            say_error(format_args!("interrupted; stopping the {} rank processes", job.n_ranks));
            stop(children, signal);
            return (128 + signal) as u8;
        }
        let requests = DUMP_REQUESTS.load(Ordering::Relaxed);
        if requests != forwarded {
            forwarded = requests;
            for child in children.iter().flatten() {
                // SAFETY: signalling a child this process spawned and has not yet reaped.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGUSR1) };
            }
        }
        let mut running = 0;
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            match child.try_wait() {
                Ok(None) => running += 1,
                Ok(Some(status)) => {
                    let pid = child.id();
                    *slot = None;
                    if !status.success() {
                        let how = match status.code() {
                            Some(code) => format!("exited with status {code}"),
                            None => format!("was killed ({status})"),
                        };
                        if status.code().is_none() || worst == 0 {
                            say_error(format_args!("rank {rank} (pid {pid}) {how}"));
                        }
                        // Where the backend has nothing to mark (tcp), the rendezvous sees the rank's connection
                        // close and tells the others.
                        let _ = job.transport.backend().mark_failed(job_id, job.n_ranks, rank as u32);
                        worst = worst.max(status.code().map_or(1, |c| c.clamp(1, 255) as u8));
                        failed_since.get_or_insert_with(Instant::now);
                    }
                }
                Err(_) => *slot = None,
            }
        }
        if running == 0 {
            return worst;
        }
        // A rank stopped by a signal (the one the others named, as a rule) cannot end by itself: kill it once the
        // others have had a moment to report.
        if failed_since.is_some_and(|t| t.elapsed() > Duration::from_secs(1)) {
            for (rank, slot) in children.iter_mut().enumerate() {
                if let Some(child) = slot.as_mut().filter(|c| is_stopped(c.id())) {
                    say_error(format_args!("rank {rank} is stopped (SIGSTOP?) after the failure; killing it"));
                    let _ = child.kill();
                }
            }
        }
        // Ranks that outlive a failure by much more than a health check are stuck: stop them.
        if failed_since.is_some_and(|t| t.elapsed() > Duration::from_secs(10)) {
            for (rank, slot) in children.iter_mut().enumerate() {
                if let Some(child) = slot {
                    say_error(format_args!("rank {rank} did not stop after the failure; killing it"));
                    let _ = child.kill();
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether process `pid` is stopped by a signal (state `T` in `/proc/PID/stat`).
fn is_stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
}
