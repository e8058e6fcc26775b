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
use crate::cpu::x86::{avx2_quant, avx512_quant};
#[cfg(target_arch = "x86_64")]
use group::monomorphic;
pub(crate) use group::{QKind, GROUP};

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

    pub(crate) fn kind(&self) -> QKind {
        self.kind
    }

    pub(crate) fn data(&self) -> &[u8] {
        &self.data
    }

    pub(crate) fn row_bytes(&self) -> usize {
        self.cols / self.kind.block_len() * self.kind.block_bytes()
    }

    pub(crate) fn row(&self, r: usize) -> &[u8] {
        let n = self.row_bytes();
        &self.data[r * n..(r + 1) * n]
    }

    /// Row `r` as f32, exactly as `zoo_hub::gguf::dequantize` computes it.
    pub(crate) fn dequant_row(&self, r: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if features::avx2() {
            // SAFETY: AVX2, FMA and F16C were detected; `out` holds the row's cols values.
            let (row, out) = (self.row(r), &mut out[..self.cols]);
            unsafe { monomorphic!(self.kind, |K| avx2_quant::dequant_row::<K>(row, out)) };
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
        // (see `avx512_quant::dots`; without AVX2, `dot_blocks` needs them for Q4_0 too): once per
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
                monomorphic!(self.kind, |K| avx512_quant::dots_rows::<K>(
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
                    1 => avx512_quant::rebuilt_rows::<K, 1>((blocks, row_bytes), [x(0)], at),
                    2 => avx512_quant::rebuilt_rows::<K, 2>((blocks, row_bytes), [x(0), x(1)], at),
                    3 | 4 => avx512_quant::rebuilt_rows::<K, 4>(
                        (blocks, row_bytes),
                        std::array::from_fn(x),
                        at
                    ),
                    _ => avx512_quant::rebuilt_rows::<K, 8>(
                        (blocks, row_bytes),
                        std::array::from_fn(x),
                        at
                    ),
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
                    1 => avx2_quant::rebuilt_rows::<K, 1>((blocks, row_bytes), [x(0)], at),
                    2 => avx2_quant::rebuilt_rows::<K, 2>((blocks, row_bytes), [x(0), x(1)], at),
                    3 | 4 => {
                        avx2_quant::rebuilt_rows::<K, 4>(
                            (blocks, row_bytes),
                            std::array::from_fn(x),
                            at,
                        )
                    }
                    _ => avx2_quant::rebuilt_rows::<K, 8>(
                        (blocks, row_bytes),
                        std::array::from_fn(x),
                        at
                    ),
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
            monomorphic!(self.kind, |K| avx2_quant::dots_rows::<K>(
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
        unsafe { avx512_quant::fill_pairs(self, g, cols, p) };
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

/// Where a pass of a batched decode kernel writes: the `[m, n]` output, `n`, the first weight row
/// of the block, the pass's first x row and how many of its x rows are real.
pub(crate) type PassOut = (OutPtr, usize, usize, usize, usize);

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
                std::mem::transmute(crate::cpu::x86::blocks::ints::<true>(kind, row, g))
            }
            #[target_feature(enable = "avx2")]
            unsafe fn ints_cmp(kind: QKind, row: &[u8], g: usize) -> [i8; 32] {
                std::mem::transmute(crate::cpu::x86::blocks::ints::<false>(kind, row, g))
            }
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn narrow(kind: QKind, row: &[u8], g: usize) -> [f32; 32] {
                std::mem::transmute(crate::cpu::x86::blocks::weights8(kind, row, g))
            }
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
            unsafe fn table(kind: QKind, row: &[u8], g: usize) -> [f32; 32] {
                std::mem::transmute(crate::cpu::x86::blocks::weights16_by_table(kind, row, g))
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
