//! What `collc gpu bench` times on a GPU: the copy kernel against the driver's memcpy, and an empty launch.

use super::super::encode::THREADS;
use super::memory::DeviceAlloc;
use super::{ok, Gpu};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

/// Launches `f` on `gpu`'s stream with `params` over `grid` blocks of `THREADS` and waits for it.
fn launch_and_wait(gpu: &Gpu, f: sys::CUfunction, grid: u32, params: &mut [*mut c_void]) -> Result<(), String> {
    // SAFETY: `params` match the kernel's parameters (the callers below pass each kernel's own).
    unsafe {
        ok(
            sys::cuLaunchKernel(f, grid, 1, 1, THREADS, 1, 1, 0, gpu.stream, params.as_mut_ptr(), std::ptr::null_mut()),
            "cuLaunchKernel",
        )?;
        ok(sys::cuStreamSynchronize(gpu.stream), "cuStreamSynchronize")
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The copy kernel's rate and `cuMemcpyDtoD`'s on `gpu`, copying `bytes` device to device: (kernel, memcpy) in
/// GB/s of bytes copied, medians of `iters` timed copies each, alternating.
pub fn copy_rates(gpu: &Arc<Gpu>, bytes: usize, iters: u32) -> Result<(f64, f64), String> {
    let (src, dst) = (DeviceAlloc::zeroed(gpu, bytes)?, DeviceAlloc::zeroed(gpu, bytes)?);
    let grid = gpu.sms * 4;
    let (mut kernel, mut memcpy) = (Vec::new(), Vec::new());
    for i in 0..iters + 2 {
        let (mut d, mut s, mut n) = (dst.ptr, src.ptr, bytes as u64);
        let mut params: [*mut c_void; 3] =
            [(&mut d as *mut u64).cast(), (&mut s as *mut u64).cast(), (&mut n as *mut u64).cast()];
        let started = Instant::now();
        launch_and_wait(gpu, gpu.kernels.copy, grid, &mut params)?;
        let k = started.elapsed().as_secs_f64();
        let started = Instant::now();
        // SAFETY: two allocations of `bytes` bytes on this context.
        unsafe {
            ok(sys::cuMemcpyDtoDAsync_v2(dst.ptr, src.ptr, bytes, gpu.stream), "cuMemcpyDtoDAsync")?;
            ok(sys::cuStreamSynchronize(gpu.stream), "cuStreamSynchronize")?;
        }
        let m = started.elapsed().as_secs_f64();
        if i >= 2 {
            kernel.push(bytes as f64 / k / 1e9);
            memcpy.push(bytes as f64 / m / 1e9);
        }
    }
    Ok((median(kernel), median(memcpy)))
}

/// Microseconds from launching an empty kernel to its completion seen by the host: the floor of a call.
pub fn empty_launch_us(gpu: &Arc<Gpu>, iters: u32) -> Result<f64, String> {
    gpu.bind()?;
    let mut times = Vec::with_capacity(iters as usize);
    for i in 0..iters + 10 {
        let started = Instant::now();
        launch_and_wait(gpu, gpu.kernels.empty, 1, &mut [])?;
        if i >= 10 {
            times.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(median(times))
}
