//! The token dtypes of the `.bin` file and their `.idx` codes (SPEC §1.3).

use anyhow::{anyhow, bail};
use megatron_core::Result;

/// Element type of the `.bin` token data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenDType {
    U8,
    I8,
    I16,
    I32,
    I64,
    F64,
    F32,
    U16,
}

impl TokenDType {
    pub const ALL: [TokenDType; 8] = [
        TokenDType::U8,
        TokenDType::I8,
        TokenDType::I16,
        TokenDType::I32,
        TokenDType::I64,
        TokenDType::F64,
        TokenDType::F32,
        TokenDType::U16,
    ];

    /// The `.idx` code (1..=8).
    pub fn code(self) -> u8 {
        match self {
            TokenDType::U8 => 1,
            TokenDType::I8 => 2,
            TokenDType::I16 => 3,
            TokenDType::I32 => 4,
            TokenDType::I64 => 5,
            TokenDType::F64 => 6,
            TokenDType::F32 => 7,
            TokenDType::U16 => 8,
        }
    }

    pub fn from_code(code: u8) -> Option<TokenDType> {
        TokenDType::ALL.into_iter().find(|d| d.code() == code)
    }

    /// Bytes per element.
    pub fn itemsize(self) -> usize {
        match self {
            TokenDType::U8 | TokenDType::I8 => 1,
            TokenDType::I16 | TokenDType::U16 => 2,
            TokenDType::I32 | TokenDType::F32 => 4,
            TokenDType::I64 | TokenDType::F64 => 8,
        }
    }

    /// numpy's name for the dtype.
    pub fn name(self) -> &'static str {
        match self {
            TokenDType::U8 => "uint8",
            TokenDType::I8 => "int8",
            TokenDType::I16 => "int16",
            TokenDType::I32 => "int32",
            TokenDType::I64 => "int64",
            TokenDType::F64 => "float64",
            TokenDType::F32 => "float32",
            TokenDType::U16 => "uint16",
        }
    }

    /// The preprocessors' choice (SPEC §1.3): `uint16` below 65500 ids, else `int32`.
    pub fn optimal_for_vocab(vocab_size: usize) -> TokenDType {
        if vocab_size < 65500 {
            TokenDType::U16
        } else {
            TokenDType::I32
        }
    }

    /// Decodes little-endian elements into `out`. Float data is accepted only when every value
    /// is an integer (token ids stored as floats).
    pub fn decode_into(self, bytes: &[u8], out: &mut Vec<i64>) -> Result<()> {
        let n = self.itemsize();
        out.reserve(bytes.len() / n);
        for chunk in bytes.chunks_exact(n) {
            let v = match self {
                TokenDType::U8 => i64::from(chunk[0]),
                TokenDType::I8 => i64::from(chunk[0] as i8),
                TokenDType::I16 => i64::from(i16::from_le_bytes([chunk[0], chunk[1]])),
                TokenDType::U16 => i64::from(u16::from_le_bytes([chunk[0], chunk[1]])),
                TokenDType::I32 => i64::from(i32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]])),
                TokenDType::I64 => i64::from_le_bytes(le8(chunk)),
                TokenDType::F32 => {
                    float_token(f64::from(f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]])))?
                }
                TokenDType::F64 => float_token(f64::from_le_bytes(le8(chunk)))?,
            };
            out.push(v);
        }
        Ok(())
    }

    /// Appends `value` in this dtype; an error if it does not fit.
    pub fn encode_into(self, value: i64, out: &mut Vec<u8>) -> Result<()> {
        let range_err = || anyhow!("token {value} does not fit the dataset dtype {}; use a wider dtype", self.name());
        match self {
            TokenDType::U8 => out.push(u8::try_from(value).map_err(|_| range_err())?),
            TokenDType::I8 => out.extend(i8::try_from(value).map_err(|_| range_err())?.to_le_bytes()),
            TokenDType::I16 => out.extend(i16::try_from(value).map_err(|_| range_err())?.to_le_bytes()),
            TokenDType::U16 => out.extend(u16::try_from(value).map_err(|_| range_err())?.to_le_bytes()),
            TokenDType::I32 => out.extend(i32::try_from(value).map_err(|_| range_err())?.to_le_bytes()),
            TokenDType::I64 => out.extend(value.to_le_bytes()),
            // Exact for |value| < 2^24 (f32) and 2^53 (f64); larger ids would be rounded.
            TokenDType::F32 => {
                if value.unsigned_abs() > 1 << 24 {
                    return Err(range_err());
                }
                out.extend((value as f32).to_le_bytes())
            }
            TokenDType::F64 => {
                if value.unsigned_abs() > 1 << 53 {
                    return Err(range_err());
                }
                out.extend((value as f64).to_le_bytes())
            }
        }
        Ok(())
    }
}

fn le8(chunk: &[u8]) -> [u8; 8] {
    let mut b = [0u8; 8];
    b.copy_from_slice(&chunk[..8]);
    b
}

fn float_token(v: f64) -> Result<i64> {
    if v.fract() != 0.0 || !v.is_finite() || v.abs() > 9.0e15 {
        bail!("float value {v} in the .bin file is not a token id");
    }
    Ok(v as i64)
}

impl std::fmt::Display for TokenDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_values_survive_every_dtype() -> Result<()> {
        for d in TokenDType::ALL {
            assert_eq!(TokenDType::from_code(d.code()), Some(d));
            let mut bytes = vec![];
            for v in [0i64, 1, 100, 127] {
                d.encode_into(v, &mut bytes)?;
            }
            assert_eq!(bytes.len(), 4 * d.itemsize());
            let mut back = vec![];
            d.decode_into(&bytes, &mut back)?;
            assert_eq!(back, [0, 1, 100, 127], "{d}");
        }
        assert_eq!(TokenDType::from_code(0), None);
        assert_eq!(TokenDType::from_code(9), None);
        assert!(TokenDType::U16.encode_into(65536, &mut vec![]).is_err());
        assert!(TokenDType::U8.encode_into(-1, &mut vec![]).is_err());
        assert!(TokenDType::F32.decode_into(&1.5f32.to_le_bytes(), &mut vec![]).is_err());
        assert_eq!(TokenDType::optimal_for_vocab(50257), TokenDType::U16);
        assert_eq!(TokenDType::optimal_for_vocab(65500), TokenDType::I32);
        Ok(())
    }
}
