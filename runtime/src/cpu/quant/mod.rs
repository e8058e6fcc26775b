//! GGUF block-quantized weights kept as stored on the CPU, multiplied straight from their
//! blocks.
//!
//! A decode step reads every weight once, so its speed is the bytes it streams. A Q4_1 GGUF
//! loaded as f32 streams 6.4 times the bytes of its blocks; kept as blocks, the products are
//! those of the f32 matrix [`zoo_hub::gguf::dequantize`] builds (weights `a * q + m` per group
//! of 32; see `group`), in f32, like transformers' on the same file, at a fraction of the
//! memory traffic and of the resident memory:
//!
//! - rows rebuilt as f32 ([`QMatrix::dequant_row`]: embedding lookups, the panels of a
//!   prefill's GEMM; and each group of a batched decode step's products) are the hub's
//!   weights bit for bit;
//! - a one-row decode step regroups the sum instead, `Σ a·(Σ q·x) + Σ m·(Σ x)`: f32 rounding
//!   as in any other summation order, for less vector work per weight. On two cores a
//!   decode is bound by that work rather than by memory.
//!
//! Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q2_K to Q6_K are kept (a Q4_K_M file mixes
//! several); a row whose length is not a whole number of blocks loads as f32. Only f32 loads
//! on the CPU use blocks (on PJRT devices, or in 16-bit, weights are plain tensors).

use crate::nn::QuantizedWeight;
use crate::{Device, Tensor};
use zoo_hub::GgmlType;

use crate::cpu::features;
use crate::cpu::kernels::{par_chunks, par_units, OutPtr};
use crate::{Error, Result};

mod group;

#[cfg(target_arch = "x86_64")]
use group::monomorphic;
pub(crate) use group::QKind;
use group::GROUP;

/// Whether a stored `ggml` tensor of HF shape `shape` stays as blocks when its matrix is
/// kept (what `QMatrix::new` accepts): what a load's resident bytes are counted from.
pub fn keeps_blocks(ggml: GgmlType, shape: &[usize]) -> bool {
    QKind::of(ggml).is_some_and(|k| matches!(shape, &[_, cols] if cols % k.block_len() == 0))
}

/// Below this many rows, products rebuild each block once for all rows
/// ([`QMatrix::matvec_each`]); from it on, the weights are unpacked into panels for the
/// tiles or the GEMM, which pays once enough rows share it. Measured crossover on AMX tiles,
/// SmolLM2 Q4_1 decoding many prompts at once: 24 prompts 400 tok/s by blocks, 373 on
/// tiles; 32 prompts 392 and 441.
const FEW_ROWS: usize = 32;

/// A `[rows, cols]` matrix of quantized blocks, row-major, rows in HF order.
#[derive(Debug)]
pub(crate) struct QMatrix {
    kind: QKind,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

impl QMatrix {
    /// The blocks of `w`, or `None` for a block type or shape kept as f32 instead.
    pub(crate) fn new(w: QuantizedWeight) -> Result<Option<QMatrix>> {
        let Some(kind) = QKind::of(w.ggml) else {
            return Ok(None);
        };
        let &[rows, cols] = &w.shape[..] else {
            return Ok(None);
        };
        if cols % kind.block_len() != 0 {
            return Ok(None);
        }
        let want = rows * cols / kind.block_len() * kind.block_bytes();
        if w.data.len() != want {
            return Err(Error::InvalidArgument {
                op: "load",
                msg: format!(
                    "weight `{}`: {} bytes of {:?} blocks for shape {:?}, expected {want}; the file is damaged",
                    w.name,
                    w.data.len(),
                    kind,
                    w.shape
                ),
            });
        }
        Ok(Some(QMatrix {
            kind,
            rows,
            cols,
            data: w.data,
        }))
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    fn row_bytes(&self) -> usize {
        self.cols / self.kind.block_len() * self.kind.block_bytes()
    }

    fn row(&self, r: usize) -> &[u8] {
        let n = self.row_bytes();
        &self.data[r * n..(r + 1) * n]
    }

    /// Row `r` as f32, exactly as `zoo_hub::gguf::dequantize` computes it.
    pub(crate) fn dequant_row(&self, r: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if features::avx2() {
            // SAFETY: AVX2, FMA and F16C were detected; `out` holds the row's cols values.
            let (row, out) = (self.row(r), &mut out[..self.cols]);
            unsafe { monomorphic!(self.kind, |K| dequant_avx2::<K>(row, out)) };
            return;
        }
        // Whole blocks of a kind `new` accepted: the hub's dequantizer cannot fail here.
        let _ =
            zoo_hub::gguf::dequantize_into(self.kind.ggml(), self.row(r), &mut out[..self.cols]);
    }

    /// The rows `ids` as f32 (an embedding lookup), `[ids.len(), cols]` row-major.
    pub(crate) fn gather_rows(&self, ids: &[i64]) -> Result<Vec<f32>> {
        let mut out = vec![0f32; ids.len() * self.cols];
        for (&id, y) in ids.iter().zip(out.chunks_exact_mut(self.cols)) {
            if id < 0 || id as usize >= self.rows {
                return Err(Error::InvalidArgument {
                    op: "embedding",
                    msg: format!(
                        "token id {id} is outside the vocabulary of {} ids",
                        self.rows
                    ),
                });
            }
            self.dequant_row(id as usize, y);
        }
        Ok(out)
    }

    /// The whole matrix as f32, row-major.
    pub(crate) fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        par_chunks(&mut out, self.cols, |r, y| self.dequant_row(r, y));
        out
    }

    /// `x [m, cols] @ wᵀ` → `[m, rows]` for each of `ws` and a few rows `m` (a decode step,
    /// batched or not): each group's integers are widened once for all rows, so the weights
    /// stream from memory once per call whatever `m`. All the weights share one parallel
    /// region: a decode step's products (a layer's q, k and v) take a few microseconds each,
    /// about what handing work to the pool and waiting for it costs.
    fn matvec_each(ws: &[&QMatrix], x: &[f32], m: usize) -> Vec<Vec<f32>> {
        let Some(k) = ws.first().map(|w| w.cols) else {
            return Vec::new();
        };
        if m == 0 {
            return vec![Vec::new(); ws.len()];
        }
        // Sized over all the weights, which share one parallel region.
        let total: usize = ws.iter().map(|w| w.rows).sum();
        let rows_per_unit = crate::cpu::kernels::decode_rows_per_unit(total, 1);
        // The kernels load x in 64-byte vectors, and one off a 64-byte boundary reads two
        // cache lines: copied to one, a batched step's products ran 1.3x faster.
        let mut aligned: Vec<f32> = Vec::new();
        let x = if (x.as_ptr() as usize).is_multiple_of(64) {
            &x[..m * k]
        } else {
            aligned.reserve_exact(m * k + 16);
            let off = aligned.as_ptr().align_offset(64).min(16);
            aligned.resize(off, 0.0);
            aligned.extend_from_slice(&x[..m * k]);
            &aligned[off..]
        };
        let xs: Vec<&[f32]> = x.chunks_exact(k).collect();
        let wide = features::avx512();
        // One x row takes the regrouped sum, which needs the sum of each half-group of x
        // (see `dots_avx512`; without AVX2, `dot_blocks` needs them for Q4_0 too): once per
        // call, for every unit.
        let needs_sums = |w: &&QMatrix| w.kind.has_min() || !features::avx2();
        let sums: Vec<f32> = if m == 1 && ws.iter().any(needs_sums) {
            xs[0]
                .chunks_exact(GROUP / 2)
                .map(|h| h.iter().sum())
                .collect()
        } else {
            Vec::new()
        };
        // Not zero-filled: every unit writes all of its rows (a Gemma 3 step's logits are 1 MiB).
        let mut ys: Vec<Vec<f32>> = ws.iter().map(|w| Vec::with_capacity(w.rows * m)).collect();
        let outs: Vec<OutPtr> = ys.iter_mut().map(|y| OutPtr(y.as_mut_ptr())).collect();
        // Unit u is block u - starts[j] of weight j.
        let mut starts = vec![0];
        for w in ws {
            starts.push(starts.last().copied().unwrap_or(0) + w.rows.div_ceil(rows_per_unit));
        }
        par_units(starts[ws.len()], |u| {
            let j = starts.partition_point(|&s| s <= u) - 1;
            let (w, c) = (ws[j], u - starts[j]);
            let rows = c * rows_per_unit..((c + 1) * rows_per_unit).min(w.rows);
            // SAFETY: unit u writes columns `rows` of every row of weight j's `[m, rows]`
            // output, which no other unit writes; `ys` outlives the region.
            unsafe { w.matvec_block(rows, &xs, &sums, outs[j], wide) };
        });
        for (y, w) in ys.iter_mut().zip(ws) {
            // SAFETY: the units above wrote every row's m values of every weight's output.
            unsafe { y.set_len(w.rows * m) };
        }
        ys
    }

    /// Columns `rows` of [`QMatrix::matvec_each`]'s `[m, self.rows]` output at `out`.
    ///
    /// # Safety
    /// `out` holds `m * self.rows` values, and no other thread writes these columns.
    unsafe fn matvec_block(
        &self,
        rows: std::ops::Range<usize>,
        xs: &[&[f32]],
        sums: &[f32],
        out: OutPtr,
        wide: bool,
    ) {
        let (k, m, n) = (self.cols, xs.len(), self.rows);
        #[cfg(target_arch = "x86_64")]
        if wide {
            let row_bytes = self.row_bytes();
            let blocks = &self.data[rows.start * row_bytes..rows.end * row_bytes];
            if m == 1 {
                // SAFETY: AVX-512F/BW/VL and F16C were detected; every weight row holds
                // cols/32 groups and x holds cols values; the caller owns these columns.
                let y = out.part(rows.start, rows.len());
                monomorphic!(self.kind, |K| dots_rows::<K>(
                    (blocks, row_bytes),
                    xs[0],
                    sums,
                    y
                ));
                return;
            }
            // Up to 8 x rows per pass over the block's weight rows (still in cache for the
            // next pass).
            for (p, xg) in xs.chunks(8).enumerate() {
                // A pass of 3, 5, 6 or 7 rows runs the next width up, repeating its first
                // row (whose products are dropped): fewer kernels to compile, each unrolled
                // over its rows.
                let x = |i: usize| xg.get(i).copied().unwrap_or(xg[0]);
                let at = (out, n, rows.start, p * 8, xg.len());
                // SAFETY: as above; `at` names this pass's rows of the caller's columns.
                monomorphic!(self.kind, |K| match xg.len() {
                    1 => rebuilt_rows::<K, 1>((blocks, row_bytes), [x(0)], at),
                    2 => rebuilt_rows::<K, 2>((blocks, row_bytes), [x(0), x(1)], at),
                    3 | 4 => rebuilt_rows::<K, 4>((blocks, row_bytes), std::array::from_fn(x), at),
                    _ => rebuilt_rows::<K, 8>((blocks, row_bytes), std::array::from_fn(x), at),
                })
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if m > 1 && features::avx2() {
            let row_bytes = self.row_bytes();
            let blocks = &self.data[rows.start * row_bytes..rows.end * row_bytes];
            // Up to 8 x rows per pass, as the AVX-512 path takes them.
            for (p, xg) in xs.chunks(8).enumerate() {
                let x = |i: usize| xg.get(i).copied().unwrap_or(xg[0]);
                let at = (out, n, rows.start, p * 8, xg.len());
                // SAFETY: AVX2, FMA and F16C were detected; every weight row holds cols/32
                // groups and each x row cols values; `at` names this pass's rows of the
                // caller's columns.
                monomorphic!(self.kind, |K| match xg.len() {
                    1 => rebuilt_rows_avx2::<K, 1>((blocks, row_bytes), [x(0)], at),
                    2 => rebuilt_rows_avx2::<K, 2>((blocks, row_bytes), [x(0), x(1)], at),
                    3 | 4 => {
                        rebuilt_rows_avx2::<K, 4>((blocks, row_bytes), std::array::from_fn(x), at)
                    }
                    _ => rebuilt_rows_avx2::<K, 8>((blocks, row_bytes), std::array::from_fn(x), at),
                })
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if m == 1 && features::avx2() {
            let row_bytes = self.row_bytes();
            let blocks = &self.data[rows.start * row_bytes..rows.end * row_bytes];
            let y = out.part(rows.start, rows.len());
            // SAFETY: AVX2, FMA and F16C were detected; every weight row holds cols/32
            // groups and x holds cols values; the caller owns these columns.
            monomorphic!(self.kind, |K| dots_rows_avx2::<K>(
                (blocks, row_bytes),
                xs[0],
                sums,
                y
            ));
            return;
        }
        // One row of the common 32-weight types: straight from the blocks, no row rebuilt.
        if m == 1 && matches!(self.kind, QKind::Q4_0 | QKind::Q4_1 | QKind::Q8_0) {
            for r in rows {
                *out.get().add(r) = dot_blocks(self.kind, self.row(r), xs[0], sums);
            }
            return;
        }
        // Each weight row rebuilt once as f32 for all the x rows.
        let mut w = vec![0f32; rows.len() * k];
        for (r, wr) in rows.clone().zip(w.chunks_exact_mut(k)) {
            self.dequant_row(r, wr);
        }
        let mut y = vec![0f32; rows.len()];
        for (i, xr) in xs.iter().enumerate() {
            crate::cpu::kernels::dot_rows(&w, xr, &mut y);
            let at = out.get().add(i * n + rows.start);
            std::ptr::copy_nonoverlapping(y.as_ptr(), at, y.len());
        }
    }

    /// `x [m, cols] @ wᵀ` → `[m, rows]` for each of several weights that take the same
    /// input (a layer's q, k and v projections; gate and up). A few rows: block by block
    /// ([`QMatrix::matvec_each`]); many: on AMX tiles where the CPU has them (see `x86/amx.rs`;
    /// the input is split for the tiles once), else with rows of weights rebuilt into f32
    /// panels for the GEMM kernel as it goes; no f32 matrix exists whole.
    pub(crate) fn matmul_t_each(ws: &[&QMatrix], x: &[f32], m: usize) -> Vec<Vec<f32>> {
        if m < FEW_ROWS {
            return QMatrix::matvec_each(ws, x, m);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(k) = ws.first().map(|w| w.cols) {
            let same = ws.iter().all(|w| w.cols == k && w.kind.on_tiles());
            if let Some(split) = same
                .then(|| crate::cpu::x86::amx::Split::new(x, m, k))
                .flatten()
            {
                return ws
                    .iter()
                    .map(|w| {
                        let fill =
                            |g: usize, p: &mut crate::cpu::x86::amx::Panel| w.fill_panel(g, p);
                        split.matmul(w.rows, w.kind == QKind::Q4_1, &fill)
                    })
                    .collect();
            }
        }
        ws.iter().map(|w| w.matmul_t_f32(x, m)).collect()
    }

    /// One product of [`QMatrix::matmul_t_each`] without AMX tiles.
    fn matmul_t_f32(&self, x: &[f32], m: usize) -> Vec<f32> {
        let k = self.cols;
        let fast = crate::cpu::kernels::matmul_wt_with(x, m, k, self.rows, &|panel, out| {
            use crate::cpu::kernels::{pack_rows, NR};
            PANEL.with(|buf| {
                let mut buf = buf.borrow_mut();
                buf.resize(NR * k, 0.0);
                for (j, row) in buf.chunks_exact_mut(k).enumerate() {
                    self.dequant_row(panel * NR + j, row);
                }
                let rows: [&[f32]; NR] = std::array::from_fn(|j| &buf[j * k..(j + 1) * k]);
                pack_rows(&rows, k, out);
            })
        });
        if let Some(y) = fast {
            return y;
        }
        self.matmul_t_by_library(x, m)
    }

    /// [`QMatrix::matmul_t_f32`] where zoo has no GEMM kernel for the CPU (Arm, x86 without
    /// AVX2): blocks of [`LIBRARY_BLOCK`] weight rows rebuilt as f32, each multiplied by the
    /// `gemm` crate (whose kernels pick the CPU's vectors), one block per parallel unit; no
    /// f32 matrix exists whole.
    fn matmul_t_by_library(&self, x: &[f32], m: usize) -> Vec<f32> {
        let (k, n) = (self.cols, self.rows);
        let mut y: Vec<f32> = Vec::with_capacity(m * n);
        let out = OutPtr(y.as_mut_ptr());
        par_units(n.div_ceil(LIBRARY_BLOCK), |b| {
            let (r0, r1) = (b * LIBRARY_BLOCK, ((b + 1) * LIBRARY_BLOCK).min(n));
            PANEL.with(|buf| {
                let mut buf = buf.borrow_mut();
                buf.resize((r1 - r0) * k, 0.0);
                for (r, wr) in (r0..r1).zip(buf.chunks_exact_mut(k)) {
                    self.dequant_row(r, wr);
                }
                // SAFETY: x holds m rows of k, `buf` r1 - r0 rows of k (read as the
                // transposed right operand); the unit writes columns r0..r1 of every row of
                // the `[m, n]` output, which no other unit writes.
                unsafe {
                    gemm::gemm(
                        m,
                        r1 - r0,
                        k,
                        out.get().add(r0),
                        1,
                        n as isize,
                        false,
                        x.as_ptr(),
                        1,
                        k as isize,
                        buf.as_ptr(),
                        k as isize,
                        1,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    )
                }
            })
        });
        // SAFETY: the units above wrote every column of every row.
        unsafe { y.set_len(m * n) };
        y
    }

    /// Columns `g * 48 ..` (weight rows) of the AMX path: each block's quantized values as
    /// bf16 pairs, its scale and (Q4_1) minimum; columns past the last weight row as zeros.
    #[cfg(target_arch = "x86_64")]
    fn fill_panel(&self, g: usize, p: &mut crate::cpu::x86::amx::Panel) {
        use crate::cpu::x86::amx::GROUP;
        let cols = GROUP.min(self.rows - g * GROUP);
        let nb = self.cols / crate::cpu::x86::amx::BLOCK;
        assert!(
            p.pairs.len() >= self.cols / 2 * GROUP
                && p.scale.len() >= nb * GROUP
                && p.min.len() >= nb * GROUP,
            "a panel holds every k pair, block scale and minimum"
        );
        // SAFETY: the AMX path runs only where `features::amx` found AVX-512F and BW (and
        // the kernels F16C); only existing rows are read, and the panel's sizes are asserted.
        unsafe { self.fill_pairs(g, cols, p) };
    }

    /// [`QMatrix::fill_panel`] for its first `cols` columns: per block and 16 columns, each
    /// column's 32 values become one register of bf16 pairs, and a 16 × 16 transpose turns
    /// those into the panel's k-pair rows; the 16 blocks' leading f16 fields (scale, and
    /// minimum for Q4_1) are gathered as one vector.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    unsafe fn fill_pairs(&self, g: usize, cols: usize, p: &mut crate::cpu::x86::amx::Panel) {
        use crate::cpu::x86::amx::{bf16_int, BLOCK, GROUP};
        use std::arch::x86_64::*;
        // bf16 of each nibble (Q4_0 centred on 8), indexed by vpermw.
        let lut: [u16; 32] = std::array::from_fn(|v| {
            bf16_int(v as i32 - if self.kind == QKind::Q4_0 { 8 } else { 0 })
        });
        let lut = _mm512_loadu_si512(lut.as_ptr() as *const __m512i);
        let bb = self.kind.block_bytes();
        let column = |blk: *const u8| -> __m512i {
            match self.kind {
                QKind::Q4_0 | QKind::Q4_1 => {
                    let qs = _mm_loadu_si128(blk.add(bb - 16) as *const __m128i);
                    let low = _mm_set1_epi8(0x0f);
                    let lo = _mm_and_si128(qs, low);
                    let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low);
                    let idx = _mm512_cvtepu8_epi16(_mm256_set_m128i(hi, lo));
                    _mm512_permutexvar_epi16(idx, lut)
                }
                QKind::Q8_0 => {
                    let bf = |o: usize| {
                        let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(o) as *const __m128i));
                        let f = _mm512_castps_si512(_mm512_cvtepi32_ps(q));
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(f))
                    };
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bf(2)), bf(18))
                }
                _ => unreachable!("`matmul_t_each` sends only `on_tiles` types to the tiles"),
            }
        };
        let o = p.pairs.as_mut_ptr();
        let row_bytes = self.row_bytes();
        // Byte offsets of 16 consecutive rows' first block.
        let rows16 = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(row_bytes as i32),
        );
        for b in 0..self.cols / BLOCK {
            for ct in 0..GROUP / 16 {
                let live = cols.saturating_sub(ct * 16).min(16);
                let first = (g * GROUP + ct * 16).min(self.rows - 1);
                let base = self.data.as_ptr().add(first * row_bytes + b * bb);
                // Absent columns stay zero (their rows are not read).
                let fields = _mm512_mask_i32gather_epi32::<1>(
                    _mm512_setzero_si512(),
                    ((1u32 << live) - 1) as u16,
                    rows16,
                    base as *const i32,
                );
                let at = b * GROUP + ct * 16;
                let f16s = |v: __m512i| _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
                _mm512_storeu_ps(p.scale.as_mut_ptr().add(at), f16s(fields));
                let min = if self.kind == QKind::Q4_1 {
                    f16s(_mm512_srli_epi32::<16>(fields))
                } else {
                    _mm512_setzero_ps()
                };
                _mm512_storeu_ps(p.min.as_mut_ptr().add(at), min);
                let mut r: [__m512i; 16] = std::array::from_fn(|c| {
                    if ct * 16 + c < cols {
                        column(self.row(g * GROUP + ct * 16 + c).as_ptr().add(b * bb))
                    } else {
                        _mm512_setzero_si512()
                    }
                });
                crate::cpu::x86::avx512::transpose16(&mut r);
                for (kp, v) in r.iter().enumerate() {
                    let dst = o.add((b * BLOCK / 2 + kp) * GROUP + ct * 16);
                    _mm512_storeu_si512(dst as *mut __m512i, *v);
                }
            }
        }
    }

    /// The matrix as an f32 CPU tensor (for paths without a block kernel).
    pub(crate) fn to_tensor(&self) -> Result<Tensor> {
        Tensor::from_vec(self.dequantize(), &[self.rows, self.cols], &Device::Cpu)
    }
}

/// `row · x` for a Q4_0, Q4_1 or Q8_0 row without vector intrinsics (the `generic` tier):
/// per block `d·Σ q·x` (minus `8·d·Σ x` for Q4_0, plus `m·Σ x` for Q4_1), `sums` holding
/// x's half-group sums; each block's products in eight partial sums the compiler keeps in
/// vector registers of any instruction set.
fn dot_blocks(kind: QKind, row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
    let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32();
    let bb = kind.block_bytes();
    let mut total = 0f32;
    let blocks = row.chunks_exact(bb).zip(x.chunks_exact(GROUP));
    for ((blk, xb), halves) in blocks.zip(sums.chunks_exact(2)) {
        let sx = halves[0] + halves[1];
        let mut acc = [0f32; 8];
        match kind {
            QKind::Q8_0 => {
                let qs = &blk[2..34];
                for (q8, x8) in qs.chunks_exact(8).zip(xb.chunks_exact(8)) {
                    for i in 0..8 {
                        acc[i] += f32::from(q8[i] as i8) * x8[i];
                    }
                }
            }
            _ => {
                // Byte j holds element j (low nibble) and element j + 16 (high nibble).
                let qs = &blk[bb - 16..];
                let (lo, hi) = xb.split_at(16);
                for ((q8, l8), h8) in qs
                    .chunks_exact(8)
                    .zip(lo.chunks_exact(8))
                    .zip(hi.chunks_exact(8))
                {
                    for i in 0..8 {
                        acc[i] += f32::from(q8[i] & 15) * l8[i] + f32::from(q8[i] >> 4) * h8[i];
                    }
                }
            }
        }
        let d = f16(&blk[0..2]);
        let dot: f32 = acc.iter().sum();
        total += match kind {
            QKind::Q4_0 => d * (dot - 8.0 * sx),
            QKind::Q4_1 => d * dot + f16(&blk[2..4]) * sx,
            _ => d * dot,
        };
    }
    total
}

/// Weight rows per block of [`QMatrix::matmul_t_by_library`]: enough columns for the library's
/// kernel to run at speed, few enough that a block of a wide matrix stays in the L2 cache.
const LIBRARY_BLOCK: usize = 64;

thread_local! {
    /// Per-thread rows of one weight panel, rebuilt from blocks before packing.
    static PANEL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `ys[r] = rows[r] · x` for each weight row of `rows` (its bytes and the bytes per row) on
/// AVX2, `sums` holding x's half-group sums: [`dots_avx512`]'s regrouped sum in 8-lane
/// vectors, each group's integers widened and multiplied with x before its scale applies.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_rows_avx2<const K: u8>(
    (rows, row_bytes): (&[u8], usize),
    x: &[f32],
    sums: &[f32],
    ys: &mut [f32],
) {
    use std::arch::x86_64::*;
    let kind = QKind::from_id(K);
    for (row, y) in rows.chunks_exact(row_bytes).zip(ys) {
        // Even and odd groups in two accumulators (one dependent FMA per two groups each).
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut off = 0f32;
        for g in 0..x.len() / GROUP {
            prefetch_ahead(kind, row, g);
            let q = group::ints::<false>(kind, row, g);
            let (a, m) = group::scales(kind, row, g);
            let xp = x.as_ptr().add(g * GROUP);
            let halves = [_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q)];
            // q · x over each half-group (16 weights), 8 lanes of partial sums.
            let half = |h: usize| {
                let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(halves[h]));
                let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(halves[h])));
                let t = _mm256_mul_ps(lo, _mm256_loadu_ps(xp.add(16 * h)));
                _mm256_fmadd_ps(hi, _mm256_loadu_ps(xp.add(16 * h + 8)), t)
            };
            let (t0, t1) = (half(0), half(1));
            let a_acc = &mut acc[g % 2];
            if kind.split_scales() {
                *a_acc = _mm256_fmadd_ps(_mm256_set1_ps(a[0]), t0, *a_acc);
                *a_acc = _mm256_fmadd_ps(_mm256_set1_ps(a[1]), t1, *a_acc);
            } else {
                *a_acc = _mm256_fmadd_ps(_mm256_set1_ps(a[0]), _mm256_add_ps(t0, t1), *a_acc);
            }
            if kind.has_min() {
                off += m[0] * sums[2 * g] + m[1] * sums[2 * g + 1];
            }
        }
        *y = crate::cpu::x86::avx2::hsum256(_mm256_add_ps(acc[0], acc[1])) + off;
    }
}

/// [`rebuilt_rows`] on AVX2 (a batched decode step): each group's 32 weights rebuilt once
/// in four 8-lane registers, `a * q + m` as the hub dequantizes them, and multiplied with
/// every x row, one accumulator per x row (13 registers at 8 rows). Rebuilding a row once
/// for all the x rows, where the few-row fallback wrote each rebuilt row to memory and read
/// it back per x row.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; the output holds these rows and columns, and no other
/// thread writes them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rebuilt_rows_avx2<const K: u8, const R: usize>(
    (rows, row_bytes): (&[u8], usize),
    x: [&[f32]; R],
    (out, n, r0, i0, live): PassOut,
) {
    use std::arch::x86_64::*;
    let kind = QKind::from_id(K);
    for (r, row) in rows.chunks_exact(row_bytes).enumerate() {
        let mut acc = [_mm256_setzero_ps(); R];
        for g in 0..x[0].len() / GROUP {
            prefetch_ahead(kind, row, g);
            let w = group::weights8(kind, row, g);
            for (a, x) in acc.iter_mut().zip(x) {
                let xp = x.as_ptr().add(g * GROUP);
                for (j, wj) in w.iter().enumerate() {
                    *a = _mm256_fmadd_ps(*wj, _mm256_loadu_ps(xp.add(8 * j)), *a);
                }
            }
        }
        for (i, a) in acc.iter().enumerate().take(live) {
            *out.get().add((i0 + i) * n + r0 + r) = crate::cpu::x86::avx2::hsum256(*a);
        }
    }
}

/// `ys[r] = rows[r] · x` for each weight row of `rows` (its bytes and the bytes per row),
/// `sums` holding x's half-group sums.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn dots_rows<const K: u8>(
    (rows, row_bytes): (&[u8], usize),
    x: &[f32],
    sums: &[f32],
    ys: &mut [f32],
) {
    for (row, y) in rows.chunks_exact(row_bytes).zip(ys) {
        *y = dots_avx512::<K>(row, x, sums);
    }
}

/// Where a pass of [`rebuilt_rows`] writes: the `[m, n]` output, `n`, the first weight row
/// of the block, the pass's first x row and how many of its x rows are real.
#[cfg(target_arch = "x86_64")]
type PassOut = (OutPtr, usize, usize, usize, usize);

/// Each weight row of `rows` (its bytes and the bytes per row) times the real x rows of `x`
/// (the first `live`; the rest repeat one of them and are dropped), written to `y[i][r]`.
///
/// # Safety
/// The CPU has AVX-512F/BW/VL, FMA and F16C; the output holds these rows and columns, and no
/// other thread writes them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn rebuilt_rows<const K: u8, const R: usize>(
    (rows, row_bytes): (&[u8], usize),
    x: [&[f32]; R],
    (out, n, r0, i0, live): PassOut,
) {
    // Three weight rows at a time share each load of x: 24 accumulators, 6 weight
    // registers, one for x.
    const W: usize = 3;
    let count = rows.len() / row_bytes;
    let row = |r: usize| &rows[r * row_bytes..(r + 1) * row_bytes];
    let write = |r: usize, d: &[f32; R]| {
        for (i, v) in d.iter().take(live).enumerate() {
            *out.get().add((i0 + i) * n + r0 + r) = *v;
        }
    };
    let mut r = 0;
    while r + W <= count {
        let d = rebuilt_dots::<K, R, W>([row(r), row(r + 1), row(r + 2)], x);
        for (j, d) in d.iter().enumerate() {
            write(r + j, d);
        }
        r += W;
    }
    for r in r..count {
        write(r, &rebuilt_dots::<K, R, 1>([row(r)], x)[0]);
    }
}

/// `rows[r] · x[i]` for `W` weight rows and `R` vectors `x` (a batched decode step): each
/// group's 32 weights are rebuilt once as f32, `a * q + m` exactly as the hub dequantizes
/// them, then multiplied with every x row, each load of x serving all `W` weight rows.
/// The rebuilding is shared by the rows, where the regrouped sum of [`dots_avx512`] spends
/// one more operation per row and 16 weights, and a scalar offset sum: from two rows on,
/// rebuilding is the cheaper. SmolLM2 Q4_1 decoding 8 prompts at once: 213 -> 353 tok/s
/// (one prompt: 110), with x copied to a 64-byte boundary and written as `[m, rows]` by the
/// kernel (the transpose after the products had been serial).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn rebuilt_dots<const K: u8, const R: usize, const W: usize>(
    rows: [&[u8]; W],
    x: [&[f32]; R],
) -> [[f32; R]; W] {
    use std::arch::x86_64::*;
    let kind = QKind::from_id(K);
    // One accumulator per weight row and x row (two FMAs per group each).
    let mut acc = [[_mm512_setzero_ps(); R]; W];
    for g in 0..x[0].len() / GROUP {
        let mut w = [[_mm512_setzero_ps(); 2]; W];
        for r in 0..W {
            prefetch_ahead(kind, rows[r], g);
            if matches!(kind, QKind::Q4_0 | QKind::Q4_1) {
                let (w0, w1) = group::weights16_by_table(kind, rows[r], g);
                w[r] = [w0, w1];
                continue;
            }
            let (f0, f1) = group::floats16(kind, rows[r], g);
            let (a, m) = group::scales(kind, rows[r], g);
            w[r] = [
                _mm512_mul_ps(_mm512_set1_ps(a[0]), f0),
                _mm512_mul_ps(_mm512_set1_ps(a[1]), f1),
            ];
            if kind.has_min() {
                w[r][0] = _mm512_add_ps(w[r][0], _mm512_set1_ps(m[0]));
                w[r][1] = _mm512_add_ps(w[r][1], _mm512_set1_ps(m[1]));
            }
        }
        for (i, x) in x.iter().enumerate() {
            let xp = x.as_ptr().add(g * GROUP);
            let (x0, x1) = (_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16)));
            for r in 0..W {
                acc[r][i] = _mm512_fmadd_ps(w[r][0], x0, acc[r][i]);
                acc[r][i] = _mm512_fmadd_ps(w[r][1], x1, acc[r][i]);
            }
        }
    }
    let mut out = [[0f32; R]; W];
    for r in 0..W {
        if R == 8 {
            let sums = sum8(std::array::from_fn(|i| acc[r][i]));
            out[r].copy_from_slice(&sums[..R]);
        } else {
            for i in 0..R {
                out[r][i] = _mm512_reduce_add_ps(acc[r][i]);
            }
        }
    }
    out
}

/// The lane sums of eight vectors, reduced together: quarters of pairs, then quarters of
/// quads, then within quarters (23 operations, where eight separate reductions take 64:
/// the batched kernel over SmolLM2's 576-wide rows ran 6% faster).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sum8(v: [std::arch::x86_64::__m512; 8]) -> [f32; 8] {
    use std::arch::x86_64::*;
    // [a.q0 + a.q2, a.q1 + a.q3, b.q0 + b.q2, b.q1 + b.q3] for pairs (a, b).
    let pair = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        )
    };
    // Quarter q: four partial sums of vector q of the quad.
    let quad = |ab: __m512, cd: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(ab, cd),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, cd),
        )
    };
    let lo = quad(pair(v[0], v[1]), pair(v[2], v[3]));
    let hi = quad(pair(v[4], v[5]), pair(v[6], v[7]));
    // Quarter q: [lo0 + lo2, hi0 + hi2, lo1 + lo3, hi1 + hi3], then its halves summed.
    let w = _mm512_add_ps(_mm512_unpacklo_ps(lo, hi), _mm512_unpackhi_ps(lo, hi));
    let r = _mm512_add_ps(w, _mm512_permute_ps::<0b01_00_11_10>(w));
    let mut lanes = [0f32; 16];
    _mm512_storeu_ps(lanes.as_mut_ptr(), r);
    std::array::from_fn(|i| lanes[4 * (i % 4) + i / 4])
}

/// `row · x` with 16-lane vectors: a group's 32 integers are widened, multiplied with x, and
/// the group's scale multiplies their sum.
///
/// Weights are `a * q + m` (see `group`); the products sum as `Σ a·(Σ q·x) + Σ m·(Σ x)`, the
/// sums of x per half-group (`sums`) computed once per call. That is the dequantized matrix's
/// product regrouped, at f32 rounding like any other summation order, and it spends
/// one and a half vector operations per 16 weights where rebuilding each weight spends two:
/// on two cores, a one-row decode is bound by that arithmetic, not by memory.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dots_avx512<const K: u8>(row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let groups = x.len() / GROUP;
    // Two accumulators, for even and odd groups: each takes one dependent FMA per two groups.
    let mut acc = [_mm512_setzero_ps(); 2];
    // The offsets' share, per accumulator.
    let mut off = [0f32; 2];
    let mut g = 0;
    while g + 2 <= groups {
        group_step::<K>(row, x, sums, g, &mut acc[0], &mut off[0]);
        group_step::<K>(row, x, sums, g + 1, &mut acc[1], &mut off[1]);
        g += 2;
    }
    if g < groups {
        group_step::<K>(row, x, sums, g, &mut acc[0], &mut off[0]);
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) + (off[0] + off[1])
}

/// Group `g` of [`dots_avx512`] into one of its accumulators and offset sums.
///
/// # Safety
/// As [`dots_avx512`], whose features this compiles with (always inlined; a closure would
/// compile without them).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn group_step<const K: u8>(
    row: &[u8],
    x: &[f32],
    sums: &[f32],
    g: usize,
    acc: &mut std::arch::x86_64::__m512,
    off: &mut f32,
) {
    use std::arch::x86_64::*;
    let kind = QKind::from_id(K);
    prefetch_ahead(kind, row, g);
    let (f0, f1) = group::floats16(kind, row, g);
    let (a, m) = group::scales(kind, row, g);
    let xp = x.as_ptr().add(g * GROUP);
    let (x0, x1) = (_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16)));
    if kind.split_scales() {
        let t = _mm512_mul_ps(f0, x0);
        *acc = _mm512_fmadd_ps(_mm512_set1_ps(a[0]), t, *acc);
        let t = _mm512_mul_ps(f1, x1);
        *acc = _mm512_fmadd_ps(_mm512_set1_ps(a[1]), t, *acc);
    } else {
        let t = _mm512_fmadd_ps(f1, x1, _mm512_mul_ps(f0, x0));
        *acc = _mm512_fmadd_ps(_mm512_set1_ps(a[0]), t, *acc);
    }
    if kind.has_min() {
        let s = sums.as_ptr().add(2 * g);
        *off += if kind.split_scales() {
            m[0] * *s + m[1] * *s.add(1)
        } else {
            m[0] * (*s + *s.add(1))
        };
    }
}

/// Prefetches the weights 4 KiB past group `g` of `row` (rows further on): the hardware
/// prefetcher alone left a tenth of a decode step idle, and 1 KiB ahead still left the
/// widening waiting on its loads (SmolLM2 Q4_1 decode 122 -> 140-150 tok/s, Gemma 3 Q4_K_M
/// 51 -> 59-61; 8 KiB ahead was slower again).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch_ahead(kind: QKind, row: &[u8], g: usize) {
    use std::arch::x86_64::*;
    _mm_prefetch::<_MM_HINT_T0>(
        row.as_ptr()
            .wrapping_add(g * kind.block_bytes() * GROUP / kind.block_len() + 4096)
            as *const i8,
    );
}

/// One row written out as f32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant_avx2<const K: u8>(row: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let kind = QKind::from_id(K);
    for (g, y) in out.chunks_exact_mut(GROUP).enumerate() {
        for (i, w) in group::weights8(kind, row, g).into_iter().enumerate() {
            _mm256_storeu_ps(y.as_mut_ptr().add(8 * i), w);
        }
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;
    use crate::Generator;

    const KINDS: [QKind; 10] = QKind::ALL;

    /// Where each block type keeps its f16 scale fields (so random bytes there stay finite).
    fn f16_fields(kind: QKind) -> &'static [usize] {
        match kind {
            QKind::Q4_0 | QKind::Q5_0 | QKind::Q8_0 => &[0],
            QKind::Q4_1 | QKind::Q5_1 | QKind::Q4_K | QKind::Q5_K => &[0, 2],
            QKind::Q2_K => &[80, 82],
            QKind::Q3_K => &[108],
            QKind::Q6_K => &[208],
        }
    }

    /// Random blocks of `kind` (every bit pattern of quants and packed scales, finite f16
    /// scales) for a `[rows, cols]` matrix.
    fn random(kind: QKind, rows: usize, cols: usize, seed: u64) -> QMatrix {
        let mut g = Generator::new(seed);
        let bb = kind.block_bytes();
        let mut data = vec![0u8; rows * cols / kind.block_len() * bb];
        for blk in data.chunks_exact_mut(bb) {
            for b in blk.iter_mut() {
                *b = (g.next_f64() * 256.0) as u8;
            }
            for &at in f16_fields(kind) {
                let d = f16::from_f32((g.next_f64() as f32 - 0.5) * 0.1).to_bits();
                blk[at..at + 2].copy_from_slice(&d.to_le_bytes());
            }
        }
        QMatrix::new(QuantizedWeight {
            name: "w".into(),
            ggml: kind.ggml(),
            shape: vec![rows, cols],
            data,
        })
        .unwrap()
        .unwrap()
    }

    #[test]
    fn rows_dequantize_as_the_hub_does_and_products_match_f32() {
        crate::cpu::features::each_tier(|_tier| {
            for kind in KINDS {
                // Three blocks of 32, or two super-blocks of 256, per row.
                let (rows, cols) = (70, if kind.block_len() == 32 { 96 } else { 512 });
                let q = random(kind, rows, cols, 3);
                let hub = zoo_hub::gguf::dequantize(kind.ggml(), &q.data, rows * cols).unwrap();
                assert_eq!(
                    q.dequantize(),
                    hub,
                    "{kind:?}: bit-equal to the hub's dequantization"
                );

                let mut g = Generator::new(9);
                let x: Vec<f32> = (0..cols).map(|_| g.next_f64() as f32 - 0.5).collect();
                // One row: the 16-lane, 8-lane or scalar kernel, as the tier has it.
                let y = QMatrix::matvec_each(&[&q], &x, 1).remove(0);
                assert_products(&format!("{kind:?} one row"), &hub, &x, &y, rows);
                // A few rows block by block (1 to 4 per pass), and enough rows for the panels
                // (AMX tiles here; a 70-wide output zero-pads its last group).
                for m in [2, 5, 11, 20] {
                    let xs: Vec<f32> = (0..m * cols).map(|_| g.next_f64() as f32 - 0.5).collect();
                    let ys = QMatrix::matmul_t_each(&[&q], &xs, m).remove(0);
                    assert_products(&format!("{kind:?} m={m}"), &hub, &xs, &ys, rows);
                }
            }
        });
    }

    /// `ys` (`[m, rows]`) against f64 sums of `w` (`[rows, cols]`) times `xs` (`[m, cols]`),
    /// within f32 rounding of the terms' magnitudes.
    fn assert_products(what: &str, w: &[f32], xs: &[f32], ys: &[f32], rows: usize) {
        let cols = w.len() / rows;
        for (i, x) in xs.chunks_exact(cols).enumerate() {
            for r in 0..rows {
                let terms = (0..cols).map(|c| f64::from(w[r * cols + c]) * f64::from(x[c]));
                let want: f64 = terms.clone().sum();
                let scale: f64 = terms.map(f64::abs).sum();
                let got = f64::from(ys[i * rows + r]);
                assert!(
                    (got - want).abs() <= 1e-6 * (1.0 + scale),
                    "{what}: {i},{r}: {got} vs {want}"
                );
            }
        }
    }

    /// The row-block products (through `matmul_t_each`, AMX tiles where the CPU has them, and
    /// through the f32 kernels) against f64 sums over the hub's dequantized weights, for row
    /// counts that fill tiles partly, once and several times.
    #[test]
    fn products_of_many_rows_match_f64_sums() {
        crate::cpu::features::each_tier(|_tier| {
            #[cfg(target_arch = "x86_64")]
            eprintln!("AMX tiles: {}", crate::cpu::features::amx());
            for kind in KINDS {
                let (rows, cols) = (64, if kind.block_len() == 32 { 160 } else { 256 });
                let q = random(kind, rows, cols, 5);
                let w = q.dequantize();
                let mut g = Generator::new(17);
                // 150 rows: two row blocks of the AMX path, whose panels come in chunks.
                for m in [2, 16, 37, 150] {
                    let xs: Vec<f32> = (0..m * cols)
                        .map(|i| (g.next_f64() as f32 - 0.5) * if i % 7 == 0 { 300.0 } else { 1.0 })
                        .collect();
                    // The dispatching entry point (AMX where present; one input split shared by
                    // two products) and the f32 kernels.
                    let both = QMatrix::matmul_t_each(&[&q, &q], &xs, m);
                    assert_eq!(
                        both[0], both[1],
                        "{kind:?}: a shared split gives equal products"
                    );
                    // Weights of other heights in one call (a layer's q, k and v): each product
                    // is the one it has alone.
                    let taller = random(kind, 3 * rows + 5, cols, 6);
                    let mixed = QMatrix::matmul_t_each(&[&q, &taller, &q], &xs, m);
                    assert_eq!(mixed[0], both[0], "{kind:?} m={m}: first of three");
                    assert_eq!(mixed[2], both[0], "{kind:?} m={m}: last of three");
                    let alone = QMatrix::matmul_t_each(&[&taller], &xs, m).remove(0);
                    assert_eq!(mixed[1], alone, "{kind:?} m={m}: the taller weight");
                    let paths = [
                        ("matmul_t_each", both[0].clone()),
                        ("f32", q.matmul_t_f32(&xs, m)),
                    ];
                    for (path, ys) in paths {
                        assert_products(&format!("{kind:?} {path} m={m}"), &w, &xs, &ys, rows);
                    }
                }
            }
        });
    }

    /// A group's weights as registers hold the hub's f32 weights bit for bit, and its
    /// integers are the same with AVX-512 byte masks as with compares.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn group_registers_hold_the_hubs_weights() {
        crate::cpu::features::each_tier(|_tier| {
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
            unsafe fn ints_bw(kind: QKind, row: &[u8], g: usize) -> [i8; 32] {
                std::mem::transmute(group::ints::<true>(kind, row, g))
            }
            #[target_feature(enable = "avx2")]
            unsafe fn ints_cmp(kind: QKind, row: &[u8], g: usize) -> [i8; 32] {
                std::mem::transmute(group::ints::<false>(kind, row, g))
            }
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn narrow(kind: QKind, row: &[u8], g: usize) -> [f32; 32] {
                std::mem::transmute(group::weights8(kind, row, g))
            }
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
            unsafe fn table(kind: QKind, row: &[u8], g: usize) -> [f32; 32] {
                std::mem::transmute(group::weights16_by_table(kind, row, g))
            }
            for kind in KINDS {
                let (rows, cols) = (3, 512);
                let q = random(kind, rows, cols, 11);
                let hub = zoo_hub::gguf::dequantize(kind.ggml(), &q.data, rows * cols).unwrap();
                for r in 0..rows {
                    for g in 0..cols / GROUP {
                        let want: Vec<u32> = hub[r * cols + g * GROUP..][..GROUP]
                            .iter()
                            .map(|v| v.to_bits())
                            .collect();
                        let bits = |w: [f32; 32]| w.map(f32::to_bits).to_vec();
                        if features::avx512() {
                            // SAFETY: the features were detected.
                            let (a, b) = unsafe {
                                (ints_bw(kind, q.row(r), g), ints_cmp(kind, q.row(r), g))
                            };
                            assert_eq!(a, b, "{kind:?} byte-mask integers, row {r} group {g}");
                            if matches!(kind, QKind::Q4_0 | QKind::Q4_1) {
                                // SAFETY: as above.
                                let w = unsafe { table(kind, q.row(r), g) };
                                assert_eq!(bits(w), want, "{kind:?} by table, row {r} group {g}");
                            }
                        }
                        if features::avx2() {
                            // SAFETY: the features were detected.
                            let w = unsafe { narrow(kind, q.row(r), g) };
                            assert_eq!(bits(w), want, "{kind:?} 8-lane row {r} group {g}");
                        }
                    }
                }
            }
        });
    }

    #[test]
    fn out_of_range_ids_and_damaged_blocks_are_errors() {
        let q = random(QKind::Q8_0, 4, 32, 1);
        assert!(q.gather_rows(&[0, 3]).is_ok());
        assert!(q.gather_rows(&[4]).is_err());
        let bad = QMatrix::new(QuantizedWeight {
            name: "model.embed_tokens.weight".into(),
            ggml: GgmlType::Q8_0,
            shape: vec![4, 32],
            data: vec![0; 10],
        })
        .unwrap_err();
        assert!(
            bad.to_string().contains("model.embed_tokens.weight"),
            "{bad}"
        );
        // Rows that are not whole super-blocks, and activation formats, load as f32.
        for (ggml, cols) in [(GgmlType::Q6_K, 640), (GgmlType::Q8_K, 256)] {
            let kept_as_f32 = QMatrix::new(QuantizedWeight {
                name: "w".into(),
                ggml,
                shape: vec![1, cols],
                data: vec![0; 1],
            })
            .unwrap();
            assert!(kept_as_f32.is_none(), "{ggml:?}");
            assert!(!keeps_blocks(ggml, &[1, cols]));
        }
        assert!(keeps_blocks(GgmlType::Q6_K, &[1, 512]));
    }
}
