//! The CUDA kernels (`kernels/cuda/*.cu`: copy and reduce for every dtype and op, and the device interpreter) and,
//! with the `cuda` feature, their compilation to PTX by NVRTC at run time. NVRTC and the driver are loaded
//! dynamically (cudarc's `dynamic-loading`), so the crate builds and the CLI runs on machines without CUDA; NVRTC
//! needs no GPU, so CI compiles every kernel.

use crate::{DataType, ReduceOp};

/// Each source file, in the order the program concatenates them.
pub const SOURCES: [(&str, &str); 2] = [
    ("elementwise.cu", include_str!("../cuda/elementwise.cu")),
    ("interpret.cu", include_str!("../cuda/interpret.cu")),
];

/// The virtual architecture the kernels are compiled for unless told otherwise: Hopper (H100, H200).
pub const DEFAULT_ARCH: &str = "compute_90";

/// The entry points the program defines.
pub const ENTRIES: [&str; 5] = ["collc_interpret", "collc_copy", "collc_reduce", "collc_divide", "collc_empty"];

/// The text NVRTC compiles: the dtype and op codes (`code_defines`), `defines` (the layout constants the encoder
/// owns), then each source behind a `#line` directive, so NVRTC's log names the file and line an error is at.
pub fn program(defines: &[(String, String)]) -> String {
    program_with(defines, &crate::operator::cuda_source(&[]))
}

/// `program` with a user's operator (`operator::cuda_source`) after elementwise.cu, which calls it.
pub fn program_with(defines: &[(String, String)], user: &str) -> String {
    let mut text = String::new();
    for (name, value) in code_defines().iter().chain(defines) {
        text.push_str(&format!("#define {name} {value}\n"));
    }
    for (file, source) in SOURCES {
        text.push_str(&format!("#line 1 \"kernels/cuda/{file}\"\n"));
        text.push_str(source);
        text.push('\n');
        if file == "elementwise.cu" {
            text.push_str("#line 1 \"user operator\"\n");
            text.push_str(user);
        }
    }
    text
}

/// `COLLC_DTYPE_F32`, `COLLC_REDOP_SUM`, ..., `COLLC_REDOP_PREMULSUM`: each `DataType` and `ReduceOp` with its value
/// as the encoder writes it into a plan (`dtype as u32`, `op.nccl_code()`), so the sources name codes rather than
/// repeat numbers.
pub fn code_defines() -> Vec<(String, String)> {
    let dtypes = DataType::ALL.iter().map(|&d| (format!("COLLC_DTYPE_{}", d.short_name().to_uppercase()), d as u32));
    let premulsum = ReduceOp::PreMulSum(crate::Scalar::Int(1));
    let ops = ReduceOp::ALL
        .iter()
        .chain([&premulsum])
        .map(|&o| (format!("COLLC_REDOP_{}", o.name().to_uppercase()), u32::from(o.nccl_code())))
        .chain([("COLLC_REDOP_USER".to_string(), u32::from(ReduceOp::USER_CODE))]);
    dtypes.chain(ops).map(|(name, value)| (name, value.to_string())).collect()
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
    compile_with(defines, &crate::operator::cuda_source(&[]), arch)
}

/// `compile` with a user's operator (`operator::cuda_source`) in the program.
#[cfg(feature = "cuda")]
pub fn compile_with(defines: &[(String, String)], user: &str, arch: &'static str) -> Result<String, String> {
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
    match cudarc::nvrtc::compile_ptx_with_opts(program_with(defines, user), options) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => {
            Err(format!("NVRTC could not compile the kernels for {arch}:\n{}", log.to_string_lossy()))
        }
        Err(other) => Err(format!("NVRTC failed for {arch}: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::{code_defines, program, SOURCES};

    /// Every switch of the sources ends in a default that traps, and none names a dtype or op by a bare number: an
    /// unknown code fails the launch instead of skipping the work.
    #[test]
    fn every_switch_traps_on_a_code_it_does_not_name() {
        for (file, source) in SOURCES {
            assert!(!source.contains("case 0:") && !source.contains("case 7:"), "{file} names a code by its number");
            let mut rest = source;
            let mut switches = 0;
            while let Some(at) = rest.find("switch (") {
                let body = &rest[at..];
                let open = body.find('{').expect("a switch has a body");
                let mut depth = 0;
                let close = body[open..]
                    .char_indices()
                    .find_map(|(i, c)| {
                        depth += match c {
                            '{' => 1,
                            '}' => -1,
                            _ => 0,
                        };
                        (depth == 0).then_some(open + i)
                    })
                    .expect("a switch's body closes");
                let block = &body[..close];
                assert!(
                    block.contains("default: COLLC_TRAP();"),
                    "{file}: a switch without a trapping default:\n{block}"
                );
                switches += 1;
                rest = &body[close..];
            }
            assert!(switches > 0, "{file} has no switch");
        }
    }

    #[test]
    fn the_codes_are_the_enums_values_and_come_first() {
        let defines = code_defines();
        let value = |name: &str| defines.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(value("COLLC_DTYPE_I8"), Some("0"));
        assert_eq!(value("COLLC_DTYPE_F32"), Some("7"));
        assert_eq!(value("COLLC_DTYPE_BF16"), Some("9"));
        assert_eq!(value("COLLC_REDOP_SUM"), Some("0"));
        assert_eq!(value("COLLC_REDOP_AVG"), Some("4"));
        let text = program(&[("COLLC_X".into(), "1".into())]);
        assert!(text.find("#define COLLC_REDOP_MIN 3").expect("defined") < text.find("#line 1").expect("a source"));
    }
}
