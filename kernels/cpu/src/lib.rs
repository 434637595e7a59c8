//! `megatron-cpu`: the CPU compute backend ([`CpuBackend`], plugin name `cpu`).
//!
//! Tensors live in host memory (`Storage::Host`); `zeros`/`from_host`/`to_host`/`copy`/`cast`
//! handle every [`megatron_core::DType`], and every compute op takes fp32, bf16 and fp16 tensors
//! with the mixed-precision rules of [`megatron_core::Backend`]: f32 arithmetic, half data
//! widened at the op boundary (fused into the chunks/rows/GEMM packing of the hot ops, see
//! `widen.rs`) and rounded once into the output's dtype. fp32 matmuls go to the `gemm` crate
//! (AVX-512 kernels with the `x86-v4` feature); bf16/fp16/mixed ones to `gemm_half.rs` (packed
//! panels, AVX512-BF16 `vdpbf16ps` or AVX-512 FMAs on widened panels, K never split across
//! threads; [`CpuBackend::bf16_gemm_kernel`] says which). Attention is a tiled
//! online-softmax kernel that never materialises the `(B, heads, T, T)` score matrix, and the
//! elementwise/row ops are rayon-parallel loops compiled for AVX-512/AVX2 at run time.
//!
//! [`mod@reference`] holds naive single-threaded loops for every op: the oracle of the parity tests.

mod activation;
mod attention;
mod attention_block;
mod backend;
mod check;
mod cross_attention;
mod elementwise;
mod embedding;
mod expvec;
mod gemm;
mod gemm_half;
mod grouped_gemm;
mod kv_attention;
mod kv_slots;
mod loss;
mod mamba;
mod memory;
mod norm;
mod optim;
mod padded_attention;
pub mod reference;
pub mod rng;
mod rotary;
mod scratch;
pub mod simd;
mod tile;
mod tile_bf16;
mod widen;

pub use crate::gemm::measure_gemm_gflops;
pub use crate::gemm_half::{bf16_dot_peak_gflops, bf16_dot_supported};
pub use attention::TILE as ATTENTION_TILE;

use megatron_core::registry::{parse_config, ConfigDe};
use megatron_core::{anyhow, Backend, Factory, Plugin, Result};
use serde::Deserialize;
use std::sync::Arc;

/// The CPU backend. Ops run on the global rayon pool, or on a private pool of `threads`
/// threads when built with [`CpuBackend::with_threads`].
pub struct CpuBackend {
    pool: Option<rayon::ThreadPool>,
    /// `Some(true)`: bf16 × bf16 GEMMs use `vdpbf16ps` (when the CPU has it); `Some(false)`:
    /// the widened-f32 kernel; `None`: [`default_bf16_dot`] decides.
    bf16_dot: Option<bool>,
}

/// `MEGATRON_CPU_BF16_KERNEL=fma` forces the widened-f32 bf16 GEMM, `=dot` the AVX512-BF16 one
/// (for tests and A/B timing); unset: [`default_bf16_dot`].
fn bf16_kernel_from_env() -> Option<bool> {
    match std::env::var("MEGATRON_CPU_BF16_KERNEL").as_deref() {
        Ok("fma") => Some(false),
        Ok("dot") => Some(true),
        _ => None,
    }
}

/// Whether bf16 GEMMs use `vdpbf16ps` by default: on AMD CPUs (Zen 4/5 run it at twice the f32
/// FMA rate) but not on Intel ones, where it measured 3x *slower* than f32 FMAs in flops
/// (`cargo bench -p megatron-cpu --bench ops -- bf16` prints both peaks), so widening to f32 in
/// the packing and running FMAs is the fast path there. A fixed per-machine choice (not a
/// timing), so results are reproducible run to run.
pub fn default_bf16_dot() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let id = std::arch::x86_64::__cpuid(0); // leaf 0: the vendor string
        let vendor: Vec<u8> = [id.ebx, id.edx, id.ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
        bf16_dot_supported() && vendor == b"AuthenticAMD"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        CpuBackend::new()
    }
}

impl CpuBackend {
    /// A backend on the global rayon pool (`RAYON_NUM_THREADS` or one thread per core).
    pub fn new() -> CpuBackend {
        CpuBackend { pool: None, bf16_dot: bf16_kernel_from_env() }
    }

    /// A backend that runs every op on its own pool of `threads` threads.
    pub fn with_threads(threads: usize) -> Result<CpuBackend> {
        if threads == 0 {
            anyhow::bail!("cpu backend: `threads` must be at least 1 (leave it unset to use every core)");
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("megatron-cpu-{i}"))
            .build()
            .map_err(|e| anyhow::anyhow!("cpu backend: cannot start a pool of {threads} threads: {e}"))?;
        Ok(CpuBackend { pool: Some(pool), bf16_dot: bf16_kernel_from_env() })
    }

    /// With `true`, bf16 × bf16 GEMMs (and bf16 attention) take the widened-f32 kernels (explicit AVX-512 FMAs, or a
    /// portable loop) even on a CPU where `vdpbf16ps` is the default; for tests and A/B timing.
    pub fn force_bf16_fallback(mut self, on: bool) -> CpuBackend {
        self.bf16_dot = if on { Some(false) } else { None };
        self
    }

    /// With `true`, bf16 × bf16 GEMMs use the AVX512-BF16 `vdpbf16ps` kernel whenever the CPU
    /// has it, whatever [`default_bf16_dot`] says.
    pub fn force_bf16_dot(mut self, on: bool) -> CpuBackend {
        self.bf16_dot = if on { Some(true) } else { None };
        self
    }

    /// The kernel bf16 × bf16 GEMMs run on: `"avx512bf16"` (`vdpbf16ps`) or `"f32-fma"`.
    pub fn bf16_gemm_kernel(&self) -> &'static str {
        match self.bf16_kernel() {
            gemm_half::Kernel::Dp => "avx512bf16",
            gemm_half::Kernel::Fma => "f32-fma",
        }
    }

    pub(crate) fn bf16_kernel(&self) -> gemm_half::Kernel {
        if self.bf16_dot.unwrap_or_else(default_bf16_dot) && bf16_dot_supported() {
            gemm_half::Kernel::Dp
        } else {
            gemm_half::Kernel::Fma
        }
    }

    /// Threads an op may use.
    pub fn threads(&self) -> usize {
        match &self.pool {
            Some(p) => p.current_num_threads(),
            None => rayon::current_num_threads(),
        }
    }

    /// Runs `f` inside this backend's pool so nested rayon/gemm parallelism uses it.
    pub(crate) fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }
}

/// Config of the `cpu` backend plugin.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CpuConfig {
    /// Worker threads; unset = the global rayon pool (one per core, or `RAYON_NUM_THREADS`).
    pub threads: Option<usize>,
}

fn build_backend(de: ConfigDe) -> Result<Arc<dyn Backend>> {
    let cfg: CpuConfig = parse_config(de, "cpu")?;
    let backend = match cfg.threads {
        Some(n) => CpuBackend::with_threads(n)?,
        None => CpuBackend::new(),
    };
    Ok(Arc::new(backend))
}

fn plugins() -> Vec<Plugin> {
    vec![Plugin {
        name: "cpu",
        description: "CPU backend: gemm-crate + bf16 (AVX512-BF16) matmuls, tiled flash attention, rayon kernels (fp32/bf16/fp16)",
        factory: Factory::Backend(build_backend),
    }]
}

megatron_core::inventory::submit! {
    megatron_core::PluginCrate { crate_name: env!("CARGO_PKG_NAME"), version: env!("CARGO_PKG_VERSION"), plugins }
}
