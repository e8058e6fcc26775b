//! A GGUF group of 32 weights (see `cpu/quant/group.rs`) in x86 registers: its scales and
//! offsets, its integers as 32 bytes, its weights as 8- or 16-lane f32 vectors, decoded per
//! block type exactly as the hub dequantizes. The AVX2 and AVX-512 quantized kernels
//! (`avx2_quant`, `avx512_quant`) build on these; each is always inlined, so it compiles
//! with its caller's features.

use std::arch::x86_64::*;

use crate::cpu::quant::{QKind, GROUP};

/// The bytes of group `g`'s block, and the group's index within it.
///
/// # Safety
/// `row` holds the block (`g` is below the row's group count). Unchecked: the kernels call
/// this per group, and a checked slice's compare and branch are a tenth of a group's work;
/// offsets within the block are constants the compiler checks against its constant size.
#[inline(always)]
unsafe fn locate(kind: QKind, row: &[u8], g: usize) -> (&[u8], usize) {
    let per = kind.block_len() / GROUP;
    let bb = kind.block_bytes();
    let b = g / per;
    debug_assert!((b + 1) * bb <= row.len());
    (
        std::slice::from_raw_parts(row.as_ptr().add(b * bb), bb),
        g % per,
    )
}

/// The f16 at `b[at..at + 2]` as f32, through F16C (the kernels calling this run only where
/// it was detected).
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes(b[at..at + 2].try_into().expect("two bytes"));
    // SAFETY: F16C is present wherever a kernel runs (`features::avx2`).
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits)))) }
}

/// The two f16 at `b[at..at + 4]` as f32, in one conversion (as [`f16_at`]).
#[inline(always)]
fn f16_pair_at(b: &[u8], at: usize) -> (f32, f32) {
    let bits = u32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes"));
    // SAFETY: F16C is present wherever a kernel runs (`features::avx2`).
    unsafe {
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }
}

/// The 6-bit scale and minimum of sub-block `j` of a Q4_K/Q5_K super-block's 12 bytes.
#[inline(always)]
fn k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 0x3f, s[j + 4] & 0x3f)
    } else {
        (
            (s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30),
            (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30),
        )
    }
}

/// Group `g`'s scales and offsets per half: `([a0, a1], [m0, m1])` (`m` is unused where the
/// type has no minimum).
///
/// # Safety
/// As [`locate`]; the CPU has F16C.
#[inline(always)]
pub(crate) unsafe fn scales(kind: QKind, row: &[u8], g: usize) -> ([f32; 2], [f32; 2]) {
    let (b, j) = locate(kind, row, g);
    match kind {
        QKind::Q4_0 | QKind::Q5_0 | QKind::Q8_0 => {
            let d = f16_at(b, 0);
            ([d, d], [0.0; 2])
        }
        QKind::Q4_1 | QKind::Q5_1 => {
            let (d, m) = f16_pair_at(b, 0);
            ([d, d], [m, m])
        }
        QKind::Q4_K | QKind::Q5_K => {
            let (d, dmin) = f16_pair_at(b, 0);
            let (sc, mn) = k_scale_min(&b[4..16], j);
            let (a, m) = (d * sc as f32, -(dmin * mn as f32));
            ([a, a], [m, m])
        }
        QKind::Q6_K => {
            let d = f16_at(b, 208);
            let s = |k: usize| d * b[192 + k] as i8 as f32;
            ([s(2 * j), s(2 * j + 1)], [0.0; 2])
        }
        QKind::Q2_K => {
            let (d, dmin) = f16_pair_at(b, 80);
            let a = |k: usize| d * (b[k] & 0x0f) as f32;
            let m = |k: usize| -(dmin * (b[k] >> 4) as f32);
            ([a(2 * j), a(2 * j + 1)], [m(2 * j), m(2 * j + 1)])
        }
        QKind::Q3_K => {
            let d = f16_at(b, 108);
            let sc = &b[96..108];
            let s = |k: usize| {
                let lo = (sc[k % 8] >> (4 * (k / 8))) & 0x0f;
                let hi = (sc[8 + k % 4] >> (2 * (k / 4))) & 0x03;
                d * ((lo | (hi << 4)) as i32 - 32) as f32
            };
            ([s(2 * j), s(2 * j + 1)], [0.0; 2])
        }
    }
}

/// Group `g`'s 32 integers `q` in element order, as 32 signed bytes. `BW`: the CPU has
/// AVX-512BW and VL, whose byte masks set a bit-plane's bits in one instruction each; without
/// them the bits are spread with compares.
///
/// # Safety
/// As [`locate`]; the CPU has AVX2, and AVX-512BW and VL where `BW`. Always inlined, so that it compiles
/// with its caller's features (the callers enable them); a call per group would cost more
/// than the group's arithmetic.
#[inline(always)]
pub(crate) unsafe fn ints<const BW: bool>(kind: QKind, row: &[u8], g: usize) -> __m256i {
    let (b, j) = locate(kind, row, g);
    let p = b.as_ptr();
    // SAFETY (loads): every offset below lies within the block (sizes from `GgmlType::block`).
    let load16 = |at: usize| {
        debug_assert!(at + 16 <= b.len());
        _mm_loadu_si128(p.add(at) as *const __m128i)
    };
    let load32 = |at: usize| {
        debug_assert!(at + 32 <= b.len());
        _mm256_loadu_si256(p.add(at) as *const __m256i)
    };
    let byte = |k: u8| _mm256_set1_epi8(k as i8);
    // Bits `shift..` of every byte, under `mask`.
    let bits = |v: __m256i, shift: usize, mask: u8| {
        _mm256_and_si256(
            _mm256_srl_epi16(v, _mm_cvtsi32_si128(shift as i32)),
            byte(mask),
        )
    };
    // The 16 nibble pairs at `at` as 32 values: low nibbles, then high ones.
    let nibbles = |at: usize| {
        let qs = load16(at);
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(qs), qs), byte(0x0f))
    };
    // `v + add` in the bytes whose `bits` bit is set: a 32-bit plane (Q5_0/Q5_1: bit i is
    // element i's) or bit `j` of each of 32 bytes (the K-quants').
    let plane_add = |v: __m256i, bits: u32, add: i8| {
        if BW {
            _mm256_mask_add_epi8(v, bits, v, _mm256_set1_epi8(add))
        } else {
            // Byte i takes byte i / 8 of the plane, then its bit i % 8.
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(bits as i32),
                _mm256_set_epi64x(
                    0x0303030303030303,
                    0x0202020202020202,
                    0x0101010101010101,
                    0,
                ),
            );
            let m = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, m), m);
            _mm256_add_epi8(v, _mm256_and_si256(set, _mm256_set1_epi8(add)))
        }
    };
    let byte_bit = |v: __m256i, plane: __m256i, add: i8| {
        let m = byte(1 << j);
        if BW {
            _mm256_mask_add_epi8(v, _mm256_test_epi8_mask(plane, m), v, _mm256_set1_epi8(add))
        } else {
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(plane, m), m);
            _mm256_add_epi8(v, _mm256_and_si256(set, _mm256_set1_epi8(add)))
        }
    };
    let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    match kind {
        QKind::Q4_0 => _mm256_sub_epi8(nibbles(2), byte(8)),
        QKind::Q4_1 => nibbles(4),
        // The fifth bit adds 16; Q5_0 is centred on 16.
        QKind::Q5_0 => plane_add(_mm256_sub_epi8(nibbles(6), byte(16)), u32_at(2), 16),
        QKind::Q5_1 => plane_add(nibbles(8), u32_at(4), 16),
        QKind::Q8_0 => load32(2),
        QKind::Q4_K => bits(load32(16 + (j / 2) * 32), 4 * (j % 2), 0x0f),
        QKind::Q5_K => {
            let low = bits(load32(48 + (j / 2) * 32), 4 * (j % 2), 0x0f);
            byte_bit(low, load32(16), 16)
        }
        QKind::Q6_K => {
            let (t, r) = (j / 4, j % 4);
            let low = bits(load32(t * 64 + (j % 2) * 32), 4 * (r / 2), 0x0f);
            let high = _mm256_slli_epi16::<4>(bits(load32(128 + t * 32), 2 * r, 0x03));
            _mm256_sub_epi8(_mm256_or_si256(low, high), byte(32))
        }
        QKind::Q2_K => bits(load32(16 + (j / 4) * 32), 2 * (j % 4), 0x03),
        // A clear mask bit subtracts 4: subtract 4 everywhere, add it back where set.
        QKind::Q3_K => {
            let low = bits(load32(32 + (j / 4) * 32), 2 * (j % 4), 0x03);
            byte_bit(_mm256_sub_epi8(low, byte(4)), load32(0), 4)
        }
    }
}

/// Group `g`'s 32 integers as two 16-lane f32 vectors (values 0..16 and 16..32). Q4_0, Q4_1
/// and Q8_0 widen straight from the block (a 4-bit pair's byte holds values i and i + 16, so
/// one zero-extension serves both halves): about half the operations of widening [`ints`],
/// which the other types take. Decode steps of a model that fits in the last-level cache are
/// bound by these operations, not by memory.
///
/// # Safety
/// As [`locate`]; the CPU has AVX-512F/BW/VL (inlined as [`ints`] is).
#[inline(always)]
pub(crate) unsafe fn floats16(kind: QKind, row: &[u8], g: usize) -> (__m512, __m512) {
    let (b, _) = locate(kind, row, g);
    // SAFETY (loads): 16 bytes at offset 2 or 4 (Q4_0/Q4_1, 18/20-byte blocks), 2 or 18
    // (Q8_0, 34-byte blocks) lie within the block.
    let load16 = |at: usize| {
        debug_assert!(at + 16 <= b.len());
        _mm_loadu_si128(b.as_ptr().add(at) as *const __m128i)
    };
    let f = |v: __m512i| _mm512_cvtepi32_ps(v);
    match kind {
        QKind::Q4_0 | QKind::Q4_1 => {
            let v = _mm512_cvtepu8_epi32(load16(if kind == QKind::Q4_0 { 2 } else { 4 }));
            let (lo, hi) = (
                _mm512_and_si512(v, _mm512_set1_epi32(0x0f)),
                _mm512_srli_epi32::<4>(v),
            );
            if kind == QKind::Q4_0 {
                let eight = _mm512_set1_epi32(8);
                (
                    f(_mm512_sub_epi32(lo, eight)),
                    f(_mm512_sub_epi32(hi, eight)),
                )
            } else {
                (f(lo), f(hi))
            }
        }
        QKind::Q8_0 => (
            f(_mm512_cvtepi8_epi32(load16(2))),
            f(_mm512_cvtepi8_epi32(load16(18))),
        ),
        _ => {
            let q = ints::<true>(kind, row, g);
            (
                f(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))),
                f(_mm512_cvtepi8_epi32(_mm256_extracti128_si256::<1>(q))),
            )
        }
    }
}

/// Group `g`'s 32 weights as two 16-lane f32 vectors (values 0..16 and 16..32), for Q4_0
/// and Q4_1 only. The 16 weights a 4-bit value can stand for are built once per group in one
/// register, each computed as the hub dequantizes (`a * (q - 8)`, or `a * q + m`), and every
/// value picks its weight with a permute, which reads only the low four bits of its lane: the
/// nibbles need no mask and no conversion to float. Per group that is 6 vector operations
/// where widening and scaling each half takes 10.
///
/// # Safety
/// As [`locate`]; the CPU has AVX-512F and F16C (inlined as [`ints`] is).
#[inline(always)]
pub(crate) unsafe fn weights16_by_table(kind: QKind, row: &[u8], g: usize) -> (__m512, __m512) {
    debug_assert!(matches!(kind, QKind::Q4_0 | QKind::Q4_1));
    let (b, _) = locate(kind, row, g);
    let at = if kind == QKind::Q4_0 { 2 } else { 4 };
    debug_assert!(at + 16 <= b.len());
    // SAFETY: 16 bytes at offset 2 (18-byte Q4_0 blocks) or 4 (20-byte Q4_1 blocks).
    let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.as_ptr().add(at) as *const __m128i));
    let (a, m) = scales(kind, row, g);
    let q = if kind == QKind::Q4_0 {
        _mm512_setr_ps(
            -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0,
        )
    } else {
        _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        )
    };
    let mut table = _mm512_mul_ps(_mm512_set1_ps(a[0]), q);
    if kind.has_min() {
        table = _mm512_add_ps(table, _mm512_set1_ps(m[0]));
    }
    (
        _mm512_permutexvar_ps(v, table),
        _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v), table),
    )
}

/// Group `g`'s 32 weights as four 8-lane vectors.
///
/// # Safety
/// The CPU has AVX2 and F16C (inlined as [`ints`] is).
#[inline(always)]
pub(crate) unsafe fn weights8(kind: QKind, row: &[u8], g: usize) -> [__m256; 4] {
    let q = ints::<false>(kind, row, g);
    let (a, m) = scales(kind, row, g);
    let halves = [_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q)];
    let w = |i: usize| {
        let h = i / 2;
        let v = if i.is_multiple_of(2) {
            halves[h]
        } else {
            _mm_srli_si128::<8>(halves[h])
        };
        let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        let p = _mm256_mul_ps(_mm256_set1_ps(a[h]), f);
        if kind.has_min() {
            _mm256_add_ps(p, _mm256_set1_ps(m[h]))
        } else {
            p
        }
    };
    [w(0), w(1), w(2), w(3)]
}

/// Prefetches the weights 4 KiB past group `g` of `row` (rows further on): the hardware
/// prefetcher alone left a tenth of a decode step idle, and 1 KiB ahead still left the
/// widening waiting on its loads (SmolLM2 Q4_1 decode 122 -> 140-150 tok/s, Gemma 3 Q4_K_M
/// 51 -> 59-61; 8 KiB ahead was slower again).
#[inline(always)]
pub(crate) unsafe fn prefetch_ahead(kind: QKind, row: &[u8], g: usize) {
    _mm_prefetch::<_MM_HINT_T0>(
        row.as_ptr()
            .wrapping_add(g * kind.block_bytes() * GROUP / kind.block_len() + 4096)
            as *const i8,
    );
}
