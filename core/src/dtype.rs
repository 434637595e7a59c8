//! Element types of tensors.

use serde::{Deserialize, Serialize};

/// Element type of a [`crate::DeviceTensor`]. Floating types: f32, bf16 and f16 (via `half`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    BF16,
    F16,
    I32,
    I64,
    U8,
    U16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 | DType::U16 => 2,
            DType::I64 => 8,
            DType::U8 => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16 | DType::F16)
    }

    /// The name used in safetensors headers.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::I32 => "I32",
            DType::I64 => "I64",
            DType::U8 => "U8",
            DType::U16 => "U16",
        }
    }

    /// Parses the names users type (`fp32`, `bf16`, `float16`, ...).
    pub fn parse(s: &str) -> anyhow::Result<DType> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" | "float" => DType::F32,
            "bf16" | "bfloat16" => DType::BF16,
            "f16" | "fp16" | "float16" | "half" => DType::F16,
            "i32" | "int32" => DType::I32,
            "i64" | "int64" => DType::I64,
            "u8" | "uint8" => DType::U8,
            "u16" | "uint16" => DType::U16,
            other => {
                anyhow::bail!("unknown dtype `{other}`: expected one of fp32, bf16, fp16, int32, int64, uint8, uint16")
            }
        })
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            DType::F32 => "fp32",
            DType::BF16 => "bf16",
            DType::F16 => "fp16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
        };
        f.write_str(s)
    }
}
