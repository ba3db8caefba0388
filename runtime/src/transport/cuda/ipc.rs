//! The `cuda` transport for rank processes on one host: each rank's incoming records in one allocation of its
//! device memory, exported through CUDA IPC and mapped by its peers when a call shape is prepared.

use super::fabric::lanes_for;
use super::remote::Remote;
use crate::error::RuntimeError;
use crate::exec::cuda::{driver, gpu, ok, CudaExec, CudaTarget, DeviceAlloc, Gpu};
use crate::exec::encode::{self, conn};
use crate::exec::{Executor, Launcher, Plan};
use crate::transport::{Fabric, Transport};
use cudarc::driver::sys::{self, CUdeviceptr};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The `cuda` transport for ranks that are processes on one host (a launcher's, or `collc run`'s with `COLLC_RANK`):
/// each process one rank, on GPU `rank mod G`, launching its own blocks. A connection's records are the receiver's
/// device memory, one allocation per prepared call shape, which the sender maps through CUDA IPC: the handle and
/// where each record sits in it are exchanged over the bootstrap when the shape is first prepared (collectively, as
/// every rank prepares the same shapes in the same order). Processes on one GPU run concurrently only under MPS;
/// without it the GPU time-slices their kernels, which is slow but still completes.
pub(crate) struct IpcFabric {
    gpu: Arc<Gpu>,
    gpus: u32,
    n_ranks: u32,
    /// Ranks on a host (the most on any).
    local: u32,
    /// The job's shared memory, where the bootstrap's control block is (ranks all on this host).
    bootstrap_memory: Option<Arc<crate::transport::shm::Memory>>,
    /// The way to ranks on other hosts (`remote.rs`), where there are any.
    remote: Option<Arc<Remote>>,
}

impl IpcFabric {
    pub fn new(
        rank: u32,
        n_ranks: u32,
        gpus: Option<u32>,
        bootstrap_memory: Arc<crate::transport::shm::Memory>,
    ) -> Result<IpcFabric, String> {
        let (gpu, gpus) = open_gpu(rank, gpus)?;
        Ok(IpcFabric { gpu, gpus, n_ranks, local: n_ranks, bootstrap_memory: Some(bootstrap_memory), remote: None })
    }

    /// A rank of a job on several hosts, the `index`-th of its host (on GPU `index mod G`), `local` ranks on the
    /// host that has the most.
    pub fn across_hosts(
        index: u32,
        n_ranks: u32,
        local: u32,
        gpus: Option<u32>,
        remote: Arc<Remote>,
    ) -> Result<IpcFabric, String> {
        let (gpu, gpus) = open_gpu(index, gpus)?;
        Ok(IpcFabric { gpu, gpus, n_ranks, local, bootstrap_memory: None, remote: Some(remote) })
    }

    /// From the most ranks any GPU of this host holds and this GPU's SMs; the ranks check that they agree.
    fn lanes(&self, plan: &Plan) -> Result<u32, String> {
        lanes_for(self.gpu.sms, self.local.div_ceil(self.gpus), plan)
    }

    /// Whether `peer` is on another host (reached through the network proxy, not IPC).
    fn is_remote(&self, peer: u32) -> bool {
        self.remote.as_ref().is_some_and(|remote| remote.is_remote(peer))
    }
}

/// GPU `index mod G` of the first `gpus` (every one when `None`), and G.
pub(super) fn open_gpu(index: u32, gpus: Option<u32>) -> Result<(Arc<Gpu>, u32), String> {
    let driver = driver()?;
    let gpus = gpus.unwrap_or(driver.devices as u32).min(driver.devices as u32).max(1);
    Ok((gpu((index % gpus) as i32)?, gpus))
}

/// What each rank publishes of one incoming record: (sender, channel, lane, slot bytes, offset in its allocation).
type Published = (u32, u8, u32, u32, u64);
const PUBLISHED_BYTES: usize = 4 + 1 + 4 + 4 + 8;

impl Fabric for IpcFabric {
    fn transport(&self) -> Transport {
        Transport::of(&super::CUDA)
    }

    fn remove_all(&self) {
        if let Some(memory) = &self.bootstrap_memory {
            memory.remove_all();
        }
    }

    fn gpu_ordinal(&self, _rank: u32) -> Option<i32> {
        Some(self.gpu.ordinal)
    }

    fn prepare(&self, _plan: Plan) -> Result<Box<dyn Executor>, RuntimeError> {
        Err(RuntimeError::Config("the cuda transport's processes prepare together (prepare_collective)".into()))
    }

    fn prepare_collective(
        &self,
        plan: Plan,
        gather: &mut crate::transport::Gather,
    ) -> Result<Box<dyn Executor>, RuntimeError> {
        let rank = plan.rank;
        let config = |e: String| RuntimeError::Config(format!("rank {rank}: {e}"));
        let gpu = self.gpu.clone();
        let lanes = self.lanes(&plan).map_err(config)?;
        // Rank processes map each other's memory at other addresses (CUDA IPC): every message carries its bytes.
        let image = encode::encode(&[&plan], lanes, &|_| false).map_err(config)?;
        // This rank's incoming records, one allocation, each record 256-byte aligned, after a word per rank that is
        // 1 while that rank may have the allocation mapped (see `Exported`).
        let mut offsets = vec![u64::MAX; image.conns.len()];
        let mut size = importer_words_bytes(self.n_ranks);
        let mut published: Vec<Published> = Vec::new();
        for (c, &(from, to, channel, slot_bytes, lane)) in image.conns.iter().enumerate() {
            if to == rank && !self.is_remote(from) {
                offsets[c] = size as u64;
                published.push((from, channel, lane, slot_bytes as u32, size as u64));
                size += encode::record_bytes(slot_bytes).next_multiple_of(256);
            }
        }
        sweep_exported();
        let incoming = DeviceAlloc::zeroed(&gpu, size).map_err(config)?;
        let mut importers = vec![0u64; self.n_ranks as usize];
        for (c, &(from, to, _, slot_bytes, _)) in image.conns.iter().enumerate() {
            if to == rank && !self.is_remote(from) {
                importers[from as usize] = 1;
                incoming
                    .write(offsets[c] as usize + conn::SLOT_BYTES * 8, &(slot_bytes as u64).to_le_bytes())
                    .map_err(config)?;
            }
        }
        let words: Vec<u8> = importers.iter().flat_map(|w| w.to_le_bytes()).collect();
        incoming.write(0, &words).map_err(config)?;
        // From here the handle may be out: whatever happens, the allocation is freed only once its importers let go.
        let incoming = Exported { memory: Some(incoming), n_ranks: self.n_ranks };
        let mut handle = sys::CUipcMemHandle_st { reserved: [0; 64] };
        // SAFETY: a valid out-pointer and an allocation of this context.
        ok(unsafe { sys::cuIpcGetMemHandle(&mut handle, incoming.ptr()) }, "cuIpcGetMemHandle").map_err(config)?;
        // Every rank's handle, its call's fingerprint, its lanes and where its schedule came from (for a mismatch
        // report), then the records it publishes.
        let mut head: Vec<u8> = handle.reserved.iter().map(|&b| b as u8).collect();
        head.extend_from_slice(&plan.fingerprint.to_le_bytes());
        head.extend_from_slice(&lanes.to_le_bytes());
        head.extend_from_slice(crate::transport::clip_source(&plan.source).as_bytes());
        let entries: Vec<[u8; PUBLISHED_BYTES]> = published
            .iter()
            .map(|&(from, channel, lane, slot, offset)| {
                let mut e = [0u8; PUBLISHED_BYTES];
                e[0..4].copy_from_slice(&from.to_le_bytes());
                e[4] = channel;
                e[5..9].copy_from_slice(&lane.to_le_bytes());
                e[9..13].copy_from_slice(&slot.to_le_bytes());
                e[13..21].copy_from_slice(&offset.to_le_bytes());
                e
            })
            .collect();
        let all = crate::transport::gather_entries(gather, &head, &entries)?;
        let mut handles = Vec::with_capacity(all.len());
        let mut theirs: Vec<Vec<Published>> = Vec::with_capacity(all.len());
        for (peer, (blob, records)) in all.iter().enumerate() {
            if blob.len() < 64 + 8 + 4 {
                return Err(config(format!("rank {peer} sent a malformed IPC announcement")));
            }
            let fingerprint = u64::from_le_bytes(blob[64..72].try_into().expect("8 bytes"));
            if fingerprint != plan.fingerprint {
                let source = String::from_utf8_lossy(&blob[76..]);
                return Err(RuntimeError::Mismatch {
                    rank,
                    peer: peer as u32,
                    ours: format!("a call with {}, fingerprint {:016x}", plan.source, plan.fingerprint),
                    theirs: format!("a call with {source}, fingerprint {fingerprint:016x}"),
                });
            }
            let their_lanes = u32::from_le_bytes(blob[72..76].try_into().expect("4 bytes"));
            if their_lanes != lanes {
                return Err(config(format!(
                    "rank {peer} runs {their_lanes} lanes and this rank {lanes} (GPUs of different sizes?): set \
                     COLLC_CUDA_LANES to the same number on every rank"
                )));
            }
            let mut h = sys::CUipcMemHandle_st { reserved: [0; 64] };
            for (d, &b) in h.reserved.iter_mut().zip(&blob[..64]) {
                *d = b as std::ffi::c_char;
            }
            handles.push(h);
            let word = |e: &[u8; PUBLISHED_BYTES], at: usize| u32::from_le_bytes(e[at..at + 4].try_into().expect("4"));
            theirs.push(
                records
                    .iter()
                    .map(|e| {
                        (word(e, 0), e[4], word(e, 5), word(e, 9), u64::from_le_bytes(e[13..21].try_into().expect("8")))
                    })
                    .collect(),
            );
        }
        // The records to and from other hosts, which the proxy carries before any rank's first call on them.
        let carried = match &self.remote {
            Some(remote) => remote.prepare(&gpu, &plan, &image.conns, image.plan(0).lanes, gather),
            None => Ok(HashMap::new()),
        };
        // Map the records of every rank this one sends to, and lay out the connection table.
        let mut mapped: HashMap<u32, IpcMapping> = HashMap::new();
        let mut map_all = |carried: HashMap<(crate::transport::LinkEnd, u16), u64>| -> Result<Vec<u64>, RuntimeError> {
            let mut table = Vec::with_capacity(image.conns.len());
            for (c, &(from, to, channel, slot_bytes, lane)) in image.conns.iter().enumerate() {
                let peer = if to == rank { from } else { to };
                let address = if self.is_remote(peer) {
                    let end = crate::transport::LinkEnd { from, to, channel, slot_bytes };
                    carried[&(end, lane as u16)]
                } else if to == rank {
                    incoming.ptr() + offsets[c]
                } else {
                    let entry = theirs[to as usize]
                        .iter()
                        .find(|&&(f, ch, l, _, _)| (f, ch, l) == (from, channel, lane))
                        .ok_or_else(|| {
                            config(format!(
                                "rank {to} publishes no record for the connection from {from} channel {channel}"
                            ))
                        })?;
                    if entry.3 as usize != slot_bytes {
                        return Err(config(format!(
                            "rank {to} sizes the slots from {from} channel {channel} differently"
                        )));
                    }
                    let mapping = match mapped.entry(to) {
                        std::collections::hash_map::Entry::Occupied(m) => m.into_mut(),
                        std::collections::hash_map::Entry::Vacant(v) => {
                            let opened = IpcMapping::open(&gpu, handles[to as usize], rank)
                                .map_err(|e| config(format!("mapping rank {to}'s connection records: {e}")))?;
                            v.insert(opened)
                        }
                    };
                    mapping.ptr + entry.4
                };
                table.push(address);
            }
            Ok(table)
        };
        let table = carried.and_then(&mut map_all);
        // Every rank says whether it mapped its peers' records, so none launches a shape another could not set up;
        // a peer gone meanwhile is named by this round itself.
        let verdicts = gather(&[table.is_ok() as u8])?;
        let table = table?;
        if let Some(peer) = verdicts.iter().position(|v| v.first() != Some(&1)) {
            return Err(config(format!("rank {peer} could not map its peers' connection records (see its error)")));
        }
        let stop = DeviceAlloc::zeroed(&gpu, 8).map_err(config)?;
        // System-scope fences: a peer process may be on another GPU even where this one sees only its own.
        let launcher = Arc::new(Launcher::new(CudaTarget { gpu: gpu.clone(), system_scope: true, stop }, vec![rank]));
        // The mappings drop first: this rank's word in each peer's head is cleared before its own allocation is
        // looked at.
        let keep: Vec<IpcMapping> = mapped.into_values().collect();
        let keep = Box::new((keep, incoming));
        CudaExec::upload(plan, &gpu, &image, &table, keep, launcher).map_err(config)
    }
}

/// The bytes before the records of an exported allocation: a word per rank, 1 while that rank may map it.
fn importer_words_bytes(n_ranks: u32) -> usize {
    (n_ranks as usize * 8).next_multiple_of(256)
}

/// A rank's incoming records once their IPC handle may have gone out. CUDA leaves it undefined what freeing such
/// memory does before every importer has closed its mapping, so it is freed only when every rank's word in its
/// head is 0 again (each importer clears its own word before it closes); until then it waits in a list swept at
/// each later setup and drop, and what is left at exit goes with the process.
pub(crate) struct Exported {
    memory: Option<DeviceAlloc>,
    n_ranks: u32,
}

impl Exported {
    fn ptr(&self) -> CUdeviceptr {
        self.memory.as_ref().map_or(0, |m| m.ptr)
    }

    /// Whether no rank has the allocation mapped any longer (an unreadable head counts as mapped).
    fn released(&self) -> bool {
        let Some(memory) = &self.memory else { return true };
        let mut words = vec![0u8; self.n_ranks as usize * 8];
        memory.read(0, &mut words).is_ok() && words.iter().all(|&b| b == 0)
    }
}

impl Drop for Exported {
    fn drop(&mut self) {
        if !self.released() {
            if let Ok(mut waiting) = EXPORTED.lock() {
                waiting.push(Exported { memory: self.memory.take(), n_ranks: self.n_ranks });
            } else {
                std::mem::forget(self.memory.take());
            }
        }
        sweep_exported();
    }
}

/// Exported allocations some importer may still have mapped.
static EXPORTED: Mutex<Vec<Exported>> = Mutex::new(Vec::new());

/// Frees the waiting exported allocations no rank maps any longer.
fn sweep_exported() {
    let released: Vec<Exported> = match EXPORTED.lock() {
        Ok(mut waiting) => {
            let (released, kept) = std::mem::take(&mut *waiting).into_iter().partition(Exported::released);
            *waiting = kept;
            released
        }
        Err(_) => return,
    };
    drop(released);
}

/// A peer's allocation mapped into this process through CUDA IPC, unmapped on drop after clearing this rank's word
/// in its head.
pub(crate) struct IpcMapping {
    ptr: CUdeviceptr,
    rank: u32,
    gpu: Arc<Gpu>,
}

// SAFETY: a device address; every use binds the GPU's context first.
unsafe impl Send for IpcMapping {}
unsafe impl Sync for IpcMapping {}

impl IpcMapping {
    fn open(gpu: &Arc<Gpu>, handle: sys::CUipcMemHandle_st, rank: u32) -> Result<IpcMapping, String> {
        gpu.bind()?;
        let mut ptr = 0;
        // SAFETY: a handle another process of this job exported; flag 1 enables peer access lazily.
        ok(unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, 1) }, "cuIpcOpenMemHandle")?;
        Ok(IpcMapping { ptr, rank, gpu: gpu.clone() })
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() && !self.gpu.is_wedged() {
            let zero = 0u64.to_le_bytes();
            // SAFETY: the mapping's head holds a word per rank (`Exported`); this rank's is in it. Then the mapping,
            // opened by cuIpcOpenMemHandle, is closed once.
            unsafe {
                sys::cuMemcpyHtoD_v2(self.ptr + 8 * self.rank as u64, zero.as_ptr().cast(), 8);
                sys::cuIpcCloseMemHandle(self.ptr);
            }
        }
    }
}
