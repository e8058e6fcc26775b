//! Products of many activation rows with GGUF block weights on AMX tiles, with f32 results,
//! and what every AMX kernel shares (the tile configuration); the dense bf16
//! and f32 products are in `amx_gemm`.
//!
//! A prefill multiplies hundreds of rows by every weight; on CPUs with AMX (Intel Sapphire
//! Rapids and later) the tile unit does bf16 dot products at many times the rate of AVX-512
//! f32 FMAs. It stays f32 arithmetic because both operands are split exactly:
//! - a block's quantized values are small integers (Q4_0: -8..7, Q4_1: 0..15, Q8_0:
//!   -128..127), each exact in bf16;
//! - an f32 activation is the sum of three bf16 parts (8 significant bits each, 24 in all),
//!   so every part × quantized value product is exact, and the tile unit sums them in f32.
//!
//! Each 32-value block's sum `Σ x·q` is then scaled in f32: `d · Σ x·q (+ m · Σ x)`, the same
//! real number as `Σ x · (d·q + m)` over the dequantized weights, rounded in another order.
//! Below the AMX tier (`features`) the block kernels of `quant.rs` run instead. x86-64
//! only.
//!
//! Layout: one row tile against three column tiles (16 × 48 outputs in tmm0..tmm2, the
//! block's weights in tmm3..tmm5, activation parts in tmm6/tmm7). Tile loads and stores,
//! not the dot products, bound this kernel (measured: a 1 KiB tile load costs several
//! products' time), so each loaded activation tile feeds three products and each block's
//! weight tiles serve a whole row block. An activation is split once for all the weights
//! that take it ([`Split`]).

use crate::cpu::features;
use crate::cpu::kernels::{par_units, OutPtr};

/// Values per GGUF block, and k values per tile row (32 bf16 = 64 bytes).
pub(crate) const BLOCK: usize = 32;
/// Output columns per task group: three 16-column tiles.
pub(crate) const GROUP: usize = 48;
/// Column tiles per group.
const CT: usize = GROUP / 16;
/// Rows per tile.
const TR: usize = 16;
/// bf16 parts per activation.
const PARTS: usize = 3;
/// u16 values in one tile (16 rows × 32 bf16).
const TILE_U16: usize = TR * BLOCK;
/// Row tiles per row block: a block's packed activation (at most a few hundred KiB) stays
/// in L2 while every weight panel passes over it.
const BLOCK_TILES: usize = 8;
/// The most bytes of unpacked panels a product over several row blocks keeps at once (a
/// whole unpacked weight would be 2 bytes per value: 56 MiB for SmolLM2's tied `lm_head`).
/// Small in tests, so that their weights span several chunks.
const CHUNK_BYTES: usize = if cfg!(test) { 32 << 10 } else { 8 << 20 };

/// The weights of [`GROUP`] output columns as the tiles read them, filled by the caller
/// (columns past the weight's last as zeros).
pub(crate) struct Panel<'a> {
    /// Quantized values as bf16 bit patterns, two consecutive k values per u32 (low half
    /// first), laid out `[k / 2][GROUP]`: `pairs[(kk / 2) * GROUP + c]` holds column `c`'s
    /// values `kk` and `kk + 1`.
    pub pairs: &'a mut [u32],
    /// Each block's scale, `[k / 32][GROUP]`.
    pub scale: &'a mut [f32],
    /// Each block's minimum (Q4_1), `[k / 32][GROUP]`; ignored unless `with_min`.
    pub min: &'a mut [f32],
}

/// The bf16 bit pattern of a small integer (exact: |v| < 256).
pub(crate) fn bf16_int(v: i32) -> u16 {
    ((v as f32).to_bits() >> 16) as u16
}

/// An activation `x [m, k]` split for the tiles once, multiplied by any number of weights
/// `[n, k]` (the q/k/v projections of a layer share their input, as do gate and up).
pub(crate) struct Split {
    /// From `a0` (a 64-byte boundary), per row tile `[k / 32][PARTS][16][32]` bf16 bit
    /// patterns (rows past m zero).
    a: Vec<u16>,
    a0: usize,
    /// Per row tile `[k / 32][16]`: each block's `Σ x` (for Q4_1's minimum).
    sums: Vec<f32>,
    m: usize,
    k: usize,
}

impl Split {
    /// `x`'s parts, or `None` when the AMX path does not apply (no AMX, `k` not a multiple
    /// of 32, no rows).
    pub(crate) fn new(x: &[f32], m: usize, k: usize) -> Option<Split> {
        let fits = m > 0 && k > 0 && k.is_multiple_of(BLOCK);
        if !fits || x.len() < m * k || !features::amx() {
            return None;
        }
        let nb = k / BLOCK;
        // Rows past m in the last tile are zero.
        let tiles = m.div_ceil(TR);
        let tile_len = nb * PARTS * TILE_U16;
        let (mut a, a0) = aligned_uninit::<u16>(tiles * tile_len);
        let mut sums: Vec<f32> = Vec::with_capacity(tiles * nb * TR);
        // SAFETY: `aligned_uninit` reserved a0 + tiles * tile_len values.
        let (ap, sp) = (
            OutPtr(unsafe { a.as_mut_ptr().add(a0) }),
            OutPtr(sums.as_mut_ptr()),
        );
        par_units(tiles, |t| {
            // SAFETY: tile t owns a[t * tile_len..][..tile_len] and sums[t * nb * TR..][..nb * TR].
            let (at, st) = unsafe {
                (
                    ap.part(t * tile_len, tile_len),
                    sp.part(t * nb * TR, nb * TR),
                )
            };
            let rows = TR.min(m.saturating_sub(t * TR));
            if rows < TR {
                at.fill(0);
                st.fill(0.0);
            }
            for r in 0..rows {
                let row = &x[(t * TR + r) * k..][..k];
                // SAFETY: AVX-512F is part of `available`; the row holds k = nb * 32 values.
                unsafe { split_row(row, nb, r, at, st) };
            }
        });
        // SAFETY: the tiles above wrote every value (padding rows as zeros), `aligned_uninit`
        // the padding around them.
        unsafe {
            a.set_len(a.capacity());
            sums.set_len(tiles * nb * TR);
        }
        Some(Split { a, a0, sums, m, k })
    }

    /// `x @ wᵀ` (`[m, n]`) for a weight `[n, k]` of quantized blocks whose panels the
    /// caller fills: `fill(g, panel)` writes columns `g * 48 .. g * 48 + 48` (called once
    /// per group, from several threads). `with_min` adds `min · Σ x` per block (Q4_1).
    ///
    /// Up to one row block (128 rows), each task fills one panel into its thread's buffer,
    /// which stays in L2 for the products. Above that, the panels of up to `CHUNK_BYTES` of
    /// columns at a time are filled once and shared by every row block's task. Filling the
    /// whole weight first had cost 2 bytes per value, each panel read once at a few rows
    /// (SmolLM2's `lm_head` over 16 rows: 32 ms, now 7.5).
    pub(crate) fn matmul(
        &self,
        n: usize,
        with_min: bool,
        fill: &(dyn Fn(usize, &mut Panel) + Sync),
    ) -> Vec<f32> {
        let (m, k) = (self.m, self.k);
        let nb = k / BLOCK;
        let groups = n.div_ceil(GROUP);
        let (pl, sl) = (k / 2 * GROUP, nb * GROUP);
        let tiles = m.div_ceil(TR);
        let mut c: Vec<f32> = Vec::with_capacity(m * n);
        let out = OutPtr(c.as_mut_ptr());
        // Row tiles `t` into columns g*48.. of the output, from panel g.
        let run =
            |t: std::ops::Range<usize>, g: usize, pairs: &[u32], scale: &[f32], min: &[f32]| {
                let step = Step {
                    a: &self.a[self.a0..],
                    sums: &self.sums,
                    nb,
                    with_min,
                    pairs,
                    scale,
                    min,
                };
                let cols = GROUP.min(n - g * GROUP);
                // SAFETY: AVX-512F and the tile state were checked by `available`; each task
                // writes only rows of its tiles in columns g*48..g*48+cols.
                unsafe { step.run(t, m, n, cols, out.get().add(g * GROUP)) };
            };
        if tiles <= BLOCK_TILES {
            par_units(groups, |g| {
                PANEL.with(|buf| {
                    let (pairs, scales) = &mut *buf.borrow_mut();
                    // 16 spare values leave room to start the pairs on a 64-byte boundary.
                    pairs.resize(pl + 16, 0);
                    scales.resize(2 * sl, 0.0);
                    let p0 = pairs.as_ptr().align_offset(64).min(16);
                    let pairs = &mut pairs[p0..p0 + pl];
                    let (scale, min) = scales.split_at_mut(sl);
                    fill(g, &mut Panel { pairs, scale, min });
                    run(0..tiles, g, pairs, scale, min);
                })
            });
        } else {
            let per_chunk = (CHUNK_BYTES / (4 * (pl + 2 * sl))).clamp(1, groups);
            let (mut pairs, p0) = aligned_uninit::<u32>(per_chunk * pl);
            // SAFETY: `fill` writes every pair of its panel, `aligned_uninit` the padding.
            unsafe { pairs.set_len(pairs.capacity()) };
            let mut scales = vec![0f32; 2 * per_chunk * sl];
            let row_blocks = tiles.div_ceil(BLOCK_TILES);
            for g0 in (0..groups).step_by(per_chunk) {
                let count = per_chunk.min(groups - g0);
                let (pp, scp) = (
                    OutPtr(pairs[p0..].as_mut_ptr()),
                    OutPtr(scales.as_mut_ptr()),
                );
                par_units(count, |g| {
                    // SAFETY: panel g owns its pl pairs and 2 * sl scales.
                    let (pairs, sc) =
                        unsafe { (pp.part(g * pl, pl), scp.part(2 * g * sl, 2 * sl)) };
                    let (scale, min) = sc.split_at_mut(sl);
                    fill(g0 + g, &mut Panel { pairs, scale, min });
                });
                let pairs = &pairs[p0..];
                // Tasks in row-block order: both threads work on one row block's activation
                // at a time.
                par_units(row_blocks * count, |u| {
                    let (rb, g) = (u / count, u % count);
                    let t0 = rb * BLOCK_TILES;
                    let sc = &scales[2 * g * sl..][..2 * sl];
                    let (scale, min) = sc.split_at(sl);
                    run(
                        t0..(t0 + BLOCK_TILES).min(tiles),
                        g0 + g,
                        &pairs[g * pl..][..pl],
                        scale,
                        min,
                    );
                });
            }
        }
        // SAFETY: the tasks wrote every row below m of every column.
        unsafe { c.set_len(m * n) };
        c
    }
}

thread_local! {
    /// Per-thread panel of [`Split::matmul`] over one row block: its pairs (from a 64-byte boundary),
    /// then its scales and minimums.
    static PANEL: std::cell::RefCell<(Vec<u32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// A vector with room for `len` values from a 64-byte boundary, returned with that offset;
/// the values around them are written (zeros), those from the offset are the caller's to
/// write before `set_len(capacity)`. A tile row is 64 bytes: from an unaligned address each
/// row load touches two cache lines, and tile loads bound the kernel.
pub(crate) fn aligned_uninit<T: Copy + Default>(len: usize) -> (Vec<T>, usize) {
    let pad = 64 / std::mem::size_of::<T>();
    let mut v: Vec<T> = Vec::with_capacity(len + pad);
    let off = v.as_ptr().align_offset(64).min(pad);
    let (head, rest) = v.spare_capacity_mut().split_at_mut(off);
    for x in head.iter_mut().chain(&mut rest[len..]) {
        x.write(T::default());
    }
    (v, off)
}

/// Row `r` of a tile: its three bf16 parts per block into `at` (`[nb][PARTS][16][32]`) and
/// its block sums into `st` (`[nb][16]`).
#[target_feature(enable = "avx512f")]
unsafe fn split_row(row: &[f32], nb: usize, r: usize, at: &mut [u16], st: &mut [f32]) {
    use std::arch::x86_64::*;
    for b in 0..nb {
        let mut sum = _mm512_setzero_ps();
        for h in 0..2 {
            let mut v = _mm512_loadu_ps(row.as_ptr().add(b * BLOCK + h * 16));
            sum = _mm512_add_ps(sum, v);
            for p in 0..PARTS {
                // The last part is the exact remainder (at most 8 significant bits left).
                let hi = _mm512_castps_si512(crate::cpu::x86::amx_gemm::round_bf16(v));
                v = _mm512_sub_ps(v, _mm512_castsi512_ps(hi));
                let half = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(hi));
                let dst = at
                    .as_mut_ptr()
                    .add(((b * PARTS + p) * TR + r) * BLOCK + h * 16);
                _mm256_storeu_si256(dst as *mut __m256i, half);
            }
        }
        st[b * TR + r] = _mm512_reduce_add_ps(sum);
    }
}

/// One task's view: the packed activation and its panel.
struct Step<'a> {
    a: &'a [u16],
    sums: &'a [f32],
    nb: usize,
    with_min: bool,
    pairs: &'a [u32],
    scale: &'a [f32],
    min: &'a [f32],
}

/// The tile configuration: all eight tiles 16 rows × 64 bytes.
#[repr(C, align(64))]
pub(crate) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    /// Configures this thread's eight tiles as 16 rows × 64 bytes.
    ///
    /// # Safety
    /// The CPU has AMX and the process holds the tile state ([`features::amx`]).
    pub(crate) unsafe fn load_16x64() {
        let mut cfg = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            cfg.colsb[t] = 64;
            cfg.rows[t] = TR as u8;
        }
        std::arch::asm!("ldtilecfg [{0}]", in(reg) &cfg, options(nostack, readonly));
    }
}

impl Step<'_> {
    /// Output rows of the row tiles `tiles` into the first `cols` of the 48 columns at `c`
    /// (row stride `n`), rows at or past `m` skipped.
    ///
    /// Per block: tmm3..tmm5 take the three column tiles once, then for each row tile
    /// tmm6/tmm7 take its three parts in turn and tmm0..tmm2 the 1 × 3 products `Σ x·q`,
    /// which AVX-512 then scales into f32 accumulators.
    #[target_feature(enable = "avx512f")]
    unsafe fn run(
        &self,
        tiles: std::ops::Range<usize>,
        m: usize,
        n: usize,
        cols: usize,
        c: *mut f32,
    ) {
        use std::arch::asm;
        use std::arch::x86_64::*;
        TileConfig::load_16x64();
        let tile_len = self.nb * PARTS * TILE_U16;
        let mut prod = Aligned([0f32; CT * TR * 16]);
        let mut acc = Aligned([0f32; BLOCK_TILES * TR * GROUP]);
        let count = tiles.len();
        assert!(count <= BLOCK_TILES, "a unit covers at most one row block");
        let a_at = |i: usize, b: usize| {
            self.a
                .as_ptr()
                .add((tiles.start + i) * tile_len + b * PARTS * TILE_U16)
        };
        for b in 0..self.nb {
            let w = self.pairs.as_ptr().add(b * (BLOCK / 2) * GROUP);
            asm!(
                "tileloadd tmm3, [{w} + {ws}]",
                "tileloadd tmm4, [{w} + {ws} + 64]",
                "tileloadd tmm5, [{w} + {ws} + 128]",
                w = in(reg) w,
                ws = in(reg) GROUP * 4,
                options(nostack, readonly),
            );
            let d: [__m512; CT] = std::array::from_fn(|ct| {
                _mm512_loadu_ps(self.scale.as_ptr().add(b * GROUP + ct * 16))
            });
            let mn: [__m512; CT] = std::array::from_fn(|ct| {
                _mm512_loadu_ps(self.min.as_ptr().add(b * GROUP + ct * 16))
            });
            for i in 0..count {
                let a0 = a_at(i, b);
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tileloadd tmm6, [{a0} + {s}]",
                    "tileloadd tmm7, [{a0} + {s} + 1024]",
                    "tdpbf16ps tmm0, tmm6, tmm3",
                    "tdpbf16ps tmm1, tmm6, tmm4",
                    "tdpbf16ps tmm2, tmm6, tmm5",
                    "tileloadd tmm6, [{a0} + {s} + 2048]",
                    "tdpbf16ps tmm0, tmm7, tmm3",
                    "tdpbf16ps tmm1, tmm7, tmm4",
                    "tdpbf16ps tmm2, tmm7, tmm5",
                    "tdpbf16ps tmm0, tmm6, tmm3",
                    "tdpbf16ps tmm1, tmm6, tmm4",
                    "tdpbf16ps tmm2, tmm6, tmm5",
                    "tilestored [{p} + {s}], tmm0",
                    "tilestored [{p} + {s} + 1024], tmm1",
                    "tilestored [{p} + {s} + 2048], tmm2",
                    a0 = in(reg) a0,
                    s = in(reg) BLOCK * 2,
                    p = in(reg) prod.0.as_mut_ptr(),
                    options(nostack),
                );
                let next = if i + 1 < count {
                    Some((i + 1, b))
                } else if b + 1 < self.nb {
                    Some((0, b + 1))
                } else {
                    None
                };
                if let Some((ni, nb_)) = next {
                    let n0 = a_at(ni, nb_);
                    for line in 0..PARTS * TILE_U16 * 2 / 64 {
                        _mm_prefetch::<_MM_HINT_T0>(n0.add(line * 32) as *const i8);
                    }
                }
                let acc_i = acc.0.as_mut_ptr().add(i * TR * GROUP);
                let sums = self
                    .sums
                    .as_ptr()
                    .add(((tiles.start + i) * self.nb + b) * TR);
                for ct in 0..CT {
                    let pt = prod.0.as_ptr().add(ct * TR * 16);
                    for r in 0..TR {
                        let dst = acc_i.add(r * GROUP + ct * 16);
                        let prev = if b == 0 {
                            _mm512_setzero_ps()
                        } else {
                            _mm512_loadu_ps(dst)
                        };
                        let mut v = _mm512_fmadd_ps(d[ct], _mm512_loadu_ps(pt.add(r * 16)), prev);
                        if self.with_min {
                            v = _mm512_fmadd_ps(mn[ct], _mm512_set1_ps(*sums.add(r)), v);
                        }
                        _mm512_storeu_ps(dst, v);
                    }
                }
            }
        }
        for i in 0..count {
            for r in 0..TR {
                let row = (tiles.start + i) * TR + r;
                if row >= m {
                    break;
                }
                let src = acc.0.as_ptr().add((i * TR + r) * GROUP);
                std::ptr::copy_nonoverlapping(src, c.add(row * n), cols);
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// A value from a 64-byte boundary (a tile row is one cache line).
#[repr(C, align(64))]
pub(crate) struct Aligned<T>(pub(crate) T);
