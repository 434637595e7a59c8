//! megatron package
