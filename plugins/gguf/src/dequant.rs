//! Dequantization of ggml tensor types to f32, following ggml's reference (`dequantize_row_*`
//! in ggml-quants.c) operation by operation in f32, so results equal gguf-py's and
//! transformers' dequantized weights.
//!
//! Block layouts (little-endian, `d`/`m`/`dmin` are f16):
//! * `Q8_0` (32 values, 34 bytes): `d`, 32 × i8; `x = d·q`.
//! * `Q4_0` (32 values, 18 bytes): `d`, 16 bytes of nibbles; low nibbles are values 0..16,
//!   high nibbles 16..32; `x = d·(q − 8)`.
//! * `Q4_1` (32 values, 20 bytes): `d`, `m`, nibbles as Q4_0; `x = d·q + m`.
//! * `Q4_K` (256 values, 144 bytes): `d`, `dmin`, 12 bytes of packed 6-bit scales/mins for 8
//!   sub-blocks of 32, 128 bytes of nibbles; `x = d·sc·q − dmin·mn`.
//! * `Q6_K` (256 values, 210 bytes): 128 bytes low nibbles, 64 bytes of 2-bit highs, 16 i8
//!   scales, `d`; `x = d·sc·(q − 32)`.

use anyhow::{bail, Result};
use half::{bf16, f16};

/// The ggml tensor types this reader knows (ids from ggml.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q8_0,
    Q4K,
    Q6K,
    BF16,
}

impl GgmlType {
    /// The type of ggml id `id`; other quantizations are an error naming them.
    pub fn from_id(id: u32) -> Result<GgmlType> {
        Ok(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            14 => GgmlType::Q6K,
            30 => GgmlType::BF16,
            6 | 7 | 9 | 10 | 11 | 13 | 15..=29 | 31.. => bail!(
                "ggml type {id} is not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K and Q6_K are); \
                 re-quantize the model with one of those"
            ),
            _ => bail!("unknown ggml type {id}"),
        })
    }

    /// `(values per block, bytes per block)`.
    pub fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q4K => (256, 144),
            GgmlType::Q6K => (256, 210),
        }
    }

    /// Bytes of `numel` values whose fastest dim is `row` (rows are whole blocks).
    pub fn byte_size(self, numel: usize, row: usize) -> Result<usize> {
        let (bv, bb) = self.block();
        if row == 0 || !row.is_multiple_of(bv) {
            bail!("{self:?} needs a fastest dim that is a multiple of {bv}, got {row}");
        }
        Ok(numel / bv * bb)
    }
}

fn h(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// `numel` values of type `ty` from `raw` (exactly their bytes).
pub fn dequantize(ty: GgmlType, raw: &[u8], numel: usize) -> Result<Vec<f32>> {
    let (bv, bb) = ty.block();
    if !numel.is_multiple_of(bv) || raw.len() != numel / bv * bb {
        bail!("{ty:?}: {} bytes do not hold {numel} values ({bb} bytes per {bv})", raw.len());
    }
    let mut out = Vec::with_capacity(numel);
    for blk in raw.chunks_exact(bb) {
        match ty {
            GgmlType::F32 => out.push(f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]])),
            GgmlType::F16 => out.push(h(blk)),
            GgmlType::BF16 => out.push(bf16::from_le_bytes([blk[0], blk[1]]).to_f32()),
            GgmlType::Q8_0 => {
                let d = h(blk);
                out.extend(blk[2..].iter().map(|&q| d * (q as i8) as f32));
            }
            GgmlType::Q4_0 => {
                let (d, qs) = (h(blk), &blk[2..]);
                out.extend(qs.iter().map(|&q| d * ((q & 0xF) as i32 - 8) as f32));
                out.extend(qs.iter().map(|&q| d * ((q >> 4) as i32 - 8) as f32));
            }
            GgmlType::Q4_1 => {
                let (d, m, qs) = (h(blk), h(&blk[2..]), &blk[4..]);
                out.extend(qs.iter().map(|&q| d * (q & 0xF) as f32 + m));
                out.extend(qs.iter().map(|&q| d * (q >> 4) as f32 + m));
            }
            GgmlType::Q4K => q4_k(blk, &mut out),
            GgmlType::Q6K => q6_k(blk, &mut out),
        }
    }
    Ok(out)
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` of a Q4_K block.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

fn q4_k(blk: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (h(blk), h(&blk[2..]));
    let (scales, qs) = (&blk[4..16], &blk[16..144]);
    for (j, q) in qs.chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        out.extend(q.iter().map(|&b| d1 * (b & 0xF) as f32 - min1));
        out.extend(q.iter().map(|&b| d2 * (b >> 4) as f32 - min2));
    }
}

fn q6_k(blk: &[u8], out: &mut Vec<f32>) {
    let (ql, qh, sc, d) = (&blk[..128], &blk[128..192], &blk[192..208], h(&blk[208..]));
    for n in 0..2 {
        let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..]);
        let mut y = [0f32; 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
        out.extend_from_slice(&y);
    }
}
