//! `collc._collc`: the runtime's `Communicator` for Python. A `Comm` is one rank of a group (a torch process group, or
//! a pair of ranks for point-to-point); its calls run in issue order on a thread of its own, as NCCL's stream and
//! gloo's worker run theirs, without the GIL, and each ends in a Python callback (the backend completes the call's
//! future there). What knows torch (tensors, options, futures, the store) is the Python package, `collc/`.

mod call;
mod worker;

use call::Region;
use collc_compiler::{Bindings, Collective, Limits, Options as CompileOptions};
use collc_runtime::{CallShape, DataType, Options, ReduceOp};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::time::Duration;
use worker::{Job, Worker};

/// tcp's rendezvous and token: given, or asked of a Python callable on the worker before it joins (a
/// point-to-point pair's, which the caller must not wait for).
pub(crate) enum Rendezvous {
    Given(String, String),
    Ask(Py<PyAny>),
}

/// One rank's communicator, joined (or joining) on its worker thread.
#[pyclass(frozen, module = "collc._collc")]
struct Comm {
    worker: Worker,
    #[pyo3(get)]
    rank: u32,
    #[pyo3(get)]
    size: u32,
    #[pyo3(get)]
    transport: String,
}

/// Where a group's ranks meet.
pub(crate) struct Join {
    pub transport: String,
    pub job: String,
    pub rank: u32,
    pub size: u32,
    pub local_size: u32,
    /// tcp: rank 0's rendezvous `host:port` and the job's token, shared through torch's store.
    pub rendezvous: Option<Rendezvous>,
    pub options: Options,
}

#[pymethods]
impl Comm {
    /// Rank `rank` of `size` in job `job` over `transport` (`shm`, `tcp`, `cuda`). With `wait`, returns once every
    /// rank has joined (raising what went wrong); without, the worker joins before its first call, so a caller never
    /// blocks on a peer that joins later (point-to-point pairs).
    #[staticmethod]
    /// `rendezvous` is rank 0's `host:port` (with `token`), or a callable returning both.
    #[pyo3(signature = (transport, job, rank, size, local_size, timeout_s, rendezvous=None, token=None, wait=true))]
    #[allow(clippy::too_many_arguments)]
    fn join(
        py: Python<'_>,
        transport: String,
        job: String,
        rank: u32,
        size: u32,
        local_size: u32,
        timeout_s: f64,
        rendezvous: Option<Bound<'_, PyAny>>,
        token: Option<String>,
        wait: bool,
    ) -> PyResult<Comm> {
        let mut options = Options::from_env().map_err(|e| PyValueError::new_err(e.to_string()))?;
        // Every rank's result bitwise the same, as NCCL's: DDP's ranks keep equal parameters only so.
        options.determinism = Some(collc_compiler::replicas::Determinism::Replicas);
        if std::env::var_os("COLLC_TIMEOUT").is_none() {
            if !(timeout_s.is_finite() && timeout_s > 0.0) {
                return Err(PyValueError::new_err(format!("timeout of {timeout_s} s: give a positive number")));
            }
            options.timeout = Duration::from_secs_f64(timeout_s);
        }
        let rendezvous = match (rendezvous, token) {
            (Some(ask), None) if ask.is_callable() => Some(Rendezvous::Ask(ask.unbind())),
            (Some(at), Some(token)) => Some(Rendezvous::Given(at.extract()?, token)),
            (None, None) => None,
            _ => return Err(PyValueError::new_err("the tcp rendezvous needs both its address and its token")),
        };
        let join = Join { transport: transport.clone(), job, rank, size, local_size, rendezvous, options };
        let worker = Worker::start(join);
        if wait {
            py.detach(|| worker.joined()).map_err(PyRuntimeError::new_err)?;
        }
        Ok(Comm { worker, rank, size, transport })
    }

    /// Queues one collective call: `send` and `recv` are `(address, bytes)` of memory `keep` holds alive until
    /// `done(None)` or `done("what went wrong")` is called on the worker (with the GIL).
    #[pyo3(signature = (collective, send, recv, count, dtype, op, root, peer, keep, done))]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        collective: &str,
        send: (usize, usize),
        recv: (usize, usize),
        count: usize,
        dtype: &str,
        op: &str,
        root: u32,
        peer: u32,
        keep: Py<PyAny>,
        done: Py<PyAny>,
    ) -> PyResult<()> {
        let collective: Collective = collective.parse().map_err(PyValueError::new_err)?;
        let dtype: DataType =
            dtype.parse().map_err(|e: collc_kernels::UnknownDataType| PyValueError::new_err(e.to_string()))?;
        let op: ReduceOp =
            op.parse().map_err(|e: collc_kernels::UnknownReduceOp| PyValueError::new_err(e.to_string()))?;
        if let ReduceOp::PreMulSum(factor) = op {
            factor.element(dtype).map_err(|e| PyValueError::new_err(format!("premul_sum on {dtype}: {e}")))?;
        }
        let shape = CallShape { collective, count, dtype, op, root, peer };
        let (send, recv) = (Region::new(send), Region::new(recv));
        self.worker.send(Job::Call { shape, send, recv, keep, done }).map_err(PyRuntimeError::new_err)
    }

    /// Queues a barrier: `done` as in `submit`.
    fn barrier(&self, done: Py<PyAny>) -> PyResult<()> {
        self.worker.send(Job::Barrier { done }).map_err(PyRuntimeError::new_err)
    }

    /// Runs `collective` with the `.coll` algorithm `source` (shown as `name`) from the next call queued on: compiled
    /// and verified here first, for this group's ranks, both placements and every root, so a wrong file raises now
    /// (a `ValueError` with the compiler's diagnostics) and not at a call.
    fn set_algorithm(&self, py: Python<'_>, collective: &str, name: String, source: String) -> PyResult<()> {
        let collective: Collective = collective.parse().map_err(PyValueError::new_err)?;
        let size = self.size;
        py.detach(|| verify(collective, &name, &source, size)).map_err(PyValueError::new_err)?;
        self.worker.send(Job::Algorithm { collective, name, source }).map_err(PyRuntimeError::new_err)
    }

    /// Stops this rank's calls: the one running and every peer's fail within a health check, naming this rank.
    fn abort(&self) {
        self.worker.abort();
    }

    /// Finishes the calls queued, then leaves the group.
    fn shutdown(&self, py: Python<'_>) {
        py.detach(|| self.worker.stop());
    }
}

/// Compiles `source` as `collective` for `size` ranks, in place and out of place, at root 0 and the last rank (peer
/// 1 for sendrecv): the diagnostics of the first that fails, rendered against the file.
fn verify(collective: Collective, name: &str, source: &str, size: u32) -> Result<(), String> {
    let roots: Vec<u32> = if collective.rooted() { vec![0, size - 1] } else { vec![0] };
    for placement in [collc_compiler::sched::Placement::OutOfPlace, collc_compiler::sched::Placement::InPlace] {
        for &root in &roots {
            let peer = (collective == Collective::SendRecv).then_some((root + 1) % size);
            let bindings = Bindings { n_ranks: size, root: collective.rooted().then_some(root), peer, params: vec![] };
            let schedule =
                collc_compiler::compile(source, &bindings, CompileOptions::placed(placement), &Limits::default())
                    .map_err(|errors| {
                        let rendered: Vec<String> =
                            errors.0.iter().map(|e| collc_compiler::diag::render(e, name, source, true)).collect();
                        format!("{name} for {size} ranks ({placement}, root {root}):\n{}", rendered.join("\n"))
                    })?;
            if schedule.collective != collective {
                return Err(format!("{name} implements {}, not {collective}", schedule.collective));
            }
        }
    }
    Ok(())
}

/// A free port for rank 0's tcp rendezvous (kept bound until the communicator serves it) and a fresh job token.
#[pyfunction]
fn tcp_rendezvous() -> PyResult<(u16, String)> {
    let port = collc_runtime::transport::tcp::free_port().map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    let token = collc_runtime::transport::tcp::Token::generate().map_err(PyRuntimeError::new_err)?;
    Ok((port, token))
}

#[pymodule]
fn _collc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Comm>()?;
    m.add_function(wrap_pyfunction!(tcp_rendezvous, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
