//! GGUF block-quantized weights kept as stored on the CPU, multiplied straight from their
//! blocks.
//!
//! A decode step reads every weight once, so its speed is the bytes it streams. A Q4_1 GGUF
//! loaded as f32 streams 6.4 times the bytes of its blocks; kept as blocks, each weight is
//! rebuilt in registers with exactly the arithmetic of [`zoo_hub::gguf::dequantize`]
//! (`d * q + m`, rounded as there) and multiplied in f32. The products are those of the
//! dequantized f32 matrix, summed in another order: f32 results, like transformers' on the
//! same file, at a fraction of the memory traffic and of the resident memory.
//!
//! Q4_0, Q4_1 and Q8_0 are kept; other block types load as f32 tensors. Only f32 loads on the
//! CPU use blocks (on PJRT devices, or in 16-bit, weights are plain tensors).

use crate::nn::QuantizedWeight;
use crate::{Device, Tensor};
use zoo_hub::GgmlType;

use crate::cpu::kernels::par_chunks;
use crate::{Error, Result};

/// The block types kept as blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QKind {
    Q4_0,
    Q4_1,
    Q8_0,
}

impl QKind {
    fn of(g: GgmlType) -> Option<QKind> {
        match g {
            GgmlType::Q4_0 => Some(QKind::Q4_0),
            GgmlType::Q4_1 => Some(QKind::Q4_1),
            GgmlType::Q8_0 => Some(QKind::Q8_0),
            _ => None,
        }
    }

    /// Bytes per block of 32 weights.
    fn block_bytes(self) -> usize {
        match self {
            QKind::Q4_0 => 18,
            QKind::Q4_1 => 20,
            QKind::Q8_0 => 34,
        }
    }
}

const BLOCK: usize = 32;

/// Whether a stored `ggml` tensor of HF shape `shape` stays as blocks when its matrix is
/// kept (what [`QMatrix::new`] accepts): what a load's resident bytes are counted from.
pub fn keeps_blocks(ggml: GgmlType, shape: &[usize]) -> bool {
    QKind::of(ggml).is_some() && matches!(shape, &[_, cols] if cols % BLOCK == 0)
}

/// Below this many rows, products rebuild each block once for all rows
/// ([`QMatrix::matvec_rows`]); from it on, the weights are unpacked into panels for the
/// tiles or the GEMM, which pays once the rows share it (measured crossover: 16 rows).
const FEW_ROWS: usize = 16;

/// A `[rows, cols]` matrix of quantized blocks, row-major, rows in HF order.
#[derive(Debug)]
pub(crate) struct QMatrix {
    ggml: GgmlType,
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
        if cols % BLOCK != 0 {
            return Ok(None);
        }
        let want = rows * cols / BLOCK * kind.block_bytes();
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
            ggml: w.ggml,
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
        self.cols / BLOCK * self.kind.block_bytes()
    }

    fn row(&self, r: usize) -> &[u8] {
        let n = self.row_bytes();
        &self.data[r * n..(r + 1) * n]
    }

    /// Row `r` as f32, exactly as `zoo_hub::gguf::dequantize` computes it.
    pub(crate) fn dequant_row(&self, r: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if has_avx2_fma() {
            // SAFETY: AVX2, FMA and F16C were detected; `out` holds the row's cols values.
            unsafe { dequant_avx2(self.kind, self.row(r), &mut out[..self.cols]) };
            return;
        }
        // Whole blocks of a kind `new` accepted: the hub's dequantizer cannot fail here.
        let _ = zoo_hub::gguf::dequantize_into(self.ggml, self.row(r), &mut out[..self.cols]);
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

    /// `x [m, cols] @ self^T` → `[m, rows]` for a few rows (a decode step, batched or not):
    /// each block is rebuilt once and multiplied with every row, so the weights stream from
    /// memory once per call whatever `m`. Many rows go through [`QMatrix::matmul_t_each`].
    pub(crate) fn matvec_rows(&self, x: &[f32], m: usize) -> Vec<f32> {
        let k = self.cols;
        // Weight row r's products with every x row, [rows][m]; transposed below.
        let mut yt = vec![0f32; self.rows * m];
        // Blocks of rows big enough to amortise scheduling, small enough to balance 2+ threads.
        const ROWS: usize = 64;
        let fast = has_avx2_fma();
        let wide = has_avx512();
        let xs: Vec<&[f32]> = x.chunks_exact(k).take(m).collect();
        par_chunks(&mut yt, ROWS * m, |c, ys| {
            #[cfg(target_arch = "x86_64")]
            if wide {
                // Up to four x rows per pass over the chunk's weight rows (still in cache for
                // the next pass): four accumulator pairs and the rebuilt block stay in
                // registers.
                for (g, xg) in xs.chunks(4).enumerate() {
                    let at = 4 * g;
                    // SAFETY: AVX-512F and F16C were detected; every weight row holds cols/32
                    // blocks and each x row cols values.
                    unsafe {
                        match *xg {
                            [a] => self.dots_rows(c * ROWS, [a], ys, m, at),
                            [a, b] => self.dots_rows(c * ROWS, [a, b], ys, m, at),
                            [a, b, d] => self.dots_rows(c * ROWS, [a, b, d], ys, m, at),
                            [a, b, d, e] => self.dots_rows(c * ROWS, [a, b, d, e], ys, m, at),
                            _ => unreachable!("chunks(4) yields 1 to 4 rows"),
                        }
                    }
                }
                return;
            }
            let mut w = vec![0f32; k];
            for (i, y) in ys.chunks_exact_mut(m).enumerate() {
                let r = c * ROWS + i;
                if fast && m == 1 {
                    // SAFETY: AVX2, FMA and F16C were detected; the row holds cols/32 blocks
                    // and `x` holds cols values.
                    #[cfg(target_arch = "x86_64")]
                    {
                        y[0] = unsafe { dot_avx2(self.kind, self.row(r), xs[0]) };
                        continue;
                    }
                }
                self.dequant_row(r, &mut w);
                for (y, xr) in y.iter_mut().zip(&xs) {
                    *y = w.iter().zip(*xr).map(|(a, b)| a * b).sum();
                }
            }
        });
        if m == 1 {
            return yt;
        }
        let n = self.rows;
        let mut y = vec![0f32; m * n];
        for (r, row) in yt.chunks_exact(m).enumerate() {
            for (i, v) in row.iter().enumerate() {
                y[i * n + r] = *v;
            }
        }
        y
    }

    /// Columns `at..at + R` of `ys` (`[weight rows][m]`, from weight row `r0`): each weight
    /// row's products with the `R` vectors `x`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn dots_rows<const R: usize>(
        &self,
        r0: usize,
        x: [&[f32]; R],
        ys: &mut [f32],
        m: usize,
        at: usize,
    ) {
        for (i, y) in ys.chunks_exact_mut(m).enumerate() {
            y[at..at + R].copy_from_slice(&dots_avx512(self.kind, self.row(r0 + i), x));
        }
    }

    /// `x [m, cols] @ wᵀ` → `[m, rows]` for each of several weights that take the same
    /// input (a layer's q, k and v projections; gate and up). A few rows: block by block
    /// ([`QMatrix::matvec_rows`]); many: on AMX tiles where the CPU has them (see `amx.rs`;
    /// the input is split for the tiles once), else with rows of weights rebuilt into f32
    /// panels for the GEMM kernel as it goes; no f32 matrix exists whole.
    pub(crate) fn matmul_t_each(ws: &[&QMatrix], x: &[f32], m: usize) -> Vec<Vec<f32>> {
        if m < FEW_ROWS {
            return ws.iter().map(|w| w.matvec_rows(x, m)).collect();
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(k) = ws.first().map(|w| w.cols) {
            let same = ws.iter().all(|w| w.cols == k);
            if let Some(split) = same.then(|| crate::cpu::amx::Split::new(x, m, k)).flatten() {
                return ws
                    .iter()
                    .map(|w| {
                        let fill = |g: usize, p: &mut crate::cpu::amx::Panel| w.fill_panel(g, p);
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
        // No fast kernel here: one f32 copy of the matrix for the runtime's GEMM.
        let w = self.dequantize();
        let mut y = vec![0f32; m * self.rows];
        par_chunks(&mut y, self.rows, |i, yr| {
            let xr = &x[i * k..(i + 1) * k];
            for (o, yv) in yr.iter_mut().enumerate() {
                *yv = w[o * k..(o + 1) * k]
                    .iter()
                    .zip(xr)
                    .map(|(a, b)| a * b)
                    .sum();
            }
        });
        y
    }

    /// Columns `g * 48 ..` (weight rows) of the AMX path: each block's quantized values as
    /// bf16 pairs, its scale and (Q4_1) minimum; columns past the last weight row as zeros.
    #[cfg(target_arch = "x86_64")]
    fn fill_panel(&self, g: usize, p: &mut crate::cpu::amx::Panel) {
        use crate::cpu::amx::GROUP;
        let bb = self.kind.block_bytes();
        let half = |b: &[u8], i: usize| f32::from(half::f16::from_le_bytes([b[i], b[i + 1]]));
        let cols = GROUP.min(self.rows - g * GROUP);
        p.scale.fill(0.0);
        p.min.fill(0.0);
        for c in 0..cols {
            for (b, blk) in self.row(g * GROUP + c).chunks_exact(bb).enumerate() {
                p.scale[b * GROUP + c] = half(blk, 0);
                if self.kind == QKind::Q4_1 {
                    p.min[b * GROUP + c] = half(blk, 2);
                }
            }
        }
        assert!(
            p.pairs.len() >= self.cols / 2 * GROUP,
            "a panel holds every k pair"
        );
        // SAFETY: the AMX path runs only where `amx::available` found AVX-512F and BW; only
        // existing rows are read and `pairs` holds cols / 2 * 48 values (asserted).
        unsafe { self.fill_pairs(g, cols, p.pairs) };
    }

    /// The quantized values of [`QMatrix::fill_panel`] for its first `cols` columns: per
    /// block and 16 columns, each column's 32 values become one register of bf16 pairs, and
    /// a 16 × 16 transpose turns those into the panel's k-pair rows.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn fill_pairs(&self, g: usize, cols: usize, pairs: &mut [u32]) {
        use crate::cpu::amx::{bf16_int, GROUP};
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
            }
        };
        let o = pairs.as_mut_ptr();
        for b in 0..self.cols / BLOCK {
            for ct in 0..GROUP / 16 {
                let mut r: [__m512i; 16] = std::array::from_fn(|c| {
                    if ct * 16 + c < cols {
                        column(self.row(g * GROUP + ct * 16 + c).as_ptr().add(b * bb))
                    } else {
                        _mm512_setzero_si512()
                    }
                });
                crate::cpu::kernels::transpose16(&mut r);
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

fn has_avx512() -> bool {
    crate::cpu::kernels::has_avx512() && has_avx2_fma()
}

thread_local! {
    /// Per-thread rows of one weight panel, rebuilt from blocks before packing.
    static PANEL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The block kernels also convert f16 scales with F16C.
fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::cpu::kernels::has_avx2_fma() && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The 32 weights of one block, in element order, as four 8-lane f32 vectors: the
/// dequantization's own arithmetic (`d * q + m` as a mul then an add, never fused).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn block_weights(kind: QKind, blk: &[u8]) -> [std::arch::x86_64::__m256; 4] {
    use std::arch::x86_64::*;
    // The block's f16 scale (and Q4_1's f16 minimum) through F16C: lanes 0 and 1.
    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([
        blk[0], blk[1], blk[2], blk[3],
    ])));
    let d = _mm256_broadcastss_ps(dm);
    match kind {
        QKind::Q4_0 | QKind::Q4_1 => {
            let off = if kind == QKind::Q4_0 { 2 } else { 4 };
            let low = _mm_set1_epi8(0x0f);
            let qs = _mm_loadu_si128(blk.as_ptr().add(off) as *const __m128i);
            let lo = _mm_and_si128(qs, low);
            let hi = _mm_and_si128(_mm_srli_epi16(qs, 4), low);
            let q = [
                _mm256_cvtepu8_epi32(lo),
                _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)),
                _mm256_cvtepu8_epi32(hi),
                _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)),
            ];
            if kind == QKind::Q4_0 {
                let eight = _mm256_set1_epi32(8);
                q.map(|q| _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, eight))))
            } else {
                let m = _mm256_broadcastss_ps(_mm_shuffle_ps::<0x55>(dm, dm));
                q.map(|q| _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(q)), m))
            }
        }
        QKind::Q8_0 => {
            let p = blk.as_ptr().add(2);
            [0, 8, 16, 24].map(|o| {
                let q = _mm_loadl_epi64(p.add(o) as *const __m128i);
                _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)))
            })
        }
    }
}

/// `row · x` for one row of blocks: each weight rebuilt in a register, then FMA'd with x.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(kind: QKind, row: &[u8], x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    for (b, blk) in row.chunks_exact(kind.block_bytes()).enumerate() {
        let xp = x.as_ptr().add(b * BLOCK);
        let w = block_weights(kind, blk);
        acc0 = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xp), acc0);
        acc1 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xp.add(8)), acc1);
        acc0 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xp.add(16)), acc0);
        acc1 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xp.add(24)), acc1);
    }
    crate::cpu::kernels::hsum256(_mm256_add_ps(acc0, acc1))
}

/// `row · x` for each of `R` vectors `x`, with 16-lane vectors: a block's 32 weights are
/// two registers, rebuilt once for all `R`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn dots_avx512<const R: usize>(kind: QKind, row: &[u8], x: [&[f32]; R]) -> [f32; R] {
    use std::arch::x86_64::*;
    let mut acc0 = [_mm512_setzero_ps(); R];
    let mut acc1 = [_mm512_setzero_ps(); R];
    for (b, blk) in row.chunks_exact(kind.block_bytes()).enumerate() {
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([
            blk[0], blk[1], blk[2], blk[3],
        ])));
        let d = _mm512_broadcastss_ps(dm);
        let (w0, w1) = match kind {
            QKind::Q4_0 | QKind::Q4_1 => {
                let off = if kind == QKind::Q4_0 { 2 } else { 4 };
                let low = _mm_set1_epi8(0x0f);
                let qs = _mm_loadu_si128(blk.as_ptr().add(off) as *const __m128i);
                let lo = _mm512_cvtepu8_epi32(_mm_and_si128(qs, low));
                let hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(qs, 4), low));
                // Q4_0: d * (q - 8); Q4_1: d * q + m (mul then add, as dequantized).
                let (lo, hi, m) = if kind == QKind::Q4_0 {
                    let eight = _mm512_set1_epi32(8);
                    let (lo, hi) = (_mm512_sub_epi32(lo, eight), _mm512_sub_epi32(hi, eight));
                    (lo, hi, None)
                } else {
                    (
                        lo,
                        hi,
                        Some(_mm512_broadcastss_ps(_mm_shuffle_ps::<0x55>(dm, dm))),
                    )
                };
                let w = |q: __m512i| {
                    let dq = _mm512_mul_ps(d, _mm512_cvtepi32_ps(q));
                    m.map_or(dq, |m| _mm512_add_ps(dq, m))
                };
                (w(lo), w(hi))
            }
            QKind::Q8_0 => {
                let p = blk.as_ptr().add(2) as *const __m128i;
                (
                    _mm512_mul_ps(
                        d,
                        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p))),
                    ),
                    _mm512_mul_ps(
                        d,
                        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(1)))),
                    ),
                )
            }
        };
        for i in 0..R {
            let xp = x[i].as_ptr().add(b * BLOCK);
            acc0[i] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xp), acc0[i]);
            acc1[i] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xp.add(16)), acc1[i]);
        }
    }
    std::array::from_fn(|i| _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i])))
}

/// One row of blocks written out as f32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant_avx2(kind: QKind, row: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::*;
    for (blk, y) in row
        .chunks_exact(kind.block_bytes())
        .zip(out.chunks_exact_mut(BLOCK))
    {
        for (i, w) in block_weights(kind, blk).into_iter().enumerate() {
            _mm256_storeu_ps(y.as_mut_ptr().add(8 * i), w);
        }
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;
    use crate::Generator;

    /// Random blocks of `kind` (finite f16 scales) for a `[rows, cols]` matrix.
    fn random(kind: QKind, rows: usize, cols: usize, seed: u64) -> QMatrix {
        let mut g = Generator::new(seed);
        let bb = kind.block_bytes();
        let mut data = vec![0u8; rows * cols / BLOCK * bb];
        for blk in data.chunks_exact_mut(bb) {
            for b in blk.iter_mut() {
                *b = (g.next_f64() * 256.0) as u8;
            }
            let d = f16::from_f32((g.next_f64() as f32 - 0.5) * 0.1).to_bits();
            blk[0..2].copy_from_slice(&d.to_le_bytes());
            if kind == QKind::Q4_1 {
                let m = f16::from_f32((g.next_f64() as f32 - 0.5) * 0.2).to_bits();
                blk[2..4].copy_from_slice(&m.to_le_bytes());
            }
        }
        let ggml = match kind {
            QKind::Q4_0 => GgmlType::Q4_0,
            QKind::Q4_1 => GgmlType::Q4_1,
            QKind::Q8_0 => GgmlType::Q8_0,
        };
        QMatrix::new(QuantizedWeight {
            name: "w".into(),
            ggml,
            shape: vec![rows, cols],
            data,
        })
        .unwrap()
        .unwrap()
    }

    #[test]
    fn rows_dequantize_as_the_hub_does_and_products_match_f32() {
        for kind in [QKind::Q4_0, QKind::Q4_1, QKind::Q8_0] {
            let (rows, cols) = (70, 96);
            let q = random(kind, rows, cols, 3);
            let ggml = match kind {
                QKind::Q4_0 => GgmlType::Q4_0,
                QKind::Q4_1 => GgmlType::Q4_1,
                QKind::Q8_0 => GgmlType::Q8_0,
            };
            let hub = zoo_hub::gguf::dequantize(ggml, &q.data, rows * cols).unwrap();
            assert_eq!(
                q.dequantize(),
                hub,
                "{kind:?}: bit-equal to the hub's dequantization"
            );

            let mut g = Generator::new(9);
            let x: Vec<f32> = (0..cols).map(|_| g.next_f64() as f32 - 0.5).collect();
            let y = q.matvec_rows(&x, 1);
            for (r, y) in y.iter().enumerate() {
                let want: f64 = (0..cols)
                    .map(|c| f64::from(hub[r * cols + c]) * f64::from(x[c]))
                    .sum();
                assert!(
                    (f64::from(*y) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{kind:?} row {r}"
                );
            }
            // A few rows block by block (1 to 4 per pass), and enough rows for the panels
            // (AMX tiles here; a 70-wide output zero-pads its last group).
            for m in [2, 5, 11, 20] {
                let xs: Vec<f32> = (0..m * cols).map(|_| g.next_f64() as f32 - 0.5).collect();
                let ys = QMatrix::matmul_t_each(&[&q], &xs, m).remove(0);
                for i in 0..m {
                    for r in 0..rows {
                        let want: f64 = (0..cols)
                            .map(|c| f64::from(hub[r * cols + c]) * f64::from(xs[i * cols + c]))
                            .sum();
                        let got = f64::from(ys[i * rows + r]);
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{kind:?} m={m} {i},{r}"
                        );
                    }
                }
            }
        }
    }

    /// The row-block products (through `matmul_t_each`, AMX tiles where the CPU has them, and
    /// through the f32 kernels) against f64 sums over the hub's dequantized weights, for row counts that fill tiles partly, once and several times.
    #[test]
    fn products_of_many_rows_match_f64_sums() {
        #[cfg(target_arch = "x86_64")]
        eprintln!("AMX tiles: {}", crate::cpu::amx::available());
        for kind in [QKind::Q4_0, QKind::Q4_1, QKind::Q8_0] {
            let (rows, cols) = (64, 160);
            let q = random(kind, rows, cols, 5);
            let w = q.dequantize();
            let mut g = Generator::new(17);
            for m in [2, 16, 37] {
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
                let paths = [
                    ("matmul_t_each", both[0].clone()),
                    ("f32", q.matmul_t_f32(&xs, m)),
                ];
                for (path, ys) in paths {
                    for i in 0..m {
                        for r in 0..rows {
                            let terms = (0..cols)
                                .map(|c| f64::from(w[r * cols + c]) * f64::from(xs[i * cols + c]));
                            let want: f64 = terms.clone().sum();
                            let scale: f64 = terms.map(f64::abs).sum();
                            let got = f64::from(ys[i * rows + r]);
                            assert!(
                                (got - want).abs() <= 1e-6 * (1.0 + scale),
                                "{kind:?} {path} m={m} {i},{r}: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
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
        let kept_as_f32 = QMatrix::new(QuantizedWeight {
            name: "w".into(),
            ggml: GgmlType::Q6_K,
            shape: vec![1, 256],
            data: vec![0; 210],
        })
        .unwrap();
        assert!(kept_as_f32.is_none());
    }
}
