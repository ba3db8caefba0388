//! The `cuda` transport for rank threads of one process: connection records in the receiver's device memory,
//! reached by the other GPUs through peer access, and a launcher per GPU and call shape.

use crate::error::RuntimeError;
use crate::exec::cuda::{driver, gpu, ok, CudaExec, CudaTarget, DeviceAlloc, Gpu};
use crate::exec::encode::{self, conn};
use crate::exec::{Executor, Launcher, Plan};
use crate::transport::{Fabric, Transport, SLOTS};
use cudarc::driver::sys::{self, CUresult};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type GpuLauncher = Arc<Launcher<CudaTarget>>;

/// A connection's record: sender, receiver, channel, slot bytes, lane.
type ConnKey = (u32, u32, u8, usize, u32);

/// The `cuda` transport's fabric for ranks that are threads of this process: rank r on GPU `r % gpus`.
pub(crate) struct CudaFabric {
    gpus: Vec<Arc<Gpu>>,
    n_ranks: u32,
    conns: Mutex<HashMap<ConnKey, Arc<DeviceAlloc>>>,
    /// By call shape (fingerprint) and GPU.
    launchers: Mutex<HashMap<(u64, i32), GpuLauncher>>,
}

impl CudaFabric {
    /// Opens `gpus` GPUs (every one the driver sees when `None`) and enables peer access between them.
    pub fn new(n_ranks: u32, gpus: Option<u32>) -> Result<CudaFabric, String> {
        let driver = driver()?;
        let n = gpus.unwrap_or(driver.devices as u32).min(driver.devices as u32).min(n_ranks.max(1)).max(1);
        let gpus: Vec<Arc<Gpu>> = (0..n as i32).map(gpu).collect::<Result<_, _>>()?;
        for a in &gpus {
            for b in &gpus {
                if a.ordinal == b.ordinal {
                    continue;
                }
                let mut can = 0;
                // SAFETY: valid devices and out-pointer.
                ok(unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.device, b.device) }, "cuDeviceCanAccessPeer")?;
                if can == 0 {
                    return Err(format!(
                        "GPU {} cannot access GPU {}'s memory (no peer access over NVLink or PCIe): run with \
                         COLLC_CUDA_GPUS=1, or one process per GPU",
                        a.ordinal, b.ordinal
                    ));
                }
                a.bind()?;
                // SAFETY: b's context is retained; already-enabled is not an error.
                let result = unsafe { sys::cuCtxEnablePeerAccess(b.ctx, 0) };
                if result != CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                    ok(result, "cuCtxEnablePeerAccess")?;
                }
            }
        }
        Ok(CudaFabric { gpus, n_ranks, conns: Mutex::default(), launchers: Mutex::default() })
    }

    pub fn gpu_of(&self, rank: u32) -> &Arc<Gpu> {
        &self.gpus[rank as usize % self.gpus.len()]
    }

    /// The same on every rank: from the most ranks any GPU holds and the fewest SMs any has.
    fn lanes(&self, plan: &Plan) -> Result<u32, String> {
        let per_gpu = self.n_ranks.div_ceil(self.gpus.len() as u32);
        let sms = self.gpus.iter().map(|g| g.sms).min().unwrap_or(1);
        lanes_for(sms, per_gpu, plan)
    }

    fn ranks_on(&self, ordinal: i32) -> Vec<u32> {
        (0..self.n_ranks).filter(|&r| self.gpu_of(r).ordinal == ordinal).collect()
    }
}

impl Fabric for CudaFabric {
    fn transport(&self) -> Transport {
        Transport::of(&super::CUDA)
    }

    fn remove_all(&self) {}

    fn gpu_ordinal(&self, rank: u32) -> Option<i32> {
        Some(self.gpu_of(rank).ordinal)
    }

    fn prepare(&self, plan: Plan) -> Result<Box<dyn Executor>, RuntimeError> {
        let rank = plan.rank;
        let config = |e: String| RuntimeError::Config(format!("rank {rank}: {e}"));
        let gpu = self.gpu_of(plan.rank).clone();
        let lanes = self.lanes(&plan).map_err(config)?;
        // Ranks of one GPU run in one launch and reach each other's buffers at the same addresses: single copy.
        let same_gpu = |end: &crate::link::LinkEnd| self.gpu_of(end.from).ordinal == self.gpu_of(end.to).ordinal;
        let image = encode::encode(&[&plan], lanes, &same_gpu).map_err(config)?;
        let mut conns = Vec::with_capacity(image.conns.len());
        {
            let mut registry = self.conns.lock().map_err(|_| RuntimeError::Poisoned)?;
            for &(from, to, channel, slot_bytes, lane) in &image.conns {
                let record = match registry.get(&(from, to, channel, slot_bytes, lane)) {
                    Some(record) => record.clone(),
                    None => {
                        // The record and its slots live with the receiver, which reads them most.
                        let record = Arc::new(conn_record(self.gpu_of(to), slot_bytes).map_err(config)?);
                        registry.insert((from, to, channel, slot_bytes, lane), record.clone());
                        record
                    }
                };
                conns.push(record);
            }
        }
        let table: Vec<u64> = conns.iter().map(|c| c.ptr).collect();
        let launcher = {
            let mut launchers = self.launchers.lock().map_err(|_| RuntimeError::Poisoned)?;
            let key = (plan.fingerprint, gpu.ordinal);
            match launchers.get(&key) {
                Some(l) => l.clone(),
                None => {
                    let ranks = self.ranks_on(gpu.ordinal);
                    let stop = DeviceAlloc::zeroed(&gpu, 8).map_err(config)?;
                    let target = CudaTarget { gpu: gpu.clone(), system_scope: self.gpus.len() > 1, stop };
                    let l = Arc::new(Launcher::new(target, ranks));
                    launchers.insert(key, l.clone());
                    l
                }
            }
        };
        CudaExec::upload(plan, &gpu, &image, &table, Box::new(conns), launcher).map_err(config)
    }
}

/// Lanes for `per_gpu` ranks sharing a GPU of `sms` SMs: as many as fill them with one block each, within 64 MiB of
/// slots per connection; `COLLC_CUDA_LANES` overrides. Both ends of a connection must get the same count.
pub(super) fn lanes_for(sms: u32, per_gpu: u32, plan: &Plan) -> Result<u32, String> {
    if let Ok(text) = std::env::var("COLLC_CUDA_LANES") {
        return text
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or(format!("COLLC_CUDA_LANES=`{text}` is not a positive number"));
    }
    // Each lane has its own slots: at most 64 MiB of them per connection (NCCL keeps 4 MiB per channel).
    let by_memory = ((64usize << 20) / (SLOTS as usize * plan.widest_slot.max(1))).max(1) as u32;
    Ok((sms / (per_gpu.max(1) * plan.channels.max(1))).clamp(1, 64).min(by_memory))
}

/// A connection's record (`CONN_WORDS` words) followed, `RECORD_BYTES` in, by its `SLOTS` slots.
pub(super) fn conn_record(gpu: &Arc<Gpu>, slot_bytes: usize) -> Result<DeviceAlloc, String> {
    let memory = DeviceAlloc::zeroed(gpu, encode::record_bytes(slot_bytes))?;
    memory.write(conn::SLOT_BYTES * 8, &(slot_bytes as u64).to_le_bytes())?;
    Ok(memory)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys;

    /// Without a driver (CI has none) every way in fails with the same clear message, never a panic.
    #[test]
    fn without_a_driver_the_transport_says_so() {
        if sys_has_driver() {
            return assert!(driver().is_ok());
        }
        let error = driver().err().expect("no driver here");
        assert!(error.starts_with("no CUDA driver found"), "{error}");
        assert!(CudaFabric::new(2, None).err().is_some_and(|e| e.starts_with("no CUDA driver found")));
    }

    fn sys_has_driver() -> bool {
        // SAFETY: only tries to open the library.
        unsafe { sys::is_culib_present() }
    }
}
