//! Dense products `a [m, k] @ b [n, k]ᵀ` on AMX tiles, for bf16 and f32 operands.
//!
//! The tile unit multiplies bf16 pairs and sums in f32 (`tdpbf16ps`): bf16 × bf16 products
//! are exact in f32, so for bf16 operands it computes what PyTorch's oneDNN kernels compute.
//! An f32 operand enters as three bf16 parts that sum to it exactly (8 significant bits
//! each, rounded to nearest, so the second is at most 2⁻⁸ of the value and the third 2⁻¹⁶).
//! Of the nine part products of two f32 values the six above 2⁻²⁴ of the product are
//! summed (parts `i + j ≤ 2`); the three left out come to about one f32 rounding of the
//! product, so the result is an f32 dot product to rounding (tested against serial f32
//! sums). Six tile products per value pair still beat AVX-512 f32 FMAs from 128 rows
//! (measured 1.15–1.35x on FLUX.1 and SmolLM2 shapes); bf16 operands run at 1.1–1.5
//! TFLOP/s on two cores.
//!
//! Blocking: the activation is copied into 1 KiB tiles (tile rows read at a row stride
//! that is a multiple of 2 KiB all fall in two L1 sets). A unit packs the weights of a
//! group of 32-column panels into a thread-local buffer that stays in L2 (in k blocks
//! where one panel would not fit), then passes 32-row blocks of the activation over it.
//! Within a row block, k is cut into slices whose activation tiles stay in L1 while every
//! panel of the group multiplies them; a panel's 32 × 32 sums live in four tiles over a
//! slice and in a small buffer between slices. With four tiles of sums only four remain
//! for operands and tiles are not renamed, so each load is placed right after the last
//! product that reads the tile it replaces.

use std::cell::RefCell;

use crate::cpu::features;
use crate::cpu::kernels::{par_units, pool_threads, OutPtr};
use crate::cpu::x86::amx::{aligned_uninit, Aligned, TileConfig};
use crate::cpu::x86::avx512::transpose16;

/// Rows per tile.
const TR: usize = 16;
/// k values per tile row (32 bf16 = 64 bytes).
const KT: usize = 32;
/// Output columns per panel (two column tiles) and rows per row block (two row tiles).
const PANEL: usize = 32;
/// u32 pairs in one weight tile (16 pair rows × 16 columns).
const TILE_U32: usize = TR * 16;
/// Bytes of packed weights a unit keeps (in L2) while its row blocks pass.
const GROUP_BYTES: usize = 1 << 20;
/// Most panels per group.
const MAX_GROUP: usize = 16;
/// Fewest rows for which f32 operands take the tile unit: below, packing the weight's three
/// parts per call costs more than the products save (measured: even at 64 rows, ahead from
/// 128).
pub(crate) const F32_MIN_ROWS: usize = 128;
/// Fewest weight values for which f32 operands take the tile unit: a smaller weight has too
/// few panels to hide the splitting and the second parallel pass (measured at 256 × 256 and
/// 576 × 192: 4–7% behind the f32 kernel; from 256 × 1024 on, 6–31% ahead).
pub(crate) const F32_MIN_WEIGHT: usize = 1 << 18;
/// Activation bytes per k slice (in L1 while the group's panels multiply it).
const SLICE_BYTES: usize = 16 << 10;

/// A product's operand: bf16 bit patterns, or f32 values (split into three parts).
#[derive(Clone, Copy)]
pub(crate) enum Operand<'a> {
    Bf16(&'a [u16]),
    F32(&'a [f32]),
}

impl Operand<'_> {
    fn len(&self) -> usize {
        match self {
            Operand::Bf16(v) => v.len(),
            Operand::F32(v) => v.len(),
        }
    }

    /// bf16 parts per value.
    fn parts(&self) -> usize {
        match self {
            Operand::Bf16(_) => 1,
            Operand::F32(_) => 3,
        }
    }
}

/// The f32 sums of `a [m, k] @ b [n, k]ᵀ` on the tile unit, or `None` where it does not
/// apply: no AMX, `k` not a multiple of 32, fewer than 32 rows, or an f32 operand holding a
/// value the parts cannot carry (infinite, NaN, or rounding to infinity in bf16), where the
/// caller's f32 kernel keeps IEEE semantics.
pub(crate) fn matmul_wt(a: Operand, b: Operand, m: usize, k: usize, n: usize) -> Option<Vec<f32>> {
    if m < PANEL || k == 0 || !k.is_multiple_of(KT) || n == 0 || !features::amx() {
        return None;
    }
    if a.len() < m * k || b.len() < n * k {
        return None;
    }
    let (pa, pb) = (a.parts(), b.parts());
    let terms: Vec<(usize, usize)> = (0..pa)
        .flat_map(|i| (0..pb).map(move |j| (i, j)))
        .filter(|(i, j)| i + j <= 2)
        .collect();
    let planes = Planes::split(a, m, k)?;
    let kc = k / KT;
    let panels = n.div_ceil(PANEL);
    let row_blocks = m.div_ceil(PANEL);
    // Panels per group: as many as GROUP_BYTES holds (up to MAX_GROUP), fewer where the
    // threads would otherwise lack units; then the row blocks split where still lacking.
    let panel_bytes = kc * pb * 2 * TILE_U32 * 4;
    let want = 4 * pool_threads();
    let mut group = (GROUP_BYTES / panel_bytes).clamp(1, MAX_GROUP);
    if panels.div_ceil(group) < want {
        group = panels.div_ceil(want).max(1);
    }
    let groups = panels.div_ceil(group);
    let chunks = if groups >= want {
        1
    } else {
        want.div_ceil(groups).min(row_blocks)
    };
    let chunk_blocks = row_blocks.div_ceil(chunks);
    let chunks = row_blocks.div_ceil(chunk_blocks);
    // k chunks per k block: all of k unless one panel outgrows GROUP_BYTES.
    let kb = (GROUP_BYTES / (group * pb * 2 * TILE_U32 * 4)).clamp(1, kc);
    let slice = (SLICE_BYTES / (pa * PANEL * KT * 2)).max(1);
    let mut c: Vec<f32> = Vec::with_capacity(m * n);
    let out = OutPtr(c.as_mut_ptr());
    let bad = std::sync::atomic::AtomicBool::new(false);
    par_units(groups * chunks, |u| {
        let (g, ch) = (u / chunks, u % chunks);
        let first = g * group;
        let count = group.min(panels - first);
        let rbs = ch * chunk_blocks..((ch + 1) * chunk_blocks).min(row_blocks);
        PACKED.with(|buf| {
            let mut buf = buf.borrow_mut();
            let len = count * kb * pb * 2 * TILE_U32;
            if buf.0.len() < buf.1 + len {
                *buf = aligned_vec(len);
            }
            let at = buf.1;
            let mut c0 = 0;
            while c0 < kc {
                let c1 = (c0 + kb).min(kc);
                let dst = &mut buf.0[at..at + len];
                // SAFETY: AVX-512F and BW are part of `available`; `dst` holds count panels
                // of kb chunks.
                if !unsafe { pack(b, (k, n), first..first + count, pb, c0..c1, dst) } {
                    bad.store(true, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
                let unit = Unit {
                    planes: &planes,
                    terms: &terms,
                    packed: dst,
                    panels: count,
                    pb,
                    chunks: c0..c1,
                    kc,
                    slice,
                };
                // SAFETY: the tile state and AVX-512 were checked by `available`; the unit
                // writes only rows of its row blocks in its group's columns of c.
                unsafe { unit.run(rbs.clone(), m, n, out.get(), first * PANEL) };
                c0 = c1;
            }
        });
    });
    if bad.into_inner() {
        return None;
    }
    // SAFETY: the units wrote every row below m of every column.
    unsafe { c.set_len(m * n) };
    Some(c)
}

thread_local! {
    /// Per-thread packed weight panels (from a 64-byte boundary at `.1`), reused across calls.
    static PACKED: RefCell<(Vec<u32>, usize)> = const { RefCell::new((Vec::new(), 0)) };
}

/// A zeroed vector with `len` values from a 64-byte boundary, and that boundary's index.
fn aligned_vec(len: usize) -> (Vec<u32>, usize) {
    let (mut v, at) = aligned_uninit::<u32>(len);
    v.resize(v.capacity(), 0);
    (v, at)
}

/// The activation as the tiles read it: its bf16 values, or an f32 value's three bf16
/// parts, laid out `[m / 32][k / 32][parts][32 rows][32]` from a 64-byte boundary (rows
/// past m zero), so every tile is 1 KiB in one piece. Tile rows read at the activation's
/// own row stride conflict in L1 whenever that stride is a multiple of 2 KiB (k = 3072:
/// a row block's rows fall in two cache sets), and straddle cache lines when unaligned.
struct Planes {
    v: Vec<u16>,
    at: usize,
    parts: usize,
    kc: usize,
}

/// u16 values of one part of a row block's 32-value chunk.
const CHUNK_U16: usize = PANEL * KT;

impl Planes {
    /// `a`'s planes, or `None` for an f32 value the parts cannot carry.
    fn split(a: Operand, m: usize, k: usize) -> Option<Planes> {
        let blocks = m.div_ceil(PANEL);
        let (parts, kc) = (a.parts(), k / KT);
        let block = kc * parts * CHUNK_U16;
        let (mut v, at) = aligned_uninit::<u16>(blocks * block);
        // SAFETY: `aligned_uninit` reserved at + blocks * block values.
        let base = OutPtr(unsafe { v.as_mut_ptr().add(at) });
        let bad = std::sync::atomic::AtomicBool::new(false);
        par_units(blocks, |b| {
            // SAFETY: each row block writes its own values.
            let dst = unsafe { base.part(b * block, block) };
            for r in 0..PANEL {
                let Some(src) = a_row(a, b * PANEL + r, m, k) else {
                    for ch in 0..kc * parts {
                        dst[ch * CHUNK_U16 + r * KT..][..KT].fill(0);
                    }
                    continue;
                };
                // SAFETY: AVX-512F and BW are part of `available`; the row holds k values.
                if !unsafe { split_row(src, parts, &mut dst[r * KT..]) } {
                    bad.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        // SAFETY: the row blocks wrote every value, `aligned_uninit` the padding.
        unsafe { v.set_len(v.capacity()) };
        let planes = Planes { v, at, parts, kc };
        (!bad.into_inner()).then_some(planes)
    }

    /// The first of the two row tiles of row block `rb`, chunk `ch`, part `p`.
    fn tile(&self, rb: usize, ch: usize, p: usize) -> *const u16 {
        self.v[self.at + ((rb * self.kc + ch) * self.parts + p) * CHUNK_U16..].as_ptr()
    }
}

/// Row `r` of the activation `[m, k]`, `None` past m.
fn a_row<'a>(a: Operand<'a>, r: usize, m: usize, k: usize) -> Option<Operand<'a>> {
    (r < m).then(|| match a {
        Operand::Bf16(s) => Operand::Bf16(&s[r * k..][..k]),
        Operand::F32(s) => Operand::F32(&s[r * k..][..k]),
    })
}

/// Rounds each f32 lane to the nearest bf16 (ties to even): the f32 whose high half is it.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn round_bf16(v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let b = _mm512_castps_si512(v);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    let b = _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    _mm512_castsi512_ps(_mm512_and_si512(
        b,
        _mm512_set1_epi32(0xffff_0000u32 as i32),
    ))
}

/// Whether every lane of the rounded first part is finite (so the value is, and its parts
/// sum to it).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn finite(hi: std::arch::x86_64::__m512) -> bool {
    use std::arch::x86_64::*;
    let exp = _mm512_and_si512(_mm512_castps_si512(hi), _mm512_set1_epi32(0x7f80_0000));
    _mm512_cmpeq_epi32_mask(exp, _mm512_set1_epi32(0x7f80_0000)) == 0
}

/// One activation row into its row block (`dst` from the row's first value): each 32
/// values of part `p` at `(chunk * parts + p) * CHUNK_U16`. False for an f32 value that
/// cannot be split.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn split_row(row: Operand, parts: usize, dst: &mut [u16]) -> bool {
    use std::arch::x86_64::*;
    let mut ok = true;
    let o = dst.as_mut_ptr();
    match row {
        Operand::Bf16(s) => {
            for (ch, x) in s.chunks_exact(KT).enumerate() {
                let v = _mm512_loadu_si512(x.as_ptr().cast());
                _mm512_storeu_si512(o.add(ch * CHUNK_U16).cast(), v);
            }
        }
        Operand::F32(s) => {
            for (i, x) in s.chunks_exact(16).enumerate() {
                let mut v = _mm512_loadu_ps(x.as_ptr());
                let at = (i / 2 * parts) * CHUNK_U16 + i % 2 * 16;
                for p in 0..parts {
                    let hi = round_bf16(v);
                    if p == 0 {
                        ok &= finite(hi);
                    }
                    v = _mm512_sub_ps(v, hi);
                    let bits = _mm512_srli_epi32::<16>(_mm512_castps_si512(hi));
                    let half = _mm512_cvtepi32_epi16(bits);
                    _mm256_storeu_si256(o.add(at + p * CHUNK_U16).cast(), half);
                }
            }
        }
    }
    ok
}

/// Packs the k chunks `chunks` of the panels `panels` of `b [n, k]` into `dst`, each panel
/// `[chunks][pb][2][16 pair rows][16 columns]` u32 (the k values `2p` and `2p + 1` of a
/// column in one u32, the lower in the low half; columns past n zero). False for an f32
/// value that cannot be split.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pack(
    b: Operand,
    (k, n): (usize, usize),
    panels: std::ops::Range<usize>,
    pb: usize,
    chunks: std::ops::Range<usize>,
    dst: &mut [u32],
) -> bool {
    let (first, count) = (panels.start, panels.len());
    use std::arch::x86_64::*;
    let kc = chunks.len();
    // Lanes 0..16 of the even and the odd k values of two 16-value registers.
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    let mut ok = true;
    let o = dst.as_mut_ptr();
    for j in 0..count {
        let panel = o.add(j * kc * pb * 2 * TILE_U32);
        for t in 0..2 {
            let row0 = (first + j) * PANEL + t * TR;
            for (ch, chunk) in chunks.clone().enumerate() {
                let mut r = [[_mm512_setzero_si512(); 16]; 3];
                for c in 0..TR.min(n.saturating_sub(row0)) {
                    let at = (row0 + c) * k + chunk * KT;
                    match b {
                        Operand::Bf16(s) => r[0][c] = _mm512_loadu_si512(s.as_ptr().add(at).cast()),
                        Operand::F32(s) => {
                            let mut v0 = _mm512_loadu_ps(s.as_ptr().add(at));
                            let mut v1 = _mm512_loadu_ps(s.as_ptr().add(at + 16));
                            for (p, part) in r.iter_mut().enumerate() {
                                let (h0, h1) = (round_bf16(v0), round_bf16(v1));
                                if p == 0 {
                                    ok &= finite(h0) & finite(h1);
                                }
                                v0 = _mm512_sub_ps(v0, h0);
                                v1 = _mm512_sub_ps(v1, h1);
                                let (h0, h1) = (_mm512_castps_si512(h0), _mm512_castps_si512(h1));
                                let lo = _mm512_permutex2var_epi32(h0, even, h1);
                                let up = _mm512_permutex2var_epi32(h0, odd, h1);
                                part[c] = _mm512_or_si512(_mm512_srli_epi32::<16>(lo), up);
                            }
                        }
                    }
                }
                for (p, regs) in r.iter_mut().take(pb).enumerate() {
                    transpose16(regs);
                    let tile = panel.add(((ch * pb + p) * 2 + t) * TILE_U32);
                    for (row, v) in regs.iter().enumerate() {
                        _mm512_store_si512(tile.add(row * 16).cast(), *v);
                    }
                }
            }
        }
    }
    ok
}

/// One unit's view: the activation, one k block of its group's panels.
struct Unit<'a> {
    planes: &'a Planes,
    /// (activation part, weight part) products summed, grouped by activation part.
    terms: &'a [(usize, usize)],
    packed: &'a [u32],
    panels: usize,
    pb: usize,
    /// The k chunks packed, of `kc` in all.
    chunks: std::ops::Range<usize>,
    kc: usize,
    /// k chunks per slice.
    slice: usize,
}

thread_local! {
    /// Per-thread sums of a unit's 32 × 32 blocks between k slices.
    static SUMS: RefCell<Vec<Aligned<[f32; PANEL * PANEL]>>> = const { RefCell::new(Vec::new()) };
}

impl Unit<'_> {
    /// Adds this k block's products for row blocks `rbs` and the group's panels to their
    /// sums; the last k block writes them into `c` (row stride `n`) from column `col0`,
    /// rows at or past `m` and columns at or past `n` left out.
    #[target_feature(enable = "avx512f")]
    unsafe fn run(
        &self,
        rbs: std::ops::Range<usize>,
        m: usize,
        n: usize,
        c: *mut f32,
        col0: usize,
    ) {
        use std::arch::asm;
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        TileConfig::load_16x64();
        let panel_len = self.chunks.len() * self.pb * 2 * TILE_U32;
        let last = self.chunks.end == self.kc;
        SUMS.with(|s| {
            let mut s = s.borrow_mut();
            // Sums outlive a row block only when k comes in several blocks.
            let kept = if self.chunks.len() == self.kc {
                1
            } else {
                rbs.len()
            };
            if s.len() < kept * self.panels {
                s.resize_with(kept * self.panels, || Aligned([0.0; PANEL * PANEL]));
            }
            for (bi, rb) in rbs.enumerate() {
                let sums = &mut s[bi % kept * self.panels..][..self.panels];
                let mut c0 = self.chunks.start;
                while c0 < self.chunks.end {
                    let c1 = (c0 + self.slice).min(self.chunks.end);
                    for (j, sum) in sums.iter_mut().enumerate() {
                        let acc = sum.0.as_mut_ptr();
                        if c0 == 0 {
                            asm!(
                                "tilezero tmm0",
                                "tilezero tmm1",
                                "tilezero tmm2",
                                "tilezero tmm3",
                                options(nostack, nomem)
                            );
                        } else {
                            asm!(
                                "tileloadd tmm0, [{p} + {s}]",
                                "tileloadd tmm1, [{p} + {s} + 64]",
                                "tileloadd tmm2, [{q} + {s}]",
                                "tileloadd tmm3, [{q} + {s} + 64]",
                                p = in(reg) acc,
                                q = in(reg) acc.add(TR * PANEL),
                                s = in(reg) PANEL * 4,
                                options(nostack, readonly),
                            );
                        }
                        let panel = self.packed.as_ptr().add(j * panel_len);
                        for ch in c0..c1 {
                            let mut part = usize::MAX;
                            let at = (ch - self.chunks.start) * self.pb;
                            for &(i, p) in self.terms {
                                let w = panel.add((at + p) * 2 * TILE_U32);
                                // The next two weight tiles, from L2 (measured 5% faster).
                                let next = w.add(2 * TILE_U32).cast::<i8>();
                                for line in 0..2 * TILE_U32 * 4 / 64 {
                                    _mm_prefetch::<_MM_HINT_T0>(next.add(line * 64));
                                }
                                // Each load is issued as soon as the products that read its
                                // tile before are: tiles are not renamed.
                                if i != part {
                                    part = i;
                                    asm!(
                                        "tileloadd tmm4, [{a} + {s}]",
                                        "tileloadd tmm6, [{w} + {s}]",
                                        "tdpbf16ps tmm0, tmm4, tmm6",
                                        "tileloadd tmm7, [{w} + {s} + 1024]",
                                        "tdpbf16ps tmm1, tmm4, tmm7",
                                        "tileloadd tmm5, [{a} + {s} + 1024]",
                                        "tdpbf16ps tmm2, tmm5, tmm6",
                                        "tdpbf16ps tmm3, tmm5, tmm7",
                                        a = in(reg) self.planes.tile(rb, ch, i),
                                        w = in(reg) w,
                                        s = in(reg) 64usize,
                                        options(nostack, readonly),
                                    );
                                } else {
                                    asm!(
                                        "tileloadd tmm6, [{w} + {s}]",
                                        "tdpbf16ps tmm0, tmm4, tmm6",
                                        "tdpbf16ps tmm2, tmm5, tmm6",
                                        "tileloadd tmm7, [{w} + {s} + 1024]",
                                        "tdpbf16ps tmm1, tmm4, tmm7",
                                        "tdpbf16ps tmm3, tmm5, tmm7",
                                        w = in(reg) w,
                                        s = in(reg) 64usize,
                                        options(nostack, readonly),
                                    );
                                }
                            }
                        }
                        // The last slice of a whole 32 × 32 block stores straight into c.
                        let col = col0 + j * PANEL;
                        let whole = c1 == self.kc && (rb + 1) * PANEL <= m && col + PANEL <= n;
                        let (dst, ld) = if whole {
                            (c.add(rb * PANEL * n + col), n)
                        } else {
                            (acc, PANEL)
                        };
                        asm!(
                            "tilestored [{p} + {s}], tmm0",
                            "tilestored [{p} + {s} + 64], tmm1",
                            "tilestored [{q} + {s}], tmm2",
                            "tilestored [{q} + {s} + 64], tmm3",
                            p = in(reg) dst,
                            q = in(reg) dst.add(TR * ld),
                            s = in(reg) ld * 4,
                            options(nostack),
                        );
                    }
                    c0 = c1;
                }
                if !last {
                    continue;
                }
                let rows = PANEL.min(m - rb * PANEL);
                for (j, sum) in sums.iter().enumerate() {
                    let col = col0 + j * PANEL;
                    let cols = PANEL.min(n - col);
                    if rows == PANEL && cols == PANEL {
                        continue;
                    }
                    for r in 0..rows {
                        std::ptr::copy_nonoverlapping(
                            sum.0.as_ptr().add(r * PANEL),
                            c.add((rb * PANEL + r) * n + col),
                            cols,
                        );
                    }
                }
            }
        });
        asm!("tilerelease", options(nostack, nomem));
    }
}

#[cfg(test)]
mod tests {
    use super::{matmul_wt, Operand};
    use crate::cpu::features;

    /// Deterministic values of both signs over several binades.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (s >> 40) as f32 / (1u64 << 24) as f32;
                (u - 0.5) * (1.0 + 7.0 * u * u)
            })
            .collect()
    }

    /// The largest error of `c` against the exact products, each relative to `Σ |a·b|` of
    /// its dot product.
    fn worst(c: &[f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) -> f64 {
        let mut worst = 0f64;
        for i in 0..m {
            for j in 0..n {
                let (ar, br) = (&a[i * k..][..k], &b[j * k..][..k]);
                let exact: f64 = ar.iter().zip(br).map(|(x, y)| *x as f64 * *y as f64).sum();
                let size: f64 = ar
                    .iter()
                    .zip(br)
                    .map(|(x, y)| (*x as f64 * *y as f64).abs())
                    .sum();
                worst = worst.max((c[i * n + j] as f64 - exact).abs() / size);
            }
        }
        worst
    }

    #[test]
    fn f32_products_are_as_accurate_as_f32_dot_products() {
        crate::cpu::features::each_tier(|_tier| {
            // Short row blocks and panels, several k chunks, and a k whose three-part panel
            // outgrows a group's buffer (two k blocks).
            for (m, k, n) in [(32, 32, 1), (33, 64, 40), (130, 96, 64), (45, 5632, 33)] {
                let (a, b) = (values(m * k, 1), values(n * k, 2));
                let got = matmul_wt(Operand::F32(&a), Operand::F32(&b), m, k, n);
                assert_eq!(
                    got.is_some(),
                    features::amx(),
                    "the tile unit runs where it exists"
                );
                let Some(c) = got else { continue };
                // The same products summed one after another in f32.
                let serial: Vec<f32> = (0..m * n)
                    .map(|ij| {
                        let (ar, br) = (&a[ij / n * k..][..k], &b[ij % n * k..][..k]);
                        ar.iter().zip(br).fold(0f32, |s, (x, y)| x.mul_add(*y, s))
                    })
                    .collect();
                let (tiles, f32_sum) = (
                    worst(&c, &a, &b, (m, k, n)),
                    worst(&serial, &a, &b, (m, k, n)),
                );
                assert!(
                    tiles <= 2.0 * f32_sum.max(f32::EPSILON as f64 / 2.0),
                    "{m}x{k}x{n}: error {tiles:.2e} of the sizes, serial f32 {f32_sum:.2e}"
                );
            }
        });
    }

    #[test]
    fn bf16_products_sum_exact_products_in_f32() {
        crate::cpu::features::each_tier(|_tier| {
            let (m, k, n) = (70, 160, 50);
            let bits = |v: Vec<f32>| {
                v.iter()
                    .map(|x| (x.to_bits() >> 16) as u16)
                    .collect::<Vec<_>>()
            };
            let (a, b) = (bits(values(m * k, 3)), bits(values(n * k, 4)));
            let got = matmul_wt(Operand::Bf16(&a), Operand::Bf16(&b), m, k, n);
            assert_eq!(got.is_some(), features::amx());
            let Some(c) = got else { return };
            let wide = |v: &[u16]| {
                v.iter()
                    .map(|h| f32::from_bits(u32::from(*h) << 16))
                    .collect::<Vec<_>>()
            };
            let tiles = worst(&c, &wide(&a), &wide(&b), (m, k, n));
            assert!(
                tiles <= 4.0 * f32::EPSILON as f64,
                "error {tiles:.2e} of the sizes"
            );
        });
    }

    #[test]
    fn f32_values_the_parts_cannot_carry_are_declined() {
        crate::cpu::features::each_tier(|_tier| {
            let (m, k, n) = (32, 32, 8);
            let (a, b) = (values(m * k, 5), values(n * k, 6));
            for (at, v) in [(7, f32::INFINITY), (100, f32::NAN), (3, f32::MAX)] {
                let mut bad = a.clone();
                bad[at] = v;
                assert!(
                    matmul_wt(Operand::F32(&bad), Operand::F32(&b), m, k, n).is_none(),
                    "{v} in a"
                );
                let mut bad = b.clone();
                bad[at] = v;
                assert!(
                    matmul_wt(Operand::F32(&a), Operand::F32(&bad), m, k, n).is_none(),
                    "{v} in b"
                );
            }
            let mut big = a.clone();
            big[0] = 1e38;
            let taken = matmul_wt(Operand::F32(&big), Operand::F32(&b), m, k, n);
            assert_eq!(
                taken.is_some(),
                features::amx(),
                "a large finite value is carried"
            );
        });
    }
}
