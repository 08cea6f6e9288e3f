//! ggml tensor encodings decoded to f32, following ggml's reference
//! `dequantize_row_*` (and gguf-py's `gguf.quants`, which the tests compare
//! against). Each quantised type packs a fixed number of elements per block.

use half::{bf16, f16};

/// The ggml types agl can decode (ids as in ggml's `enum ggml_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
    BF16,
    /// A type this reader knows by id but cannot decode.
    Other(u32),
}

const QK_K: usize = 256;

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            30 => Self::BF16,
            // Ids ggml has defined up to now (4, 5 and 31-33 were removed).
            9..=11 | 15..=29 | 34..=41 => Self::Other(id),
            _ => return None,
        })
    }

    /// ggml's name for the type, as gguf-py prints it.
    pub fn name(self) -> String {
        match self {
            Self::F32 => "F32".into(),
            Self::F16 => "F16".into(),
            Self::Q4_0 => "Q4_0".into(),
            Self::Q4_1 => "Q4_1".into(),
            Self::Q5_0 => "Q5_0".into(),
            Self::Q5_1 => "Q5_1".into(),
            Self::Q8_0 => "Q8_0".into(),
            Self::Q4K => "Q4_K".into(),
            Self::Q5K => "Q5_K".into(),
            Self::Q6K => "Q6_K".into(),
            Self::BF16 => "BF16".into(),
            Self::Other(id) => format!("ggml type {id}"),
        }
    }

    /// (elements per block, bytes per block), or `None` if not decodable.
    fn block(self) -> Option<(usize, usize)> {
        Some(match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::BF16 => (1, 2),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q5_1 => (32, 24),
            Self::Q8_0 => (32, 34),
            Self::Q4K => (QK_K, 144),
            Self::Q5K => (QK_K, 176),
            Self::Q6K => (QK_K, 210),
            Self::Other(_) => return None,
        })
    }
}

/// Bytes that `elements` values of type `t` occupy.
pub fn byte_len(t: GgmlType, elements: u64) -> Result<usize, String> {
    let (per_block, block_bytes) = t
        .block()
        .ok_or_else(|| format!("{} cannot be decoded", t.name()))?;
    if !elements.is_multiple_of(per_block as u64) {
        return Err(format!(
            "{elements} elements is not a whole number of {} blocks of {per_block}",
            t.name()
        ));
    }
    usize::try_from(elements / per_block as u64 * block_bytes as u64)
        .map_err(|_| "tensor too large".to_string())
}

/// Decodes `elements` values of type `t` from `bytes`.
pub fn dequantize(t: GgmlType, bytes: &[u8], elements: usize) -> Result<Vec<f32>, String> {
    let expected = byte_len(t, elements as u64)?;
    if bytes.len() != expected {
        return Err(format!(
            "{} bytes for {elements} {} values, expected {expected}",
            bytes.len(),
            t.name()
        ));
    }
    let mut out = Vec::with_capacity(elements);
    let (_, block_bytes) = t.block().unwrap_or((1, 1));
    let decode: fn(&[u8], &mut Vec<f32>) = match t {
        GgmlType::F32 => |b, o| o.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        GgmlType::F16 => |b, o| o.push(half16(b)),
        GgmlType::BF16 => |b, o| o.push(bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q4K => q4_k,
        GgmlType::Q5K => q5_k,
        GgmlType::Q6K => q6_k,
        GgmlType::Other(_) => return Err(format!("{} cannot be decoded", t.name())),
    };
    for block in bytes.chunks_exact(block_bytes) {
        decode(block, &mut out);
    }
    Ok(out)
}

fn half16(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Block: d (f16), 16 bytes of 4-bit values offset by 8. Low nibbles are
/// elements 0..16, high nibbles 16..32.
fn q4_0(b: &[u8], out: &mut Vec<f32>) {
    let d = half16(b);
    let qs = &b[2..18];
    out.extend(qs.iter().map(|q| ((q & 0xF) as i32 - 8) as f32 * d));
    out.extend(qs.iter().map(|q| ((q >> 4) as i32 - 8) as f32 * d));
}

/// Block: d, m (f16), 16 bytes of 4-bit values: x = d*q + m.
fn q4_1(b: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (half16(b), half16(&b[2..]));
    let qs = &b[4..20];
    out.extend(qs.iter().map(|q| d * (q & 0xF) as f32 + m));
    out.extend(qs.iter().map(|q| d * (q >> 4) as f32 + m));
}

/// 5-bit values: the low 4 bits in nibbles, bit 5 of element j in bit j of `qh`.
fn five_bit(qh: u32, qs: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let low = qs.iter().enumerate().map(move |(j, q)| {
        let hi = (((qh >> j) & 1) << 4) as u8;
        (q & 0xF) | hi
    });
    let high = qs.iter().enumerate().map(move |(j, q)| {
        let hi = (((qh >> (j + 16)) & 1) << 4) as u8;
        (q >> 4) | hi
    });
    low.chain(high)
}

fn q5_0(b: &[u8], out: &mut Vec<f32>) {
    let d = half16(b);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    out.extend(five_bit(qh, &b[6..22]).map(|q| (q as i32 - 16) as f32 * d));
}

fn q5_1(b: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (half16(b), half16(&b[2..]));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    out.extend(five_bit(qh, &b[8..24]).map(|q| d * q as f32 + m));
}

fn q8_0(b: &[u8], out: &mut Vec<f32>) {
    let d = half16(b);
    out.extend(b[2..34].iter().map(|&q| (q as i8) as f32 * d));
}

/// The 6-bit scale and min of sub-block `j` packed in K-quants' 12 bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Block: d, dmin (f16), 12 bytes of scales/mins, 128 bytes of nibbles;
/// eight sub-blocks of 32: x = (d*sc)*q - dmin*m.
fn q4_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half16(b), half16(&b[2..]));
    let scales = &b[4..16];
    for (chunk, qs) in b[16..144].chunks_exact(32).enumerate() {
        for (half, shift) in [(0, 0), (1, 4)] {
            let (sc, m) = scale_min_k4(chunk * 2 + half, scales);
            let (dl, ml) = (d * sc as f32, dmin * m as f32);
            out.extend(qs.iter().map(|q| dl * ((q >> shift) & 0xF) as f32 - ml));
        }
    }
}

/// Like Q4_K, plus a fifth bit per element from 32 bytes of `qh`.
fn q5_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half16(b), half16(&b[2..]));
    let scales = &b[4..16];
    let qh = &b[16..48];
    for (chunk, qs) in b[48..176].chunks_exact(32).enumerate() {
        for (half, shift) in [(0, 0), (1, 4)] {
            let (sc, m) = scale_min_k4(chunk * 2 + half, scales);
            let (dl, ml) = (d * sc as f32, dmin * m as f32);
            let bit = chunk * 2 + half;
            out.extend(qs.iter().zip(qh).map(|(q, h)| {
                let v = ((q >> shift) & 0xF) | (((h >> bit) & 1) << 4);
                dl * v as f32 - ml
            }));
        }
    }
}

/// Block: 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 i8 scales,
/// d (f16); sixteen sub-blocks of 16: x = (d*sc)*(q - 32).
fn q6_k(b: &[u8], out: &mut Vec<f32>) {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half16(&b[208..]);
    let mut y = [0f32; QK_K];
    for n in 0..2 {
        let (ql, qh, sc) = (&ql[n * 64..], &qh[n * 32..], &sc[n * 8..]);
        let y = &mut y[n * 128..];
        for l in 0..32 {
            let is = l / 16;
            let q = [
                (ql[l] & 0xF) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (k, q) in q.into_iter().enumerate() {
                let scale = d * (sc[is + 2 * k] as i8) as f32;
                y[l + 32 * k] = scale * (q as i32 - 32) as f32;
            }
        }
    }
    out.extend_from_slice(&y);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_block_decodes_scale_times_value() {
        let mut block = f16::from_f32(0.5).to_le_bytes().to_vec();
        block.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let out = dequantize(GgmlType::Q8_0, &block, 32).unwrap();
        assert_eq!(out[0], -8.0);
        assert_eq!(out[31], 7.5);
    }

    #[test]
    fn partial_blocks_and_short_data_are_errors() {
        assert!(byte_len(GgmlType::Q4_0, 33).is_err());
        assert!(dequantize(GgmlType::Q4_0, &[0; 17], 32).is_err());
        assert!(dequantize(GgmlType::Other(15), &[], 0).is_err());
    }
}
