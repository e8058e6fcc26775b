//! Dequantization of ggml's block formats to f32.
//!
//! Each block holds a fixed number of elements (32, or 256 for the K-quants) as small integers
//! plus f16 (f32 for Q8_K) scales. The arithmetic follows ggml's reference dequantizers with
//! the same rounding steps: a sub-block scale is rounded to f32 before it multiplies the
//! quantized value, and `d * q + m` is a multiply then an add, never a fused multiply-add. So
//! the results are bit-identical to gguf-py's `gguf.quants.dequantize` and to ggml's C code.

use half::f16;

use crate::dtype::GgmlType;

/// Elements per K-quant super-block.
const QK_K: usize = 256;

/// Dequantizes `n` elements of GGML type `q` from `data` to f32.
///
/// `data` must hold exactly the whole blocks of `n` elements; anything else is an error saying
/// what was expected.
pub fn dequantize(q: GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>, String> {
    let mut out = vec![0f32; n];
    dequantize_into(q, data, &mut out)?;
    Ok(out)
}

/// [`dequantize`] into `out` (`out.len()` elements), without allocating: for kernels that
/// rebuild rows of a block-quantized matrix as they go.
pub fn dequantize_into(q: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), String> {
    let n = out.len();
    let (block, bytes) = q.block();
    let (block, bytes) = (block as usize, bytes as usize);
    if !n.is_multiple_of(block) {
        return Err(format!(
            "{n} elements are not a whole number of {} blocks of {block}",
            q.name()
        ));
    }
    let expected = (n / block).checked_mul(bytes);
    if expected != Some(data.len()) {
        let expected = expected.map_or("more than usize::MAX".to_string(), |e| e.to_string());
        return Err(format!(
            "{n} elements of {} take {expected} bytes, but {} bytes are stored",
            q.name(),
            data.len()
        ));
    }
    let f: fn(&[u8], &mut [f32]) = match q {
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q8_1 => q8_1,
        GgmlType::Q2_K => q2_k,
        GgmlType::Q3_K => q3_k,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q5_K => q5_k,
        GgmlType::Q6_K => q6_k,
        GgmlType::Q8_K => q8_k,
    };
    for (b, y) in data.chunks_exact(bytes).zip(out.chunks_exact_mut(block)) {
        f(b, y);
    }
    Ok(())
}

fn h(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Q4_0: f16 d, 16 bytes of nibbles; low nibbles are elements 0..16, high ones 16..32;
/// value = d * (q - 8).
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = h(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = d * ((qs[j] & 0x0f) as i32 - 8) as f32;
        y[j + 16] = d * ((qs[j] >> 4) as i32 - 8) as f32;
    }
}

/// Q4_1: f16 d, f16 m, nibbles as Q4_0; value = d * q + m.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (h(b, 0), h(b, 2));
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = d * (qs[j] & 0x0f) as f32 + m;
        y[j + 16] = d * (qs[j] >> 4) as f32 + m;
    }
}

/// The 5-bit values of Q5_0/Q5_1: nibbles as Q4_0, bit i of the u32 `qh` is bit 4 of element i.
fn five_bit(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// Q5_0: f16 d, u32 high bits, nibbles; value = d * (q - 16).
fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = h(b, 0);
    for (y, q) in y.iter_mut().zip(five_bit(&b[2..6], &b[6..22])) {
        *y = d * (q as i32 - 16) as f32;
    }
}

/// Q5_1: f16 d, f16 m, u32 high bits, nibbles; value = d * q + m.
fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (h(b, 0), h(b, 2));
    for (y, q) in y.iter_mut().zip(five_bit(&b[4..8], &b[8..24])) {
        *y = d * q as f32 + m;
    }
}

/// Q8_0: f16 d, 32 i8; value = d * q.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = h(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = d * q as i8 as f32;
    }
}

/// Q8_1: f16 d, f16 s (d times the sum of the quants, unused here), 32 i8; value = d * q.
fn q8_1(b: &[u8], y: &mut [f32]) {
    let d = h(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[4..36]) {
        *y = d * q as i8 as f32;
    }
}

/// Q2_K: 16 bytes of 4-bit scale/min pairs, 64 bytes of 2-bit quants, f16 d, f16 dmin.
/// Element e lies in half e/128, takes bits 2*((e%128)/32) of byte e%32 of that half's 32 bytes,
/// and belongs to sub-block e/16; value = (d * scale) * q - (dmin * min).
fn q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let (d, dmin) = (h(b, 80), h(b, 82));
    for (e, y) in y.iter_mut().enumerate().take(QK_K) {
        let s = scales[e / 16];
        let dl = d * (s & 0x0f) as f32;
        let ml = dmin * (s >> 4) as f32;
        let shift = 2 * ((e % 128) / 32);
        let q = (qs[(e / 128) * 32 + e % 32] >> shift) & 3;
        *y = dl * q as f32 - ml;
    }
}

/// Q3_K: 32 bytes of high-bit masks, 64 bytes of 2-bit quants, 12 bytes of 6-bit signed scales,
/// f16 d. The low 2 bits are placed as in Q2_K; bit (e/32) of mask byte e%32, when clear,
/// subtracts 4. Scale k has its low 4 bits in nibble k/8 of byte k%8 and its high 2 bits at
/// bits 2*(k/4) of byte 8 + k%4, offset by 32; value = (d * scale) * q.
fn q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let sc = &b[96..108];
    let d = h(b, 108);
    let mut dl = [0f32; 16];
    for (k, dl) in dl.iter_mut().enumerate() {
        let lo = (sc[k % 8] >> (4 * (k / 8))) & 0x0f;
        let hi = (sc[8 + k % 4] >> (2 * (k / 4))) & 0x03;
        *dl = d * ((lo | (hi << 4)) as i32 - 32) as f32;
    }
    for (e, y) in y.iter_mut().enumerate().take(QK_K) {
        let low = (qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        let high_clear = (hmask[e % 32] >> (e / 32)) & 1 == 0;
        let q = low as i32 - if high_clear { 4 } else { 0 };
        *y = dl[e / 16] * q as f32;
    }
}

/// The eight 6-bit (scale, min) pairs of Q4_K/Q5_K, packed in 12 bytes: pairs 0..4 in the low
/// 6 bits of bytes 0..4 (scale) and 4..8 (min); pairs 4..8 take their low 4 bits from the
/// nibbles of bytes 8..12 and their high 2 bits from the top of bytes 0..8.
fn k_scale_min(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 0x3f;
        mn[j] = s[j + 4] & 0x3f;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 2) & 0x30);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (sc, mn)
}

/// Q4_K: f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of nibbles. Element e takes
/// nibble (e%64)/32 of byte (e/64)*32 + e%32, in sub-block e/32;
/// value = (d * scale) * q - (dmin * min).
fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (h(b, 0), h(b, 2));
    let (sc, mn) = k_scale_min(&b[4..16]);
    let qs = &b[16..144];
    for (e, y) in y.iter_mut().enumerate().take(QK_K) {
        let g = e / 32;
        let q = (qs[(e / 64) * 32 + e % 32] >> (4 * ((e % 64) / 32))) & 0x0f;
        *y = (d * sc[g] as f32) * q as f32 - dmin * mn[g] as f32;
    }
}

/// Q5_K: as Q4_K plus 32 bytes of high bits: bit e/32 of byte e%32 is bit 4 of element e.
fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (h(b, 0), h(b, 2));
    let (sc, mn) = k_scale_min(&b[4..16]);
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (e, y) in y.iter_mut().enumerate().take(QK_K) {
        let g = e / 32;
        let low = (qs[(e / 64) * 32 + e % 32] >> (4 * ((e % 64) / 32))) & 0x0f;
        let high = (qh[e % 32] >> (e / 32)) & 1;
        let q = low | (high << 4);
        *y = (d * sc[g] as f32) * q as f32 - dmin * mn[g] as f32;
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 i8 scales, f16 d. In half
/// t = e/128, the low nibble is nibble (e%128)/64 of byte t*64 + e%64 and the high bits are bits
/// 2*((e%128)/32) of byte t*32 + e%32; value = (d * scale[e/16]) * (q - 32).
fn q6_k(b: &[u8], y: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let scales = &b[192..208];
    let d = h(b, 208);
    for (e, y) in y.iter_mut().enumerate().take(QK_K) {
        let t = e / 128;
        let r = e % 128;
        let low = (ql[t * 64 + r % 64] >> (4 * (r / 64))) & 0x0f;
        let high = (qh[t * 32 + r % 32] >> (2 * (r / 32))) & 0x03;
        let q = (low | (high << 4)) as i32 - 32;
        *y = (d * scales[e / 16] as i8 as f32) * q as f32;
    }
}

/// Q8_K: f32 d, 256 i8, 16 i16 block sums (unused here); value = d * q.
fn q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (y, &q) in y.iter_mut().zip(&b[4..260]) {
        *y = d * q as i8 as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_partial_block_and_a_wrong_byte_count() {
        let e = dequantize(GgmlType::Q4_0, &[0; 18], 16).unwrap_err();
        assert!(e.contains("whole number of Q4_0 blocks"), "{e}");
        let e = dequantize(GgmlType::Q6_K, &[0; 209], 256).unwrap_err();
        assert!(e.contains("take 210 bytes, but 209"), "{e}");
    }

    #[test]
    fn q8_0_block_by_hand() {
        // d = 0.5 (f16 0x3800), quants -2, -1, 0, 1, ... 29.
        let mut b = vec![0x00, 0x38];
        b.extend((0..32).map(|i| (i - 2) as i8 as u8));
        let y = dequantize(GgmlType::Q8_0, &b, 32).unwrap();
        assert_eq!(&y[..4], &[-1.0, -0.5, 0.0, 0.5]);
        assert_eq!(y[31], 14.5);
    }

    #[test]
    fn q8_1_block_by_hand() {
        // gguf-py cannot check Q8_1 (its size table still says 40 bytes; ggml's block is 36):
        // d = -2 (f16 0xc000), s = anything, quants 0, 1, ..., 31.
        let mut b = vec![0x00, 0xc0, 0x12, 0x34];
        b.extend(0..32u8);
        let y = dequantize(GgmlType::Q8_1, &b, 32).unwrap();
        assert_eq!(y, (0..32).map(|i| -2.0 * i as f32).collect::<Vec<_>>());
    }
}
