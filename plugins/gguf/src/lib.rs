//! GGUF files (llama.cpp's model format): a bounds-checked reader of the header, the metadata
//! key/values and the tensor infos ([`GgufFile`]), and dequantization of the tensor types
//! real checkpoints use ([`dequant`]).
//!
//! Every length and count read from the file is checked against the bytes that remain before
//! anything is allocated, so a malformed or truncated file is an error naming the offset and
//! the field, never a panic or a huge allocation.

pub mod dequant;
pub mod reader;

pub use dequant::{dequantize, GgmlType};
pub use reader::{GgufFile, GgufValue, TensorInfo};
