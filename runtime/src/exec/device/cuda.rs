//! The CUDA side of the device executor (feature `cuda`): the kernels compiled by NVRTC with the encoder's layout.

use super::encode;

/// The PTX of every kernel for `arch`, compiled with the layout constants of `encode.rs`, as the executor loads it.
pub fn kernels_ptx(arch: &'static str) -> Result<String, String> {
    collc_kernels::cuda::compile(&encode::layout_defines(), arch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use collc_kernels::cuda::{DEFAULT_ARCH, ENTRIES};

    /// What CI checks without a GPU: NVRTC compiles every kernel for sm_90 through the runtime's own path.
    #[test]
    fn nvrtc_compiles_every_kernel_for_sm_90() {
        let (major, _) = collc_kernels::cuda::nvrtc_version().expect("NVRTC loads (installed by .ci/run)");
        assert!(major >= 12, "NVRTC {major}");
        let ptx = kernels_ptx(DEFAULT_ARCH).unwrap_or_else(|e| panic!("{e}"));
        assert!(ptx.contains(".target sm_90"), "{}", &ptx[..ptx.len().min(400)]);
        for entry in ENTRIES {
            assert!(ptx.contains(&format!(".entry {entry}(")), "no entry {entry}");
        }
    }

    /// A struct that drifts from the encoder fails the compile, and the error shows NVRTC's log with the file.
    #[test]
    fn a_layout_that_drifts_from_the_encoder_fails_with_the_nvrtc_log() {
        let mut defines = encode::layout_defines();
        for (name, value) in &mut defines {
            if name == "COLLC_PLAN_BYTES" {
                *value = "120".into();
            }
        }
        let error = collc_kernels::cuda::compile(&defines, DEFAULT_ARCH).expect_err("the static_assert fires");
        assert!(error.contains("PlanDesc differs from encode.rs") && error.contains("interpret.cu"), "{error}");
    }
}
