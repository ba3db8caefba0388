//! A communicator's worker thread: joins the group, then runs the calls queued in issue order, each ended by its
//! Python callback, until the queue closes (the communicator then leaves the group).

use crate::call::{self, Region};
use crate::{Join, Rendezvous};
use collc_compiler::Collective;
use collc_runtime::launch::Launch;
use collc_runtime::{AbortHandle, CallShape, Communicator, RuntimeError, Transport};
use pyo3::prelude::*;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

pub(crate) enum Job {
    Call { shape: CallShape, send: Region, recv: Region, keep: Py<PyAny>, done: Py<PyAny> },
    Barrier { done: Py<PyAny> },
    Algorithm { collective: Collective, name: String, source: String },
}

enum State {
    Joining,
    Joined(AbortHandle),
    Failed(String),
}

#[derive(Default)]
struct Shared {
    state: Mutex<Option<State>>,
    changed: Condvar,
}

pub(crate) struct Worker {
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    shared: Arc<Shared>,
}

impl Worker {
    /// Starts the thread, which joins the group first.
    pub(crate) fn start(join: Join) -> Worker {
        let (queue, jobs) = mpsc::channel();
        let shared = Arc::new(Shared { state: Mutex::new(Some(State::Joining)), changed: Condvar::new() });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("collc-{}-r{}", join.transport, join.rank))
                .spawn(move || serve(join, jobs, &shared))
                .expect("a thread for the communicator")
        };
        Worker { queue: Mutex::new(Some(queue)), thread: Mutex::new(Some(thread)), shared }
    }

    /// Waits until the group is joined: what went wrong, if it did not.
    pub(crate) fn joined(&self) -> Result<(), String> {
        let mut state = self.shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match state.as_ref() {
                Some(State::Joining) => state = self.shared.changed.wait(state).unwrap_or_else(PoisonError::into_inner),
                Some(State::Joined(_)) => return Ok(()),
                Some(State::Failed(error)) => return Err(error.clone()),
                None => return Err("the communicator has shut down".into()),
            }
        }
    }

    pub(crate) fn send(&self, job: Job) -> Result<(), String> {
        let queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let queue = queue.as_ref().ok_or("the communicator has shut down: make a new process group")?;
        queue.send(job).map_err(|_| "the communicator's worker has stopped".to_string())
    }

    pub(crate) fn abort(&self) {
        if let Some(State::Joined(handle)) = self.shared.state.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
            handle.abort();
        }
    }

    /// Closes the queue and waits for the calls in it.
    pub(crate) fn stop(&self) {
        drop(self.queue.lock().unwrap_or_else(PoisonError::into_inner).take());
        if let Some(thread) = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Worker {
    /// Closes the queue; the thread finishes what is queued and leaves the group on its own.
    fn drop(&mut self) {
        drop(self.queue.get_mut().unwrap_or_else(PoisonError::into_inner).take());
    }
}

/// Joins as a launched rank does (`Transport::join`): the transport by its name, the rendezvous and token given, or
/// asked of Python here, on the worker.
fn connect(join: Join) -> Result<Communicator, RuntimeError> {
    let Join { transport, job, rank, size, local_size, rendezvous, options } = join;
    let transport: Transport = transport.parse().map_err(RuntimeError::Config)?;
    let rendezvous = match rendezvous {
        Some(Rendezvous::Given(at, token)) => Some((at, token)),
        Some(Rendezvous::Ask(ask)) => Some(
            Python::attach(|py| ask.call0(py)?.extract::<(String, String)>(py))
                .map_err(|e| RuntimeError::Config(format!("the tcp rendezvous: {e}")))?,
        ),
        None => None,
    };
    let launch = Launch {
        rank,
        world_size: size,
        local_world_size: Some(local_size),
        job,
        launcher: "torch.distributed",
        rendezvous,
    };
    transport.join(&launch, options)
}

fn serve(join: Join, jobs: mpsc::Receiver<Job>, shared: &Shared) {
    let mut comm = match connect(join) {
        Ok(comm) => Ok(comm),
        Err(error) => Err(error.to_string()),
    };
    let state = match &comm {
        Ok(comm) => State::Joined(comm.abort_handle()),
        Err(error) => State::Failed(error.clone()),
    };
    *shared.state.lock().unwrap_or_else(PoisonError::into_inner) = Some(state);
    shared.changed.notify_all();
    let mut seq = 0u64;
    for job in jobs {
        match job {
            Job::Call { shape, send, recv, keep, done } => {
                let result = match &mut comm {
                    Ok(comm) => {
                        seq += 1;
                        // SAFETY: `keep` holds the tensors the regions lie in until `finish` drops it; the backend
                        // hands them to no one else until the call's future completes.
                        unsafe { call::run(comm, seq, shape, send, recv) }.map_err(|e| e.to_string())
                    }
                    Err(error) => Err(error.clone()),
                };
                finish(done, Some(keep), result);
            }
            Job::Barrier { done } => {
                let result = match &mut comm {
                    Ok(comm) => comm.barrier().map_err(|e| e.to_string()),
                    Err(error) => Err(error.clone()),
                };
                finish(done, None, result);
            }
            Job::Algorithm { collective, name, source } => {
                if let Ok(comm) = &mut comm {
                    comm.set_algorithm(collective, &name, &source, Vec::new());
                }
            }
        }
    }
    // The communicator leaves the group here (its drop), then the state says so.
    drop(comm);
    *shared.state.lock().unwrap_or_else(PoisonError::into_inner) = None;
    shared.changed.notify_all();
}

/// Calls `done(None)` or `done(error)` with the GIL, then lets the tensors go.
fn finish(done: Py<PyAny>, keep: Option<Py<PyAny>>, result: Result<(), String>) {
    Python::attach(|py| {
        let error = result.err();
        if let Err(e) = done.call1(py, (error,)) {
            e.write_unraisable(py, None);
        }
        drop(keep);
    });
}
