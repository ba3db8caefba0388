//! The CUDA kernels (`kernels/cuda/*.cu`: copy and reduce for every dtype and op, and the device interpreter) and,
//! with the `cuda` feature, their compilation to PTX by NVRTC at run time. NVRTC and the driver are loaded
//! dynamically (cudarc's `dynamic-loading`), so the crate builds and the CLI runs on machines without CUDA; NVRTC
//! needs no GPU, so CI compiles every kernel.

/// Each source file, in the order the program concatenates them.
pub const SOURCES: [(&str, &str); 2] = [
    ("elementwise.cu", include_str!("../cuda/elementwise.cu")),
    ("interpret.cu", include_str!("../cuda/interpret.cu")),
];

/// The virtual architecture the kernels are compiled for unless told otherwise: Hopper (H100, H200).
pub const DEFAULT_ARCH: &str = "compute_90";

/// The entry points the program defines.
pub const ENTRIES: [&str; 5] = ["collc_interpret", "collc_copy", "collc_reduce", "collc_divide", "collc_empty"];

/// The text NVRTC compiles: `defines` (the layout constants the encoder owns), then each source behind a `#line`
/// directive, so NVRTC's log names the file and line an error is at.
pub fn program(defines: &[(String, String)]) -> String {
    let mut text = String::new();
    for (name, value) in defines {
        text.push_str(&format!("#define {name} {value}\n"));
    }
    for (file, source) in SOURCES {
        text.push_str(&format!("#line 1 \"kernels/cuda/{file}\"\n"));
        text.push_str(source);
        text.push('\n');
    }
    text
}

/// NVRTC's version, or why it cannot be loaded.
#[cfg(feature = "cuda")]
pub fn nvrtc_version() -> Result<(i32, i32), String> {
    nvrtc_present()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is loaded (checked above) and the two pointers are valid for writes.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if status != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcVersion failed: {status:?}"));
    }
    Ok((major, minor))
}

#[cfg(feature = "cuda")]
fn nvrtc_present() -> Result<(), String> {
    // SAFETY: only tries to open the library by its names.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Ok(());
    }
    Err("no NVRTC library found (libnvrtc.so.13 or libnvrtc.so.12): install the CUDA toolkit, or \
         `pip install nvidia-cuda-nvrtc` and add its `nvidia/cu13/lib` directory to LD_LIBRARY_PATH \
         (or to /etc/ld.so.conf.d and run ldconfig, as .ci/run does)"
        .into())
}

/// Compiles the program for `arch` (e.g. `compute_90`) and returns its PTX; a compile error carries NVRTC's log.
#[cfg(feature = "cuda")]
pub fn compile(defines: &[(String, String)], arch: &'static str) -> Result<String, String> {
    nvrtc_present()?;
    let options = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        // The reference's arithmetic: no flush to zero, IEEE division, no contraction of a*b+c.
        ftz: Some(false),
        prec_div: Some(true),
        fmad: Some(false),
        options: vec!["--std=c++17".into()],
        name: Some("collc.cu".into()),
        ..Default::default()
    };
    match cudarc::nvrtc::compile_ptx_with_opts(program(defines), options) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => {
            Err(format!("NVRTC could not compile the kernels for {arch}:\n{}", log.to_string_lossy()))
        }
        Err(other) => Err(format!("NVRTC failed for {arch}: {other}")),
    }
}
