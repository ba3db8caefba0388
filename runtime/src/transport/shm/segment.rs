//! Named blocks of memory every rank of a communicator can read and write: the heap of one process for the
//! `threads` transport, files in `/dev/shm` mapped by every rank process for `shm`. Control blocks and message
//! FIFOs are laid out in them; nothing else about the transports differs.

use crate::error::RuntimeError;
use crate::transport::Transport;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A mapped, zero-initialised block. Its memory stays valid while any clone lives.
#[derive(Clone)]
pub struct Segment {
    ptr: *mut u8,
    len: usize,
    _owner: Arc<Owner>,
}

// The memory is shared on purpose; every access through it goes through atomics or the FIFO protocol.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

enum Owner {
    Heap(#[allow(dead_code)] HeapBlock),
    Mapped { ptr: *mut u8, len: usize },
}

unsafe impl Send for Owner {}
unsafe impl Sync for Owner {}

impl Drop for Owner {
    fn drop(&mut self) {
        if let Owner::Mapped { ptr, len } = *self {
            // SAFETY: `ptr`/`len` come from a successful mmap and are unmapped once, here.
            unsafe { libc::munmap(ptr.cast(), len) };
        }
    }
}

struct HeapBlock {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Drop for HeapBlock {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `Heap::open`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

impl Segment {
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

/// Where a communicator's segments live.
pub trait Segments: Send + Sync {
    /// The segment called `name`, created zeroed with `len` bytes by whichever rank asks first.
    fn open(&self, name: &str, len: usize) -> Result<Segment, RuntimeError>;
    fn transport(&self) -> Transport;
    /// Whether every rank of the job runs in this process (rank threads): a message may then carry addresses.
    fn one_address_space(&self) -> bool {
        false
    }
    /// Removes every segment of the job, once no rank needs them.
    fn remove_all(&self);
}

/// Segments of a page or more start on a page; smaller ones (a small message's FIFO) on a pair of cache lines
/// (the control block's per-rank states are aligned so, and the prefetcher fetches lines in pairs), so that p^2 of
/// them do not cost a page each.
const PAGE: usize = 4096;
const SMALL_ALIGN: usize = 128;

/// Segments on the heap of one process, shared by rank threads.
#[derive(Default)]
pub struct Heap {
    blocks: Mutex<HashMap<String, Segment>>,
}

impl Segments for Heap {
    fn open(&self, name: &str, len: usize) -> Result<Segment, RuntimeError> {
        let mut blocks = self.blocks.lock().map_err(|_| RuntimeError::Poisoned)?;
        if let Some(segment) = blocks.get(name) {
            return check_len(name, segment.clone(), len);
        }
        let layout = std::alloc::Layout::from_size_align(len.max(1), if len >= PAGE { PAGE } else { SMALL_ALIGN })
            .map_err(|_| RuntimeError::Segment { name: name.into(), reason: format!("{len} bytes is too large") })?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(RuntimeError::Segment { name: name.into(), reason: format!("out of memory ({len} bytes)") });
        }
        let segment = Segment { ptr, len, _owner: Arc::new(Owner::Heap(HeapBlock { ptr, layout })) };
        blocks.insert(name.to_string(), segment.clone());
        Ok(segment)
    }

    fn one_address_space(&self) -> bool {
        true
    }

    fn transport(&self) -> Transport {
        Transport::of(&super::THREADS)
    }

    /// Heap segments go with the last communicator that holds them.
    fn remove_all(&self) {}
}

fn check_len(name: &str, segment: Segment, len: usize) -> Result<Segment, RuntimeError> {
    if segment.len == len {
        Ok(segment)
    } else {
        Err(length_mismatch(name, segment.len, len))
    }
}

fn length_mismatch(name: &str, existing: usize, len: usize) -> RuntimeError {
    RuntimeError::Segment {
        name: name.into(),
        reason: format!("exists with {existing} bytes, this rank expects {len}: the ranks disagree on its geometry"),
    }
}

/// Where POSIX shared memory lives on Linux.
pub(crate) const SHM_DIR: &str = "/dev/shm";

/// Segments as files in `/dev/shm`, `collc-<job>-<name>`, mapped by every rank process that opens them.
pub struct Shm {
    job: String,
    dir: std::path::PathBuf,
    /// Mappings this process already holds, so a segment is mapped once per process.
    mapped: Mutex<HashMap<String, Segment>>,
}

impl Shm {
    pub fn new(job: &str) -> Self {
        Shm { job: job.to_string(), dir: SHM_DIR.into(), mapped: Mutex::new(HashMap::new()) }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.join(format!("collc-{}-{name}", self.job))
    }

    /// Removes the files of earlier `collc run` jobs whose launcher is gone and that have not been touched for a
    /// minute: a launcher killed with SIGKILL cannot clean up, and its files would stay until the host reboots.
    /// Only names a launcher gives (`collc-<pid>-<hex start time>-...`) are considered, and the marks of ranks
    /// killed while joining (`joining::JoinMarker`, by the pid inside); jobs that torchrun or mpirun started are named
    /// by them and left alone. Returns how many files were removed.
    pub fn remove_stale_jobs() -> usize {
        let Ok(entries) = std::fs::read_dir(SHM_DIR) else { return 0 };
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let marker = || crate::transport::joining::marker_pid(&entry.path(), &name);
            let Some(pid) = launcher_pid(&name).or_else(marker) else { continue };
            // SAFETY: kill with signal 0 only checks whether the process exists.
            let gone = unsafe { libc::kill(pid, 0) } == -1
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
            let idle = entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > std::time::Duration::from_secs(60)));
            if gone && idle && std::fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }

    /// Every `/dev/shm` file of job `job`: for a launcher cleaning up after its ranks.
    pub fn remove_job(job: &str) {
        let prefix = format!("collc-{job}-");
        if let Ok(entries) = std::fs::read_dir(SHM_DIR) {
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
    }
}

/// The launcher pid in a `collc-<pid>-<hex>-<segment>` name, if the name has that form.
fn launcher_pid(name: &str) -> Option<i32> {
    let mut parts = name.strip_prefix("collc-")?.splitn(3, '-');
    let pid = parts.next()?.parse::<i32>().ok().filter(|&p| p > 0)?;
    let started = parts.next()?;
    let is_hex = !started.is_empty() && started.bytes().all(|b| b.is_ascii_hexdigit());
    (is_hex && parts.next().is_some_and(|rest| !rest.is_empty())).then_some(pid)
}

impl Segments for Shm {
    fn open(&self, name: &str, len: usize) -> Result<Segment, RuntimeError> {
        let mut mapped = self.mapped.lock().map_err(|_| RuntimeError::Poisoned)?;
        if let Some(segment) = mapped.get(name) {
            return check_len(name, segment.clone(), len);
        }
        let path = self.path(name);
        let fail = |what: &str, e: std::io::Error| RuntimeError::Segment {
            name: path.display().to_string(),
            reason: format!("{what}: {e} (is /dev/shm mounted and large enough?)"),
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| fail("open", e))?;
        // Every rank sets the same length; growing a file of zeros is idempotent.
        let current = file.metadata().map_err(|e| fail("stat", e))?.len() as usize;
        if current != len {
            if current != 0 {
                return Err(length_mismatch(name, current, len));
            }
            file.set_len(len as u64).map_err(|e| fail("resize", e))?;
        }
        use std::os::fd::AsRawFd;
        // SAFETY: a shared read-write mapping of a file we hold open; the length is the file's.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(fail("mmap", std::io::Error::last_os_error()));
        }
        let ptr = ptr.cast::<u8>();
        let segment = Segment { ptr, len, _owner: Arc::new(Owner::Mapped { ptr, len: len.max(1) }) };
        mapped.insert(name.to_string(), segment.clone());
        Ok(segment)
    }

    fn transport(&self) -> Transport {
        Transport::of(&super::SHM)
    }

    fn remove_all(&self) {
        Shm::remove_job(&self.job);
    }
}
