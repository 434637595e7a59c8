//! CPU compute backend: gemm + rayon kernels and the naive reference ops
