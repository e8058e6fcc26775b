//! CPU fast paths for the products of `Linear` layers, attention and activations on f32 CPU
//! tensors (bf16 ones through [`super::bf16`]).
//!
//! With one token per row, every `Linear` is a matrix-vector product that reads each weight
//! once: its speed is the memory bandwidth. The runtime's eager matmul hands it to a GEMM
//! kernel that reaches about a third of the bandwidth for a single row, so on f32 CPU tensors
//! zoo-transformers runs those products here instead: AVX2/FMA dot products over four weight
//! rows at a time.
//!
//! A prefill multiplies many rows by each weight: there the runtime's GEMM uses 256-bit
//! vectors only, so on CPUs with AVX-512 [`matmul_wt`] runs a register-tiled 14×32 kernel,
//! k-blocked, over weight panels packed on the fly (each task packs its own panel, so nothing
//! is kept; [`matmul_wt_with`] takes the packing as a callback for other weight formats).
//! [`attention`] fuses scores, mask, softmax and the product with v (skipping fully masked
//! column ranges), [`silu_mul`] the MLP's `silu(gate) * up`, [`gelu_tanh`] the tanh GELU.
//!
//! Everything here runs on candle's own CPU thread pool (see [`par_units`]).
//!
//! Any other case (another device, dtype or layout, or a CPU without the instructions)
//! returns `None` and takes the runtime's path, so results never depend on this module.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::features;
use super::generic;
#[cfg(target_arch = "x86_64")]
use super::x86::avx512::Lane;
#[cfg(target_arch = "x86_64")]
use super::x86::{avx2, avx512};
use crate::{DType, Device, Tensor};

use crate::Result;

/// An element type of eager CPU storage that the fast paths borrow.
pub(crate) trait Stored: Sized + 'static {
    /// The values of `s` when it holds this type.
    fn slice(s: &candle_core::CpuStorage) -> Option<&[Self]>;
}

impl Stored for f32 {
    fn slice(s: &candle_core::CpuStorage) -> Option<&[f32]> {
        match s {
            candle_core::CpuStorage::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl Stored for half::bf16 {
    fn slice(s: &candle_core::CpuStorage) -> Option<&[half::bf16]> {
        match s {
            candle_core::CpuStorage::BF16(v) => Some(v),
            _ => None,
        }
    }
}

/// The contents of a contiguous eager CPU tensor of `T`, borrowed.
pub(crate) fn with_slice<T: Stored, R>(t: &Tensor, f: impl FnOnce(&[T]) -> R) -> Option<R> {
    let c = t.as_candle()?;
    let (storage, layout) = c.storage_and_layout();
    let (start, end) = layout.contiguous_offsets()?;
    match &*storage {
        candle_core::Storage::Cpu(s) => Some(f(&T::slice(s)?[start..end])),
        _ => None,
    }
}

/// The f32 contents of a contiguous eager CPU tensor, borrowed.
pub(crate) fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    with_slice(t, f)
}

/// Where row `r` (the last dim) of a layout starts in its storage: `r` indexed over the
/// leading dims against their strides. For any layout whose last dim is contiguous.
pub(crate) fn row_start(layout: &candle_core::Layout) -> impl Fn(usize) -> usize + Sync + '_ {
    let (dims, strides) = (layout.dims(), layout.stride());
    let lead = &dims[..dims.len().saturating_sub(1)];
    move |mut r: usize| {
        let mut o = layout.start_offset();
        for (d, s) in lead.iter().zip(strides).rev() {
            o += (r % d) * s;
            r /= d;
        }
        o
    }
}

/// `w [out, in] @ x [in]` for f32 CPU tensors (below AVX2 with [`generic::dots_few`]), or
/// `None` when this path does not apply.
pub(crate) fn matvec(w: &Tensor, x: &Tensor) -> Option<Result<Tensor>> {
    if w.rank() != 2 || x.elem_count() != w.shape()[1] {
        return None;
    }
    let (out, k) = (w.shape()[0], w.shape()[1]);
    let xv = with_f32(x, |v| v.to_vec())?;
    let (narrow, avx512) = (!features::avx2(), features::avx512());
    let y = with_f32(w, |wv| {
        let mut y = vec![0f32; out];
        let block = decode_rows_per_unit(out, 8);
        let yp = OutPtr(y.as_mut_ptr());
        par_units(out.div_ceil(block), |blk| {
            let (r0, r1) = (blk * block, ((blk + 1) * block).min(out));
            let rows = &wv[r0 * k..r1 * k];
            if narrow {
                // SAFETY: each block writes its own rows of y.
                unsafe { generic::dots_few::<1>(rows, [&xv], yp, out, (0, r0)) };
                return;
            }
            // SAFETY: AVX2 and FMA were detected above (AVX-512 where it is used); each block
            // writes its own rows of y.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                if avx512 {
                    avx512::dot_rows(rows, &xv, yp.part(r0, r1 - r0))
                } else {
                    avx2::dot_rows(rows, &xv, yp.part(r0, r1 - r0))
                }
            }
        });
        y
    })?;
    Some(Tensor::from_vec(y, &[out], &Device::Cpu))
}

/// `ys[r] = rows[r] · x` for each row of `rows` (row-major, `x.len()` columns), with the
/// widest vectors the tier has.
pub(crate) fn dot_rows(rows: &[f32], x: &[f32], ys: &mut [f32]) {
    assert!(rows.len() >= ys.len() * x.len(), "a row per output");
    #[cfg(target_arch = "x86_64")]
    if features::avx2() {
        // SAFETY: the features were detected; `rows` holds ys.len() rows of x.len() (asserted).
        unsafe {
            if features::avx512() {
                avx512::dot_rows(rows, x, ys)
            } else {
                avx2::dot_rows(rows, x, ys)
            }
        }
        return;
    }
    for (y, row) in ys.iter_mut().zip(rows.chunks_exact(x.len())) {
        *y = dot_lanes(row, x);
    }
}

/// `a · b` in eight independent partial sums, which the compiler keeps in vector registers
/// of any instruction set (a single running sum is one dependent chain it may not reorder).
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `x [m, k] @ w [n, k]^T` for f32 CPU tensors of 2 to [`FEW_ROWS`]` - 1` rows (a batch of
/// decode steps), or `None` when this path does not apply. The weight streams once in
/// memory order, as [`matvec`] reads it, instead of being packed per call for the tile
/// kernel: at a few rows the packing would cost more than the products. Each output is the
/// same dot product (16 lanes at `avx512`, 8 at `avx2`) a one-row call computes, so a row's
/// result does not depend on the batch it came in.
pub(crate) fn matmul_wt_few(x: &Tensor, w: &Tensor) -> Option<Result<Tensor>> {
    if x.rank() != 2 || w.rank() != 2 || x.shape()[1] != w.shape()[1] {
        return None;
    }
    let (narrow, wide) = (!features::avx2(), features::avx512());
    let (m, k, n) = (x.shape()[0], x.shape()[1], w.shape()[0]);
    if !(2..FEW_ROWS).contains(&m) {
        return None;
    }
    let y = with_f32(x, |xv| {
        with_f32(w, |wv| {
            let mut y: Vec<f32> = Vec::with_capacity(m * n);
            let yp = OutPtr(y.as_mut_ptr());
            // Blocks of weight rows that stay in L2 while the x rows pass over them.
            let block = decode_rows_per_unit(n, 4);
            par_units(n.div_ceil(block), |blk| {
                let (r0, r1) = (blk * block, ((blk + 1) * block).min(n));
                let rows = &wv[r0 * k..r1 * k];
                // Below AVX2: up to four x rows per pass, in the compiler's vectors.
                if narrow {
                    for (g, xs) in xv[..m * k].chunks(4 * k).enumerate() {
                        let row = |i: usize| &xs[i * k..(i + 1) * k];
                        let at = (4 * g, r0);
                        // SAFETY: each block writes columns r0..r1 of the rows of y it is
                        // given, which no other block writes.
                        unsafe {
                            match xs.len() / k {
                                1 => generic::dots_few::<1>(rows, [row(0)], yp, n, at),
                                2 => generic::dots_few::<2>(
                                    rows,
                                    std::array::from_fn(row),
                                    yp,
                                    n,
                                    at,
                                ),
                                3 => generic::dots_few::<3>(
                                    rows,
                                    std::array::from_fn(row),
                                    yp,
                                    n,
                                    at,
                                ),
                                _ => generic::dots_few::<4>(
                                    rows,
                                    std::array::from_fn(row),
                                    yp,
                                    n,
                                    at,
                                ),
                            }
                        }
                    }
                    return;
                }
                // The `avx2` tier: up to four x rows per pass against two weight rows
                // (eight accumulators of its sixteen registers).
                #[cfg(target_arch = "x86_64")]
                if !wide {
                    for (g, xs) in xv[..m * k].chunks(4 * k).enumerate() {
                        let row = |i: usize| &xs[i * k..(i + 1) * k];
                        let at = (4 * g, r0);
                        // SAFETY: AVX2 and FMA were detected above; each block writes
                        // columns r0..r1 of the rows of y it is given, which no other block
                        // writes.
                        unsafe {
                            match xs.len() / k {
                                1 => avx2::dots_few::<1, 2>(rows, [row(0)], yp, n, at),
                                2 => avx2::dots_few::<2, 2>(
                                    rows,
                                    std::array::from_fn(row),
                                    yp,
                                    n,
                                    at,
                                ),
                                3 => avx2::dots_few::<3, 2>(
                                    rows,
                                    std::array::from_fn(row),
                                    yp,
                                    n,
                                    at,
                                ),
                                _ => avx2::dots_few::<4, 2>(
                                    rows,
                                    std::array::from_fn(row),
                                    yp,
                                    n,
                                    at,
                                ),
                            }
                        }
                    }
                    return;
                }
                // Up to eight x rows per pass: the block streams from memory while the
                // products run (a second pass over it from L2 would leave that first pass
                // waiting on memory with the FMA units idle). Sixteen accumulators: four
                // weight rows by up to four x rows, or two by up to eight.
                for (g, xs) in xv[..m * k].chunks(8 * k).enumerate() {
                    let row = |i: usize| &xs[i * k..(i + 1) * k];
                    let at = (8 * g, r0);
                    // SAFETY: AVX-512F was detected above; each block writes columns
                    // r0..r1 of the rows of y it is given, which no other block writes.
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        match xs.len() / k {
                            1 => avx512::dots_few::<1, 4>(rows, [row(0)], yp, n, at),
                            2 => {
                                avx512::dots_few::<2, 4>(rows, std::array::from_fn(row), yp, n, at)
                            }
                            3 => {
                                avx512::dots_few::<3, 4>(rows, std::array::from_fn(row), yp, n, at)
                            }
                            4 => {
                                avx512::dots_few::<4, 4>(rows, std::array::from_fn(row), yp, n, at)
                            }
                            5 => {
                                avx512::dots_few::<5, 2>(rows, std::array::from_fn(row), yp, n, at)
                            }
                            6 => {
                                avx512::dots_few::<6, 2>(rows, std::array::from_fn(row), yp, n, at)
                            }
                            7 => {
                                avx512::dots_few::<7, 2>(rows, std::array::from_fn(row), yp, n, at)
                            }
                            8 => {
                                avx512::dots_few::<8, 2>(rows, std::array::from_fn(row), yp, n, at)
                            }
                            _ => unreachable!("chunks of 8 rows"),
                        }
                    }
                }
            });
            // SAFETY: the blocks wrote every column of every row.
            unsafe { y.set_len(m * n) };
            y
        })
    })??;
    Some(Tensor::from_vec(y, &[m, n], &Device::Cpu))
}

/// Rows below which [`matmul_wt_few`] takes a product instead of the packed tile kernel.
pub(crate) const FEW_ROWS: usize = 16;

/// Runs `f(unit)` for every unit in `0..n` on candle's CPU thread pool, handing units out
/// from a shared counter (a straggler on a busy machine is absorbed by the other threads).
///
/// Not rayon: candle's elementwise ops run on its own barrier pool, whose worker spins for a
/// while after each op; work handed to rayon's separate threads then shares the cores with
/// that spinning worker (the profile showed a fifth of prefill time in candle's barrier).
/// One pool for everything keeps exactly one busy thread per core.
pub(crate) fn par_units(n: usize, f: impl Fn(usize) + Sync) {
    let pool = candle_core::utils::barrier_pool();
    if n <= 1 || pool.n_workers() == 0 {
        (0..n).for_each(f);
        return;
    }
    let next = AtomicUsize::new(0);
    // The pool's threads run at the caller's tier (a test's `with_tier`).
    let cap = features::thread_cap();
    pool.execute(|_| {
        features::under_cap(cap, || loop {
            let u = next.fetch_add(1, Ordering::Relaxed);
            if u >= n {
                break;
            }
            f(u);
        })
    });
}

/// `f(i, chunk)` for each `chunk`-long piece of `out` (the last may be shorter), on the pool
/// of [`par_units`].
pub(crate) fn par_chunks(out: &mut [f32], chunk: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let (len, p) = (out.len(), OutPtr(out.as_mut_ptr()));
    let chunk = chunk.max(1);
    par_units(len.div_ceil(chunk), |i| {
        let (a, b) = (i * chunk, ((i + 1) * chunk).min(len));
        // SAFETY: the pieces are disjoint and inside `out`, which outlives the call.
        f(i, unsafe { p.part(a, b - a) })
    });
}

/// Weight rows per parallel unit of a decode product over `rows` rows, a multiple of `step`
/// (the kernel's rows per pass): big enough to amortise scheduling, small enough to balance
/// the threads. At most 64, fewer when that would give a thread under 8 units (a 576-row
/// projection in units of 64 is 9 units, 5 on one of two threads and 4 on the other).
pub(crate) fn decode_rows_per_unit(rows: usize, step: usize) -> usize {
    (rows / (8 * pool_threads())).clamp(8, 64) / step * step
}

/// Threads of the pool [`par_units`] runs on.
pub(crate) fn pool_threads() -> usize {
    candle_core::utils::barrier_pool().n_workers() + 1
}

/// Columns per packed weight panel: two 16-lane registers. A packed panel holds `NR` weight
/// rows (output columns) transposed: `k` groups of `NR` values, `packed[kk * NR + j] =
/// w[panel * NR + j][kk]`.
pub(crate) const NR: usize = 32;
/// Rows of the activation per register tile: 14 × 2 accumulators and the two panel
/// vectors use 30 of the 32 zmm registers (the activation is broadcast from memory).
pub(crate) const MR: usize = 14;
/// Rows of the activation per packed tile on AVX2: two register tiles of 6 rows × 16
/// columns (12 accumulators, two panel vectors and the broadcast: 15 of the 16 ymm registers).
pub(crate) const MR_AVX2: usize = 12;
/// Depth of one k block: a `KC × NR` slice of the panel (32 KiB) stays in L1 while every
/// row tile of the task passes over it.
const KC: usize = 256;
/// Fewer rows than this take the runtime's matmul (packing a panel per call does not pay).
const MIN_ROWS: usize = 8;

/// A pointer to a buffer shared by tasks that write disjoint parts of it.
pub(crate) struct OutPtr<T = f32>(pub(crate) *mut T);
// Copy whatever `T` is (a derive would ask `T: Copy`).
impl<T> Clone for OutPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for OutPtr<T> {}
// SAFETY: every task writes only the elements of its own part.
unsafe impl<T> Send for OutPtr<T> {}
unsafe impl<T> Sync for OutPtr<T> {}

impl<T> OutPtr<T> {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the raw field).
    pub(crate) fn get(self) -> *mut T {
        self.0
    }

    /// The `len` elements from `at` as one task's part.
    ///
    /// SAFETY: they lie inside the buffer, which outlives the part, and no other live part
    /// overlaps them.
    pub(crate) unsafe fn part<'a>(self, at: usize, len: usize) -> &'a mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(at), len)
    }
}

thread_local! {
    /// Per-thread scratch for packed panels, reused across calls.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Packs `rows` (up to [`NR`] weight rows of `k` values each) into one panel `out` of
/// `k * NR` values laid out `[k][NR]`; columns past `rows.len()` are zero. With AVX-512 the
/// transpose runs in 16 × 16 register blocks.
pub(crate) fn pack_rows(rows: &[&[f32]], k: usize, out: &mut [f32]) {
    assert!(rows.len() <= NR && out.len() >= k * NR && rows.iter().all(|r| r.len() >= k));
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if rows.len() == NR && features::avx512() {
        // SAFETY: AVX-512F was detected; every row holds k values and out k*NR (asserted).
        unsafe { avx512::pack(rows, k, out) };
        done = k / 16 * 16;
    } else if rows.len() == NR && features::avx2() {
        // SAFETY: AVX2 was detected; sizes as above.
        unsafe { avx2::pack_panel(rows, k, out) };
        done = k / 8 * 8;
    }
    for kk in done..k {
        let o = &mut out[kk * NR..kk * NR + NR];
        for (j, v) in o.iter_mut().enumerate() {
            *v = rows.get(j).map_or(0.0, |r| r[kk]);
        }
    }
}

/// `x [m, k] @ w [n, k]^T` (`nn.Linear` without bias) for f32 CPU tensors, or `None` when this
/// path does not apply (no AVX2, `n` not a multiple of 32, fewer than 8 rows, another
/// device, dtype or layout). On a CPU with AMX, from
/// [`F32_MIN_ROWS`](super::x86::amx_gemm::F32_MIN_ROWS) rows and a weight of
/// [`F32_MIN_WEIGHT`](super::x86::amx_gemm::F32_MIN_WEIGHT) values, the tile unit multiplies the
/// values' bf16 parts ([`super::x86::amx_gemm`]).
pub(crate) fn matmul_wt(x: &Tensor, w: &Tensor) -> Option<Result<Tensor>> {
    if x.rank() != 2 || w.rank() != 2 || x.shape()[1] != w.shape()[1] {
        return None;
    }
    let (m, k, n) = (x.shape()[0], x.shape()[1], w.shape()[0]);
    #[cfg(target_arch = "x86_64")]
    if m >= super::x86::amx_gemm::F32_MIN_ROWS && n * k >= super::x86::amx_gemm::F32_MIN_WEIGHT {
        use super::x86::amx_gemm::{matmul_wt as tiles, Operand};
        let tiled = with_f32(x, |a| {
            with_f32(w, |b| tiles(Operand::F32(a), Operand::F32(b), m, k, n))
        })??;
        if let Some(c) = tiled {
            return Some(Tensor::from_vec(c, &[m, n], &Device::Cpu));
        }
    }
    let c = with_f32(x, |a| {
        with_f32(w, |b| {
            matmul_wt_with(a, m, k, n, &|panel, out| {
                let rows: [&[f32]; NR] =
                    std::array::from_fn(|j| &b[(panel * NR + j) * k..(panel * NR + j + 1) * k]);
                pack_rows(&rows, k, out)
            })
        })
    })???;
    Some(Tensor::from_vec(c, &[m, n], &Device::Cpu))
}

/// The GEMM core of [`matmul_wt`]: `x [m, k]` (row-major) times a weight `[n, k]` whose
/// panels the caller supplies. `pack_panel(p, out)` must fill all of `out` (`k * NR` values)
/// with output columns `p * NR .. p * NR + NR` laid out as [`pack_rows`] writes them (it is
/// called once per panel and task, from several threads). Returns the `[m, n]` product, or
/// `None` without AVX2 (the `avx2` tier runs 6×16 register tiles, `avx512` 14×32), when `n`
/// is not a multiple of [`NR`] or `m` is below 8.
pub(crate) fn matmul_wt_with(
    x: &[f32],
    m: usize,
    k: usize,
    n: usize,
    pack_panel: &(dyn Fn(usize, &mut [f32]) + Sync),
) -> Option<Vec<f32>> {
    gemm(x, m, k, n, pack_panel, Dot::F32)
}

/// What one k step of the register tile multiplies.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dot {
    /// An f32 times an f32 (one FMA).
    F32,
    /// Each 32-bit value holds two bf16 of consecutive k (the lower k in the low half): one
    /// AVX-512 BF16 `vdpbf16ps` adds both products to the f32 sum.
    Bf16Pairs,
}

/// The driver of [`matmul_wt_with`], for either [`Dot`]: with [`Dot::Bf16Pairs`], `x`,
/// `k` and the panels count bf16 pairs (each f32 slot carries a pair's bits) and `None`
/// comes back without AVX-512 BF16.
pub(crate) fn gemm(
    x: &[f32],
    m: usize,
    k: usize,
    n: usize,
    pack_panel: &(dyn Fn(usize, &mut [f32]) + Sync),
    dot: Dot,
) -> Option<Vec<f32>> {
    if !n.is_multiple_of(NR) || m < MIN_ROWS || k == 0 || x.len() < m * k {
        return None;
    }
    // The register tile of the tier: AVX-512 keeps 14 rows × 32 columns in registers; AVX2's
    // 16 registers hold 6 rows × 16 columns, run twice per 12-row tile and panel.
    let mr = match dot {
        Dot::Bf16Pairs if features::avx512_bf16() => MR,
        Dot::F32 if features::avx512() => MR,
        Dot::F32 if features::avx2() => MR_AVX2,
        _ => return None,
    };
    let panels = n / NR;
    let tiles = m.div_ceil(mr);
    // Whole panels per task when there are enough of them to balance the threads; else each
    // panel's rows are split too (that panel is then packed once per task).
    let want = 4 * pool_threads();
    let chunks = if panels >= want {
        1
    } else {
        want.div_ceil(panels).min(tiles)
    };
    let chunk_rows = tiles.div_ceil(chunks) * mr;
    let chunks = m.div_ceil(chunk_rows);
    // The activation packed per row tile as [k][mr] (rows past m zero): the kernel then
    // broadcasts from one pointer at fixed offsets instead of computing MR row addresses.
    let mut ap: Vec<f32> = Vec::with_capacity(tiles * k * mr);
    let app = OutPtr(ap.as_mut_ptr());
    par_units(tiles, |tl| {
        // SAFETY: each tile writes its own k*mr values of ap.
        let dst = unsafe { app.part(tl * k * mr, k * mr) };
        let rows: [Option<&[f32]>; MR] = std::array::from_fn(|i| {
            let r = tl * mr + i;
            (i < mr && r < m).then(|| &x[r * k..r * k + k])
        });
        for (kk, d) in dst.chunks_exact_mut(mr).enumerate() {
            for (v, row) in d.iter_mut().zip(&rows) {
                *v = row.map_or(0.0, |row| row[kk]);
            }
        }
    });
    // SAFETY: the tiles above wrote all tiles*k*mr values.
    unsafe { ap.set_len(tiles * k * mr) };
    let mut c: Vec<f32> = Vec::with_capacity(m * n);
    let out = OutPtr(c.as_mut_ptr());
    // k in equal slices of at most KC (a slice of the panel and of the row tile stay in L1).
    let kc = k.div_ceil(k.div_ceil(KC));
    par_units(panels * chunks, |u| {
        let (panel, chunk) = (u / chunks, u % chunks);
        let (r0, r1) = (chunk * chunk_rows, ((chunk + 1) * chunk_rows).min(m));
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < k * NR {
                s.resize(k * NR, 0.0);
            }
            let packed = &mut s[..k * NR];
            pack_panel(panel, packed);
            let mut k0 = 0;
            while k0 < k {
                let kb = kc.min(k - k0);
                let mut r = r0;
                while r < r1 {
                    let rows = (r1 - r).min(mr);
                    // SAFETY: the tier's features were detected; x holds m*k values,
                    // `packed` k*NR, and the tile covers rows r..r+rows, columns
                    // panel*NR..+NR of the m*n output, which belong to this task only.
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        let t = Tile {
                            a: ap.as_ptr().add(r * k + k0 * mr),
                            lda: PACKED_A,
                            b: packed.as_ptr().add(k0 * NR),
                            ldb: NR,
                            depth: kb,
                            c: out.get().add(r * n + panel * NR),
                            ldc: n,
                            accumulate: k0 > 0,
                        };
                        match dot {
                            Dot::F32 if mr == MR_AVX2 => t.run_avx2(rows),
                            Dot::F32 => t.run(rows),
                            Dot::Bf16Pairs => t.run_pairs(rows),
                        }
                    }
                    r += rows;
                }
                k0 += kb;
            }
        });
    });
    // SAFETY: the tasks above wrote every element (each tile's first k block stores).
    unsafe { c.set_len(m * n) };
    Some(c)
}

/// `Tile::lda` of an activation packed as [`matmul_wt_with`] does: `a[kk * MR + i]`.
pub(crate) const PACKED_A: usize = usize::MAX;

/// One register tile `c[i][0..32] (+)= Σ_kk a[i * lda + kk] · b[kk * ldb + 0..32]` for the
/// first `rows` rows (`a[kk * MR + i]` when `lda` is [`PACKED_A`]).
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    pub(crate) a: *const f32,
    pub(crate) lda: usize,
    pub(crate) b: *const f32,
    pub(crate) ldb: usize,
    pub(crate) depth: usize,
    pub(crate) c: *mut f32,
    pub(crate) ldc: usize,
    /// Add to `c` instead of overwriting it.
    pub(crate) accumulate: bool,
}

/// Calls `$f::<R>($t)` for the tile's row count `$rows` (1 to [`MR`]).
macro_rules! by_rows {
    ($($f:ident)::+, $rows:expr, $t:expr) => {
        match $rows {
            14 => $($f)::+::<14>($t),
            13 => $($f)::+::<13>($t),
            12 => $($f)::+::<12>($t),
            11 => $($f)::+::<11>($t),
            10 => $($f)::+::<10>($t),
            9 => $($f)::+::<9>($t),
            8 => $($f)::+::<8>($t),
            7 => $($f)::+::<7>($t),
            6 => $($f)::+::<6>($t),
            5 => $($f)::+::<5>($t),
            4 => $($f)::+::<4>($t),
            3 => $($f)::+::<3>($t),
            2 => $($f)::+::<2>($t),
            1 => $($f)::+::<1>($t),
            _ => unreachable!("tiles have 1 to {MR} rows"),
        }
    };
}

impl Tile {
    /// SAFETY: AVX-512F must be available and every pointer valid for the extents above.
    #[cfg(target_arch = "x86_64")]
    unsafe fn run(self, rows: usize) {
        by_rows!(avx512::tile, rows, self)
    }

    /// [`Tile::run`] on AVX2 + FMA (`a` packed [`MR_AVX2`] rows wide, or rows `lda` apart):
    /// each half of the panel's 32 columns in 6-row register tiles.
    ///
    /// SAFETY: AVX2 and FMA must be available; pointers as for [`Tile::run`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn run_avx2(self, rows: usize) {
        // Packed rows are adjacent; others `lda` apart.
        let row_step = if self.lda == PACKED_A { 1 } else { self.lda };
        for half in 0..2 {
            let mut i = 0;
            while i < rows {
                let r = (rows - i).min(6);
                let t = Tile {
                    a: self.a.add(i * row_step),
                    b: self.b.add(half * 16),
                    c: self.c.add(i * self.ldc + half * 16),
                    ..self
                };
                match r {
                    6 => avx2::tile::<6>(t),
                    5 => avx2::tile::<5>(t),
                    4 => avx2::tile::<4>(t),
                    3 => avx2::tile::<3>(t),
                    2 => avx2::tile::<2>(t),
                    _ => avx2::tile::<1>(t),
                }
                i += r;
            }
        }
    }

    /// [`Tile::run`] where `wide` (AVX-512F), else [`Tile::run_avx2`].
    ///
    /// SAFETY: as the one it runs.
    #[cfg(target_arch = "x86_64")]
    unsafe fn run_tier(self, rows: usize, wide: bool) {
        if wide {
            self.run(rows)
        } else {
            self.run_avx2(rows)
        }
    }

    /// [`Tile::run`] over bf16 pairs ([`Dot::Bf16Pairs`]).
    ///
    /// SAFETY: as [`Tile::run`], and AVX-512 BF16 must be available.
    #[cfg(target_arch = "x86_64")]
    unsafe fn run_pairs(self, rows: usize) {
        by_rows!(avx512::tile_pairs, rows, self)
    }
}

/// Attention's probabilities times v for heads 8 or 16 wide, where the 32-wide [`Tile`]
/// would multiply zero padding (4x the work at 8): each output is a dot product along the
/// keys, 16 keys per register, of a probability row with a column of v (v transposed once
/// per call, [`NarrowPv::transpose`]), summed across lanes at the end. Probability rows are
/// read as stored, so no row addresses are recomputed per key.
pub(crate) struct NarrowPv {
    /// The first probability row, and the distance between rows.
    pub(crate) a: *const f32,
    pub(crate) lda: usize,
    /// The first column of v transposed (`[width][keys]`), and the distance between columns.
    pub(crate) vt: *const f32,
    pub(crate) ldvt: usize,
    pub(crate) depth: usize,
    pub(crate) c: *mut f32,
    pub(crate) ldc: usize,
}

impl NarrowPv {
    /// Head widths this kernel takes.
    fn fits(d: usize) -> bool {
        d == 8 || d == 16
    }

    /// v `[B, KV, L, D]` (strides `vs` of B, KV, L; D contiguous) as `[B·KV][D][L]`.
    fn transpose(v: &[f32], vs: [usize; 3], [b, kv, l, d]: [usize; 4]) -> Vec<f32> {
        let mut vt = vec![0f32; b * kv * d * l];
        let vtp = OutPtr(vt.as_mut_ptr());
        par_units(b * kv, |u| {
            // SAFETY: each (batch, kv head) fills its own d*l values.
            let dst = unsafe { vtp.part(u * d * l, d * l) };
            let base = (u / kv) * vs[0] + (u % kv) * vs[1];
            for j in 0..l {
                for (c, x) in v[base + j * vs[2]..][..d].iter().enumerate() {
                    dst[c * l + j] = *x;
                }
            }
        });
        vt
    }

    /// SAFETY: AVX-512F must be available where `wide`, else AVX2 and FMA; `a` valid for
    /// `rows` rows of `depth`, `vt` for `width` columns of `depth`, `c` for `rows` rows of
    /// `width`; `width` 8 or 16.
    #[cfg(target_arch = "x86_64")]
    unsafe fn run(self, rows: usize, width: usize, wide: bool) {
        let mut i = 0;
        while i < rows {
            let at = |p: *const f32, ld: usize| p.add(i * ld);
            let t = NarrowPv {
                a: at(self.a, self.lda),
                c: at(self.c, self.ldc).cast_mut(),
                ..self
            };
            if !wide {
                // One row, 8 columns at a time.
                for w in (0..width).step_by(8) {
                    avx2::narrow_pv8(t.a, (t.vt.add(w * t.ldvt), t.ldvt), t.depth, t.c.add(w));
                }
                i += 1;
                continue;
            }
            // Rows x width accumulators: 3 x 8 or 1 x 16 of the 32 registers.
            i += match (width, rows - i) {
                (8, 3..) => avx512::narrow_pv::<3, 8>(&t),
                (8, 2) => avx512::narrow_pv::<2, 8>(&t),
                (8, _) => avx512::narrow_pv::<1, 8>(&t),
                _ => avx512::narrow_pv::<1, 16>(&t),
            };
        }
    }
}

/// The f32 storage of an eager CPU tensor from its first element, with its strides.
fn with_f32_strided<R>(t: &Tensor, f: impl FnOnce(&[f32], &[usize]) -> R) -> Option<R> {
    if t.dtype() != DType::F32 || t.device() != Device::Cpu {
        return None;
    }
    let c = t.as_candle()?;
    let (storage, layout) = c.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => {
            Some(f(&v[layout.start_offset()..], layout.stride()))
        }
        _ => None,
    }
}

/// Eager attention, fused: `softmax(q kᵀ · scale + bias) v` with the heads concatenated,
/// for f32 CPU tensors `q [B, H, T, D]`, `k`, `v [B, KV, L, D]` (query head `h` reads kv
/// head `h / (H / KV)`, as `repeat_kv`) and the optional additive mask `bias [B, 1, T, L]`.
/// Returns `[B, T, H * D]` (what `o_proj` takes), or `None` when this path does not apply (no
/// AVX-512, a last dimension that is not contiguous). Scores live one tile of query rows at
/// a time, so a long sequence (a UNet's 4096 latent positions) never materialises its
/// `T x L` score matrix. Heads 8 or 16 wide (a reduced-width UNet's first levels) take the
/// probabilities times v as dot products along the keys ([`NarrowPv`]); another `D` that is not a
/// multiple of 32 runs with `v` zero-padded to one (the padded output columns are dropped).
///
/// The eager path's operations (product, scale, mask add, max, `exp(x - max)`, sum, product
/// with v, divide), with the division by the sum moved after the product with v, as
/// PyTorch's fused CPU attention does: `d` divisions per query instead of one per key (a
/// UNet's 4096 keys), the same value to rounding. Only the runs of columns whose mask is
/// above the lowest f32 are computed (runs less than two panels apart as one), which changes
/// nothing, since `exp(x + f32::MIN - max)` is exactly 0 in any row with one visible key (a
/// row with none is computed whole). For a causal prefill that halves the work and keeps the
/// scores in L1; a paged KV cache's row, whose blocks lie scattered over a pool shared with
/// other rows (`k`, `v` broadcast over the batch, packed once), costs its own blocks. A
/// one-query step (a decode) reads the keys where they lie instead of packing them
/// ([`avx512::dot_keys`]), with the query heads of each kv head together in one tile.
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<&Tensor>,
    scale: f64,
) -> Option<Result<Tensor>> {
    if q.rank() != 4 || k.rank() != 4 || v.rank() != 4 {
        return None;
    }
    let [b, h, t, d] = [0, 1, 2, 3].map(|i| q.shape()[i]);
    let [kb, kv, l, kd] = [0, 1, 2, 3].map(|i| k.shape()[i]);
    if kb != b || kd != d || v.shape() != k.shape() || kv == 0 || !h.is_multiple_of(kv) || l == 0 {
        return None;
    }
    if bias.is_some_and(|m| m.shape() != [b, 1, t, l]) || d == 0 || t == 0 {
        return None;
    }
    if !features::avx2() {
        // Below AVX2, a decode's attention only (see `decode`).
        return (t == 1).then(|| decode_attention(q, k, v, bias, [b, h, kv, l, d], scale))?;
    }
    let dv = if NarrowPv::fits(d) {
        d
    } else {
        d.div_ceil(NR) * NR
    };
    let padded;
    let v = if dv == d {
        v
    } else {
        padded = match v.pad(3, 0, dv - d, 0.0).and_then(|p| p.contiguous()) {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        &padded
    };
    let scale = scale as f32;
    let run = |bv: Option<(&[f32], &[usize])>| {
        with_f32_strided(q, |qv, qs| {
            with_f32_strided(k, |kv_, ks| {
                with_f32_strided(v, |vv, vs| {
                    if qs[3] != 1
                        || ks[3] != 1
                        || vs[3] != 1
                        || bv.is_some_and(|(_, bs)| bs[3] != 1)
                    {
                        return None;
                    }
                    let geo = AttnGeo {
                        b,
                        h,
                        kv,
                        t,
                        l,
                        d,
                        dv,
                        qs: [qs[0], qs[1], qs[2]],
                        vs: [vs[0], vs[1], vs[2]],
                        bs: bv.map_or([0, 0], |(_, bs)| [bs[0], bs[2]]),
                        scale,
                    };
                    Some(attention_f32(
                        &geo,
                        qv,
                        kv_,
                        [ks[0], ks[1], ks[2]],
                        vv,
                        bv.map(|x| x.0),
                    ))
                })
            })
        })
    };
    let out = match bias {
        Some(m) => with_f32_strided(m, |bv, bs| run(Some((bv, bs))))?????,
        None => run(None)????,
    };
    let out = Tensor::from_vec(out, &[b, t, h * dv], &Device::Cpu);
    if dv == d {
        return Some(out);
    }
    Some(out.and_then(|o| {
        o.reshape_to(&[b, t, h, dv])?
            .narrow(3, 0, d)?
            .reshape_to(&[b, t, h * d])
    }))
}

/// [`attention`] of one query per row on any CPU ([`super::decode`]), `None` where a last
/// dimension is not contiguous.
fn decode_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<&Tensor>,
    dims: [usize; 5],
    scale: f64,
) -> Option<Result<Tensor>> {
    let [b, h, ..] = dims;
    let d = dims[4];
    let three = |s: &[usize]| [s[0], s[1], s[2]];
    let run = |m: Option<(&[f32], [usize; 1])>| {
        with_f32_strided(q, |qv, qs| {
            with_f32_strided(k, |kv, ks| {
                with_f32_strided(v, |vv, vs| {
                    (qs[3] == 1 && ks[3] == 1 && vs[3] == 1).then(|| {
                        super::decode::attention(
                            (qv, three(qs)),
                            (kv, three(ks)),
                            (vv, three(vs)),
                            m,
                            dims,
                            scale as f32,
                        )
                    })
                })
            })
        })
    };
    let out = match bias {
        Some(m) => {
            with_f32_strided(m, |mv, ms| (ms[3] == 1).then(|| run(Some((mv, [ms[0]])))))??????
        }
        None => run(None)????,
    };
    Some(Tensor::from_vec(out, &[b, 1, h * d], &Device::Cpu))
}

/// Shapes and strides of one [`attention`] call.
struct AttnGeo {
    b: usize,
    h: usize,
    kv: usize,
    t: usize,
    l: usize,
    d: usize,
    /// Width of v's rows and of each head's output: `d` rounded up to a multiple of 32.
    dv: usize,
    /// q strides of B, H, T.
    qs: [usize; 3],
    /// v strides of B, KV, L.
    vs: [usize; 3],
    /// bias strides of B, T.
    bs: [usize; 2],
    scale: f32,
}

fn attention_f32(
    g: &AttnGeo,
    q: &[f32],
    k: &[f32],
    ks: [usize; 3],
    v: &[f32],
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let (b, h, kv, t, l, d, dv) = (g.b, g.h, g.kv, g.t, g.l, g.d, g.dv);
    let lp = l.div_ceil(NR);
    // The visible columns [lo, hi) of each mask row: outside them the mask is f32::MIN.
    let ranges: Vec<(usize, usize)> = (0..b * t)
        .map(|bt| {
            let Some(bias) = bias else {
                return (0, l);
            };
            let row = &bias[(bt / t) * g.bs[0] + (bt % t) * g.bs[1]..][..l];
            match row.iter().position(|&x| x != f32::MIN) {
                Some(lo) => (
                    lo,
                    l - row.iter().rev().position(|&x| x != f32::MIN).unwrap_or(0),
                ),
                None => (0, l),
            }
        })
        .collect();
    // The runs of visible columns of each mask row (a paged KV cache's row sees its own
    // blocks, scattered over the pool): `runs[at[bt]..at[bt + 1]]`.
    let (mut runs, mut at) = (Vec::new(), vec![0]);
    for (bt, &range) in ranges.iter().enumerate() {
        match bias {
            Some(bias) => {
                let row = &bias[(bt / t) * g.bs[0] + (bt % t) * g.bs[1]..][..l];
                visible_runs(row, range, &mut runs);
            }
            None => runs.push(range),
        }
        at.push(runs.len());
    }
    // A one-query step (a decode) takes its scores straight from the cached keys
    // (`dot_keys`): packing them for the GEMM tile would copy the whole cache every step to
    // serve one query row per head. Longer queries share keys packed once.
    let direct = t == 1;
    // Keys packed as the GEMM's weight panels: for each (batch, kv head), [L/32][D][32].
    // Not zero-filled first: the packing writes every value (padding included). Keys every
    // batch row shares (a paged KV cache's pool, broadcast with a zero stride) are packed
    // once.
    let shared = ks[0] == 0;
    let key_rows = if shared { 1 } else { b };
    let panels = if direct { 0 } else { key_rows * kv * lp };
    let mut kp: Vec<f32> = Vec::with_capacity(panels * d * NR);
    let kpp = OutPtr(kp.as_mut_ptr());
    par_units(panels, |u| {
        let (bg, p) = (u / lp, u % lp);
        let base = (bg / kv) * ks[0] + (bg % kv) * ks[1];
        let rows: Vec<&[f32]> = (p * NR..(p * NR + NR).min(l))
            .map(|j| &k[base + j * ks[2]..][..d])
            .collect();
        // SAFETY: each unit fills its own d*NR values of kp.
        let out = unsafe { kpp.part(u * d * NR, d * NR) };
        pack_rows(&rows, d, out);
    });
    // SAFETY: the units above wrote all the panels of d*NR values.
    unsafe { kp.set_len(panels * d * NR) };
    // Narrow heads multiply by v transposed (`NarrowPv`).
    let vt = (dv < NR).then(|| NarrowPv::transpose(v, g.vs, [b, kv, l, dv]));
    let mut o: Vec<f32> = Vec::with_capacity(b * t * h * dv);
    let op = OutPtr(o.as_mut_ptr());
    let rep = h / kv;
    let width = lp * NR;
    // The tier's kernels: 16 lanes, or 8 (`avx2`).
    let wide = features::avx512();
    // A one-query step's tile holds the query heads that share a kv head, so each key and
    // value loaded serves all of them (a grouped-query model's heads had each streamed the
    // same keys); otherwise a tile is up to MR positions of one head.
    let chunks = rep.div_ceil(MR);
    let tiles = t.div_ceil(MR);
    let units = if direct {
        b * kv * chunks
    } else {
        b * h * tiles
    };
    // Rows of a one-query tile are heads, qs[1] apart in q and dv in the output; otherwise
    // they are positions, qs[2] and h * dv apart.
    let (lda, ldc) = if direct {
        (g.qs[1], dv)
    } else {
        (g.qs[2], h * dv)
    };
    par_units(units, |u| {
        // The tile's batch row, first head, first position and rows.
        let (bi, h0, r0, n) = if direct {
            let (bi, rest) = (u / (kv * chunks), u % (kv * chunks));
            let h0 = rest / chunks * rep + rest % chunks * MR;
            (bi, h0, 0, MR.min(rep - rest % chunks * MR))
        } else {
            // Later query tiles see more keys: hand them out first so the last units are short.
            let (tile, bh) = (tiles - 1 - u / (b * h), u % (b * h));
            (bh / h, bh % h, tile * MR, MR.min(t - tile * MR))
        };
        let position = |i: usize| if direct { 0 } else { r0 + i };
        let rr: [(usize, usize); MR] = std::array::from_fn(|i| {
            if i < n {
                ranges[bi * t + position(i)]
            } else {
                (0, 0)
            }
        });
        let rr = &rr[..n];
        // The columns the tile computes: its rows' runs together, each from a panel's start.
        let mut tile_runs: Vec<(usize, usize)> = (0..n)
            .flat_map(|i| {
                let bt = bi * t + position(i);
                runs[at[bt]..at[bt + 1]].iter().copied()
            })
            .collect();
        tile_runs.sort_unstable();
        let tile_runs = merge_runs(tile_runs);
        let lo = tile_runs.first().map_or(0, |r| r.0);
        let hi_ = tile_runs.last().map_or(l, |r| r.1);
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < MR * width {
                s.resize(MR * width, 0.0);
            }
            let sc = s.as_mut_ptr();
            let kvh = bi * kv + h0 / rep;
            let packed = if shared { h0 / rep } else { kvh };
            // SAFETY: AVX2 and FMA (AVX-512F where `wide`) were detected by `attention`; the
            // pointers stay inside q, the packed keys, v, the scratch (MR rows of `width`) and
            // this tile's rows of the output, which no other unit writes.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                let qp = q.as_ptr().add(bi * g.qs[0] + h0 * g.qs[1] + r0 * g.qs[2]);
                if direct {
                    let kb = k.as_ptr().add(bi * ks[0] + (h0 / rep) * ks[1]);
                    for &run in &tile_runs {
                        let args = ((qp, lda, n), (kb, ks[2], d), run, (sc, width));
                        if wide {
                            avx512::dot_keys(args.0, args.1, args.2, args.3);
                        } else {
                            avx2::dot_keys(args.0, args.1, args.2, args.3);
                        }
                    }
                } else {
                    let panels = tile_runs.iter().flat_map(|&(a, b)| a / NR..b.div_ceil(NR));
                    for p in panels {
                        Tile {
                            a: qp,
                            lda,
                            b: kp.as_ptr().add((packed * lp + p) * d * NR),
                            ldb: NR,
                            depth: d,
                            c: sc.add(p * NR),
                            ldc: width,
                            accumulate: false,
                        }
                        .run_tier(n, wide);
                    }
                }
                let mut sums = [0f32; MR];
                for (i, &(rlo, rhi)) in rr.iter().enumerate() {
                    let brow = match bias {
                        Some(bias) => bias.as_ptr().add(bi * g.bs[0] + position(i) * g.bs[1]),
                        None => std::ptr::null(),
                    };
                    let row = sc.add(i * width);
                    sums[i] = softmax_runs(row, brow, g.scale, &tile_runs, (rlo, rhi), wide);
                    if vt.is_some() {
                        // The narrow product reads every column of [lo, hi): none between runs.
                        for w in tile_runs.windows(2) {
                            std::ptr::write_bytes(row.add(w[0].1), 0, w[1].0 - w[0].1);
                        }
                    }
                }
                let vp = v
                    .as_ptr()
                    .add(bi * g.vs[0] + (h0 / rep) * g.vs[1] + lo * g.vs[2]);
                let out = op.get().add((bi * t + r0) * h * dv + h0 * dv);
                if let Some(vt) = &vt {
                    NarrowPv {
                        a: sc.add(lo),
                        lda: width,
                        vt: vt.as_ptr().add(kvh * dv * l + lo),
                        ldvt: l,
                        depth: hi_ - lo,
                        c: out,
                        ldc,
                    }
                    .run(n, dv, wide);
                }
                for p in 0..dv / NR {
                    for (r, &(a, b)) in tile_runs.iter().enumerate() {
                        Tile {
                            a: sc.add(a),
                            lda: width,
                            b: vp.add(p * NR + (a - lo) * g.vs[2]),
                            ldb: g.vs[2],
                            depth: b - a,
                            c: out.add(p * NR),
                            ldc,
                            accumulate: r > 0,
                        }
                        .run_tier(n, wide);
                    }
                }
                // The softmax's division, on the row's dv outputs instead of its keys.
                for (i, sum) in sums.iter().enumerate().take(n) {
                    if wide {
                        avx512::divide(out.add(i * ldc), dv, *sum);
                    } else {
                        avx2::divide(out.add(i * ldc), dv, *sum);
                    }
                }
            }
        });
    });
    // SAFETY: every (batch, position, head) tile wrote its dv values above.
    unsafe { o.set_len(b * t * h * dv) };
    o
}

/// Columns between two runs of visible keys below which the runs are computed as one: a
/// masked column costs less than another pass.
const RUN_GAP: usize = 2 * NR;

/// Appends the runs of visible columns (mask above `f32::MIN`) of a mask `row` whose first
/// and last visible columns are `range`, runs less than [`RUN_GAP`] apart joined.
pub(crate) fn visible_runs(row: &[f32], (lo, hi): (usize, usize), out: &mut Vec<(usize, usize)>) {
    let mut start: Option<usize> = None;
    let first = out.len();
    for (j, &x) in row.iter().enumerate().take(hi).skip(lo) {
        match (x != f32::MIN, start) {
            (true, None) => start = Some(j),
            (false, Some(a)) => {
                out.push((a, j));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(a) = start {
        out.push((a, hi));
    }
    if out.len() == first {
        out.push((lo, hi));
    }
    // Join runs closer than RUN_GAP.
    let mut w = first;
    for r in first + 1..out.len() {
        if out[r].0 - out[w].1 < RUN_GAP {
            out[w].1 = out[r].1;
        } else {
            w += 1;
            out[w] = out[r];
        }
    }
    out.truncate(w + 1);
}

/// Sorted runs joined where they overlap or lie less than [`RUN_GAP`] apart, each starting
/// at a panel's first column (the tile's product reads whole panels of keys).
fn merge_runs(sorted: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(sorted.len());
    for (a, b) in sorted {
        let a = a / NR * NR;
        match out.last_mut() {
            Some(last) if a < last.1 + RUN_GAP => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// One row of scores `s` in place, over the tile's `runs` of columns: `s[j] * scale +
/// bias[j]`, then `exp(s[j] - max)` over the row's visible `[rlo, rhi)` within them and
/// zero in the rest of the runs (columns the tile's product reads); returns the sum of the
/// exponentials, the softmax's divisor. Columns between runs are neither read nor written.
///
/// # Safety
/// AVX-512F (`wide`) or AVX2 and FMA are available; the runs lie within the row and `bias`.
#[cfg(target_arch = "x86_64")]
unsafe fn softmax_runs(
    s: *mut f32,
    bias: *const f32,
    scale: f32,
    runs: &[(usize, usize)],
    (rlo, rhi): (usize, usize),
    wide: bool,
) -> f32 {
    let clip = |(a, b): (usize, usize)| (a.max(rlo), b.min(rhi));
    let mut max = f32::NEG_INFINITY;
    for &run in runs {
        let (a, b) = clip(run);
        if a < b {
            max = max.max(if wide {
                avx512::scale_max(s, bias, scale, (a, b))
            } else {
                avx2::scale_max(s, bias, scale, (a, b))
            });
        }
    }
    let mut sum = 0.0;
    for &(a0, b0) in runs {
        let (a, b) = clip((a0, b0));
        if a < b {
            sum += if wide {
                avx512::exp_sum(s, max, (a, b))
            } else {
                avx2::exp_sum(s, max, (a, b))
            };
        }
        for j in (a0..a.min(b0)).chain(b.max(a0)..b0) {
            *s.add(j) = 0.0;
        }
    }
    sum
}

/// Cephes' `expf` reduction: ln 2 in two parts (`x - n·ln 2` stays exact to f32).
pub(crate) const EXP_LN2: (f32, f32) = (0.693_359_4, -2.121_944_4e-4);
/// Cephes' `expf` polynomial in the reduced argument, highest power first (then `r + 1`).
pub(crate) const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `silu(g) * u` (`LlamaMLP`'s `act_fn(gate) * up`) for f32 or bf16 CPU tensors of one
/// shape, as PyTorch computes it (`g / (1 + e^-g)`, rounded to the dtype, then the product),
/// in one pass; `None` when this path does not apply.
pub(crate) fn silu_mul(g: &Tensor, u: &Tensor) -> Option<Result<Tensor>> {
    if g.shape() != u.shape() || g.dtype() != u.dtype() || !features::avx2() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    if !features::avx512() {
        // The `avx2` tier: f32 only (bf16 takes the composite).
        let y = with_f32(g, |gv| {
            with_f32(u, |uv| {
                elementwise(gv.len(), |a, e, out| {
                    // SAFETY: AVX2 and FMA were detected; `out` holds e - a values.
                    unsafe { avx2::silu_mul(&gv[a..e], &uv[a..e], out) }
                })
            })
        })??;
        return Some(Tensor::from_vec(y, g.shape(), &Device::Cpu));
    }
    #[cfg(target_arch = "x86_64")]
    {
        fn run<T: Lane>(g: &[T], u: &[T], shape: &[usize]) -> Result<Tensor> {
            let y = elementwise(g.len(), |a, e, out| {
                // SAFETY: AVX-512F was detected; `out` holds e - a values.
                unsafe { avx512::silu_mul(&g[a..e], &u[a..e], out) }
            });
            Tensor::from_vec(y, shape, &Device::Cpu)
        }
        match g.dtype() {
            DType::F32 => with_f32(g, |gv| with_f32(u, |uv| run(gv, uv, g.shape())))?,
            DType::BF16 => with_slice(g, |gv: &[half::bf16]| {
                with_slice(u, |uv| run(gv, uv, g.shape()))
            })?,
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Tanh-approximated GELU (`0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`, PyTorch's
/// `gelu(approximate="tanh")`) of an f32 or bf16 CPU tensor in one vectorised pass (bf16
/// widened per element and rounded once, as PyTorch does), `tanh(u)` as `1 - 2 / (e^{2u} +
/// 1)` with [`avx512::exp512`] (the scalar libm `tanhf` took a sixth of a Flux step); `None` when
/// this path does not apply.
pub(crate) fn gelu_tanh(x: &Tensor) -> Option<Result<Tensor>> {
    #[cfg(target_arch = "x86_64")]
    return lanes(
        x,
        avx2::gelu_tanh,
        avx512::gelu_tanh::<f32>,
        avx512::gelu_tanh::<half::bf16>,
    );
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Exact GELU (`0.5 x (1 + erf(x / sqrt 2))`, PyTorch's `gelu`) of an f32 or bf16 CPU
/// tensor in one vectorised pass, `erf` as PyTorch's own vectorised kernels compute it (the
/// scalar libm `erff` took a quarter of an encoder's forward); `None` when this path does not
/// apply.
pub(crate) fn gelu_erf(x: &Tensor) -> Option<Result<Tensor>> {
    #[cfg(target_arch = "x86_64")]
    return lanes(
        x,
        avx2::gelu_erf,
        avx512::gelu_erf::<f32>,
        avx512::gelu_erf::<half::bf16>,
    );
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Below this, `expf`'s result is +0 (the true value is under 2^-150, so any correctly
/// rounding library gives +0); it is glibc's own bound for its underflow path.
const EXP_ZERO: f32 = -103.972_08;

/// `exp` of a contiguous f32 or bf16 CPU tensor on the pool, every value as candle computes
/// it (the C library's `expf`, bf16 widened and rounded once), except that a value below
/// [`EXP_ZERO`] is written as +0 without the call: the library reaches those through its
/// underflow path (a raised flag, `errno`) at ten times a value's cost, and a masked softmax
/// has one per masked score (the attention composite, wherever no fused kernel runs: a
/// sixth of a 512-token prefill below AVX2). Bit for bit candle's result, at every tier.
pub(crate) fn exp(x: &candle_core::Tensor) -> Option<candle_core::Result<candle_core::Tensor>> {
    use candle_core::{CpuStorage as S, Storage};
    fn run<T: Copy + Send + Sync + candle_core::WithDType>(
        v: &[T],
        shape: &candle_core::Shape,
        wide: fn(T) -> f32,
        narrow: fn(f32) -> T,
    ) -> candle_core::Result<candle_core::Tensor> {
        let y = elementwise(v.len(), |a, e, out: *mut T| {
            for (i, &x) in v[a..e].iter().enumerate() {
                let x = wide(x);
                let y = if x < EXP_ZERO { 0.0 } else { x.exp() };
                // SAFETY: `out` holds the e - a values a..e.
                unsafe { out.add(i).write(narrow(y)) };
            }
        });
        candle_core::Tensor::from_vec(y, shape, &candle_core::Device::Cpu)
    }
    let (storage, layout) = x.storage_and_layout();
    let (s, e) = layout.contiguous_offsets()?;
    match &*storage {
        Storage::Cpu(S::F32(v)) => Some(run(&v[s..e], x.shape(), |x| x, |y| y)),
        Storage::Cpu(S::BF16(v)) => Some(run(
            &v[s..e],
            x.shape(),
            half::bf16::to_f32,
            half::bf16::from_f32,
        )),
        _ => None,
    }
}

/// One elementwise kernel's pass over an f32 or bf16 CPU tensor on the pool, with the tier's
/// kernel: `narrow` (f32 only: bf16 takes the composite) at `avx2`, the `wide` pair at
/// `avx512`; `None` below AVX2 or for another dtype.
#[cfg(target_arch = "x86_64")]
fn lanes(
    x: &Tensor,
    narrow: unsafe fn(&[f32], *mut f32),
    wide: unsafe fn(&[f32], *mut f32),
    wide_bf16: unsafe fn(&[half::bf16], *mut half::bf16),
) -> Option<Result<Tensor>> {
    fn run<T: Lane>(x: &[T], shape: &[usize], f: unsafe fn(&[T], *mut T)) -> Result<Tensor> {
        let y = elementwise(x.len(), |a, e, out| {
            // SAFETY: the caller checked the tier `f` needs; `out` holds e - a values.
            unsafe { f(&x[a..e], out) }
        });
        Tensor::from_vec(y, shape, &Device::Cpu)
    }
    if !features::avx2() {
        return None;
    }
    if !features::avx512() {
        return with_f32(x, |v| run(v, x.shape(), narrow));
    }
    match x.dtype() {
        DType::F32 => with_f32(x, |v| run(v, x.shape(), wide)),
        DType::BF16 => with_slice(x, |v: &[half::bf16]| run(v, x.shape(), wide_bf16)),
        _ => None,
    }
}

/// `n` outputs computed in chunks of 16K values on the pool (see [`par_fill`]).
fn elementwise<T>(n: usize, f: impl Fn(usize, usize, *mut T) + Sync) -> Vec<T> {
    par_fill(n, 16 * 1024, f)
}

/// `n` outputs computed on the pool in chunks of `chunk` values (the last shorter): `f(a, e,
/// out)` must write all `e - a` values of `out`, the outputs `a..e`. No zero-fill first.
pub(crate) fn par_fill<T>(
    n: usize,
    chunk: usize,
    f: impl Fn(usize, usize, *mut T) + Sync,
) -> Vec<T> {
    let chunk = chunk.max(1);
    let mut y: Vec<T> = Vec::with_capacity(n);
    let yp = OutPtr(y.as_mut_ptr());
    par_units(n.div_ceil(chunk), |c| {
        let (a, e) = (c * chunk, (c * chunk + chunk).min(n));
        // SAFETY: the chunks are disjoint ranges inside y's capacity.
        f(a, e, unsafe { yp.get().add(a) })
    });
    // SAFETY: the chunks wrote all n values.
    unsafe { y.set_len(n) };
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::features::{taken, Tier};
    use crate::Generator;

    #[test]
    fn gelu_erf_is_within_pytorchs_erf_of_the_exact_one() {
        crate::cpu::features::each_tier(|tier| {
            let mut g = Generator::new(17);
            for n in [1usize, 17, 40000] {
                let x = g
                    .randn(&[n], DType::F32, &Device::Cpu)
                    .unwrap()
                    .mul_scalar(4.0)
                    .unwrap();
                let Some(fast) = taken(gelu_erf(&x), tier >= Tier::Avx2, "gelu_erf") else {
                    continue;
                };
                let fast = fast.unwrap().to_vec::<f32>().unwrap();
                let xs = x.to_vec::<f32>().unwrap();
                for (f, v) in fast.iter().zip(&xs) {
                    let v64 = f64::from(*v);
                    let want = 0.5 * v64 * (1.0 + libm::erf(v64 / std::f64::consts::SQRT_2));
                    // erf within 1.5e-7 (Abramowitz and Stegun 7.1.26), then f32 rounding.
                    assert!(
                        (f64::from(*f) - want).abs()
                            <= 2e-7 * (1.0 + v64.abs()) + 1e-6 * want.abs(),
                        "gelu({v}) = {f}, want {want}"
                    );
                }
            }
        });
    }

    /// `exp` gives candle's bits for every kind of value: masked scores (the dtype's lowest,
    /// -inf), both sides of the underflow bound, subnormal results, overflow, NaN; f32 and
    /// bf16, a tensor larger than one chunk.
    #[test]
    fn exp_equals_candles_bit_for_bit() {
        let mut g = Generator::new(31);
        let mut v: Vec<f32> = (0..40_000)
            .map(|_| (g.next_f64() as f32 - 0.75) * 300.0)
            .collect();
        let bound = EXP_ZERO;
        v.extend([
            f32::MIN,
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            bound,
            f32::from_bits(bound.to_bits() - 1),
            f32::from_bits(bound.to_bits() + 1),
            -103.0,
            -87.5,
            89.0,
            -0.0,
        ]);
        let x =
            candle_core::Tensor::from_vec(v.clone(), v.len(), &candle_core::Device::Cpu).unwrap();
        for x in [x.clone(), x.to_dtype(candle_core::DType::BF16).unwrap()] {
            let bits = |t: candle_core::Tensor| -> Vec<u32> {
                let t = t.to_dtype(candle_core::DType::F32).unwrap();
                t.to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            let fast = exp(&x).expect("contiguous CPU floats").unwrap();
            assert_eq!(bits(fast), bits(x.exp().unwrap()), "{:?}", x.dtype());
        }
        let strided = x
            .narrow(0, 0, 40_000)
            .unwrap()
            .reshape((200, 200))
            .unwrap()
            .t()
            .unwrap();
        assert!(exp(&strided).is_none(), "a strided tensor is candle's");
    }

    #[test]
    fn gelu_tanh_matches_the_runtime_op() {
        crate::cpu::features::each_tier(|tier| {
            let mut g = Generator::new(13);
            for n in [1usize, 17, 40000] {
                let x = g
                    .randn(&[n], DType::F32, &Device::Cpu)
                    .unwrap()
                    .mul_scalar(6.0)
                    .unwrap();
                let Some(fast) = taken(gelu_tanh(&x), tier >= Tier::Avx2, "gelu_tanh") else {
                    continue;
                };
                let fast = fast.unwrap().to_vec::<f32>().unwrap();
                let xs = x.to_vec::<f32>().unwrap();
                for (f, v) in fast.iter().zip(&xs) {
                    let want = 0.5
                        * v
                        * (1.0
                            + ((2.0f32 / std::f32::consts::PI).sqrt()
                                * (v + 0.044715 * v * v * v))
                                .tanh());
                    assert!(
                        (f - want).abs() <= 2e-6 * (1.0 + want.abs()),
                        "gelu_tanh({v}) = {f}, want {want}"
                    );
                }
            }
        });
    }

    #[test]
    fn matmul_wt_matches_the_runtime_matmul() {
        crate::cpu::features::each_tier(|tier| {
            let mut g = Generator::new(5);
            for (m, k, n) in [
                (8usize, 5usize, 32usize),
                (13, 64, 64),
                (512, 96, 96),
                (9, 1, 32),
                (29, 600, 64),
                (40, 1536, 192),
                (130, 576, 608),
            ] {
                let x = g.randn(&[m, k], DType::F32, &Device::Cpu).unwrap();
                let w = g.randn(&[n, k], DType::F32, &Device::Cpu).unwrap();
                let Some(fast) = taken(matmul_wt(&x, &w), tier >= Tier::Avx2, "matmul_wt") else {
                    continue;
                };
                let fast = fast.unwrap().to_vec::<f32>().unwrap();
                let slow = x.matmul(&w.t().unwrap()).unwrap().to_vec::<f32>().unwrap();
                for (a, b) in fast.iter().zip(&slow) {
                    assert!(
                        (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                        "{m}x{k}x{n}: {a} vs {b}"
                    );
                }
            }
            let x = g.randn(&[8, 4], DType::F32, &Device::Cpu).unwrap();
            let w = g.randn(&[33, 4], DType::F32, &Device::Cpu).unwrap();
            assert!(
                matmul_wt(&x, &w).is_none(),
                "n = 33 takes the runtime's path"
            );
        });
    }

    #[test]
    fn matmul_wt_few_matches_the_runtime_matmul_and_one_row_calls() {
        crate::cpu::features::each_tier(|_tier| {
            let mut g = Generator::new(9);
            for (m, k, n) in [
                (2usize, 5usize, 3usize),
                (3, 64, 67),
                (6, 100, 21),
                (8, 576, 130),
                (12, 64, 10),
                (15, 37, 9),
            ] {
                let x = g.randn(&[m, k], DType::F32, &Device::Cpu).unwrap();
                let w = g.randn(&[n, k], DType::F32, &Device::Cpu).unwrap();
                let Some(fast) = taken(matmul_wt_few(&x, &w), true, "matmul_wt_few") else {
                    continue;
                };
                let fast = fast.unwrap().to_vec::<f32>().unwrap();
                let slow = x.matmul(&w.t().unwrap()).unwrap().to_vec::<f32>().unwrap();
                close(&fast, &slow, &format!("{m}x{k}x{n}"));
                // Row i equals the one-row product bit for bit: batching does not change it.
                for i in 0..m {
                    let row = x.narrow(0, i, 1).unwrap().reshape_to(&[k]).unwrap();
                    let one = matvec(&w, &row).unwrap().unwrap().to_vec::<f32>().unwrap();
                    assert_eq!(&fast[i * n..(i + 1) * n], &one[..], "{m}x{k}x{n} row {i}");
                }
            }
            let one = g.randn(&[1, 8], DType::F32, &Device::Cpu).unwrap();
            let many = g.randn(&[FEW_ROWS, 8], DType::F32, &Device::Cpu).unwrap();
            let w = g.randn(&[4, 8], DType::F32, &Device::Cpu).unwrap();
            assert!(matmul_wt_few(&one, &w).is_none() && matmul_wt_few(&many, &w).is_none());
        });
    }

    #[test]
    fn matvec_matches_the_runtime_matmul() {
        crate::cpu::features::each_tier(|_tier| {
            let mut g = Generator::new(3);
            for (out, k) in [(1usize, 1usize), (7, 13), (64, 576), (131, 37)] {
                let w = g.randn(&[out, k], DType::F32, &Device::Cpu).unwrap();
                let x = g.randn(&[k], DType::F32, &Device::Cpu).unwrap();
                let Some(fast) = taken(matvec(&w, &x), true, "matvec") else {
                    continue;
                };
                let fast = fast.unwrap().to_vec::<f32>().unwrap();
                let slow = w
                    .matmul(&x.reshape_to(&[k, 1]).unwrap())
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                for (a, b) in fast.iter().zip(&slow) {
                    assert!(
                        (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                        "{out}x{k}: {a} vs {b}"
                    );
                }
            }
        });
    }

    fn close(fast: &[f32], slow: &[f32], what: &str) {
        assert_eq!(fast.len(), slow.len(), "{what}");
        for (a, b) in fast.iter().zip(slow) {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "{what}: {a} vs {b}"
            );
        }
    }

    #[test]
    fn pack_rows_transposes_full_and_partial_panels() {
        let k = 37;
        let w: Vec<Vec<f32>> = (0..NR)
            .map(|j| (0..k).map(|kk| (j * 100 + kk) as f32).collect())
            .collect();
        for n in [NR, 5] {
            let rows: Vec<&[f32]> = w[..n].iter().map(|r| r.as_slice()).collect();
            let mut out = vec![f32::NAN; k * NR];
            pack_rows(&rows, k, &mut out);
            for kk in 0..k {
                for j in 0..NR {
                    let want = if j < n { w[j][kk] } else { 0.0 };
                    assert_eq!(out[kk * NR + j], want, "rows {n}, k {kk}, j {j}");
                }
            }
        }
    }

    /// The eager path of `Attention::forward` for one kv group layout.
    fn attention_reference(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor) -> Vec<f32> {
        let (b, h, t, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
        let (kv, l) = (k.shape()[1], k.shape()[2]);
        let rep = h / kv;
        let qg = q
            .contiguous()
            .unwrap()
            .reshape_to(&[b, kv, rep * t, d])
            .unwrap();
        let s = qg.matmul(&k.t().unwrap()).unwrap();
        let s = s.mul_scalar(1.0 / (d as f64).sqrt()).unwrap();
        let s = s
            .reshape_to(&[b, kv, rep, t, l])
            .unwrap()
            .add(&bias.unsqueeze(1).unwrap())
            .unwrap();
        let p = s
            .softmax(-1)
            .unwrap()
            .reshape_to(&[b, kv, rep * t, l])
            .unwrap();
        let o = p.matmul(v).unwrap().reshape_to(&[b, h, t, d]).unwrap();
        let o = o
            .transpose(1, 2)
            .unwrap()
            .reshape_to(&[b, t, h * d])
            .unwrap();
        o.to_vec::<f32>().unwrap()
    }

    #[test]
    fn attention_matches_the_eager_path() {
        crate::cpu::features::each_tier(|tier| {
            let mut g = Generator::new(7);
            // (batch, heads, kv heads, new tokens, cached before them, head dim)
            for (b, h, kv, t, past, d) in [
                (1usize, 9usize, 3usize, 40usize, 0usize, 64usize),
                (2, 4, 2, 3, 33, 32),
                (1, 2, 1, 1, 70, 64),
                (2, 4, 2, 20, 7, 16),
                (2, 2, 1, 15, 4, 8),
                // One-query steps (decodes, at every tier; below AVX2 `decode`'s pass): scores
                // straight from the keys, the heads of a kv head in one tile (more of them than
                // a tile's rows; without grouping), head dims off the 16 grid and narrow ones,
                // key counts off it, a single key.
                (2, 16, 1, 1, 45, 40),
                (3, 6, 3, 1, 300, 8),
                (2, 4, 4, 1, 17, 128),
                (2, 12, 4, 1, 0, 64),
                (1, 28, 4, 1, 1000, 24),
            ] {
                let l = past + t;
                let q = g.randn(&[b, h, t, d], DType::F32, &Device::Cpu).unwrap();
                let k = g.randn(&[b, kv, l, d], DType::F32, &Device::Cpu).unwrap();
                let v = g.randn(&[b, kv, l, d], DType::F32, &Device::Cpu).unwrap();
                // Causal, the first two slots of batch row 1 padding, and in that row the first
                // query fully masked (as a padding query is).
                let mut m = vec![0f32; b * t * l];
                for bi in 0..b {
                    for i in 0..t {
                        for j in 0..l {
                            let hidden = j > past + i || (bi == 1 && (j < 2 || i == 0));
                            if hidden {
                                m[(bi * t + i) * l + j] = f32::MIN;
                            }
                        }
                    }
                }
                let bias = Tensor::from_vec(m, &[b, 1, t, l], &Device::Cpu).unwrap();
                let Some(fast) = taken(
                    attention(&q, &k, &v, Some(&bias), 1.0 / (d as f64).sqrt()),
                    tier >= Tier::Avx2 || t == 1,
                    "attention",
                ) else {
                    continue;
                };
                let fast = fast.unwrap();
                assert_eq!(fast.shape(), [b, t, h * d]);
                let slow = attention_reference(&q, &k, &v, &bias);
                close(&fast.to_vec::<f32>().unwrap(), &slow, "attention");
            }
        });
    }

    /// Keys and values every batch row shares (a paged cache's pool broadcast over the rows,
    /// each row masked to its own slots): packed once, the same result as copies per row.
    #[test]
    fn attention_over_shared_keys_matches_the_eager_path() {
        crate::cpu::features::each_tier(|tier| {
            let mut g = Generator::new(11);
            // (batch, heads, kv heads, queries, keys, head dim): prefills and decodes, a
            // narrow head (its product reads every column between the runs).
            for (b, h, kv, t, l, d) in [
                (3usize, 6usize, 3usize, 5usize, 400usize, 64usize),
                (2, 4, 2, 1, 400, 32),
                (3, 9, 3, 1, 300, 64),
                (2, 2, 1, 4, 300, 8),
            ] {
                let q = g.randn(&[b, h, t, d], DType::F32, &Device::Cpu).unwrap();
                let k = g.randn(&[1, kv, l, d], DType::F32, &Device::Cpu).unwrap();
                let v = g.randn(&[1, kv, l, d], DType::F32, &Device::Cpu).unwrap();
                let (kb, vb) = (
                    k.broadcast_as(&[b, kv, l, d]).unwrap(),
                    v.broadcast_as(&[b, kv, l, d]).unwrap(),
                );
                // Row r sees blocks of 16 keys, every sixth from its r-th (runs far apart, as
                // a paged cache's rows), up to a causal limit; row 1 also every third key of
                // its first blocks (runs close together).
                let mut m = vec![f32::MIN; b * t * l];
                for bi in 0..b {
                    for i in 0..t {
                        for j in 0..l - t + i + 1 {
                            if (j / 16) % 6 == bi || (bi == 1 && j < 60 && j % 3 == 0) {
                                m[(bi * t + i) * l + j] = 0.0;
                            }
                        }
                    }
                }
                let bias = Tensor::from_vec(m, &[b, 1, t, l], &Device::Cpu).unwrap();
                let Some(fast) = taken(
                    attention(&q, &kb, &vb, Some(&bias), 1.0 / (d as f64).sqrt()),
                    tier >= Tier::Avx2 || t == 1,
                    "attention",
                ) else {
                    continue;
                };
                let (kc, vc) = (kb.contiguous().unwrap(), vb.contiguous().unwrap());
                let slow = attention_reference(&q, &kc, &vc, &bias);
                close(
                    &fast.unwrap().to_vec::<f32>().unwrap(),
                    &slow,
                    "shared keys",
                );
            }
        });
    }

    #[test]
    fn unmasked_attention_with_any_head_dim_matches_the_eager_path() {
        crate::cpu::features::each_tier(|tier| {
            let mut g = Generator::new(9);
            // (batch, heads, queries, keys, head dim): a UNet's self-attention over latent
            // positions and cross-attention to 77 text positions, head dims off the 32 grid.
            for (b, h, t, l, d) in [
                (2usize, 8usize, 300usize, 300usize, 8usize),
                (1, 2, 64, 77, 40),
                (2, 3, 17, 5, 32),
                (2, 4, 100, 77, 16),
                (2, 3, 1, 50, 24),
            ] {
                let q = g.randn(&[b, h, t, d], DType::F32, &Device::Cpu).unwrap();
                let k = g.randn(&[b, h, l, d], DType::F32, &Device::Cpu).unwrap();
                let v = g.randn(&[b, h, l, d], DType::F32, &Device::Cpu).unwrap();
                let Some(fast) = taken(
                    attention(&q, &k, &v, None, 1.0 / (d as f64).sqrt()),
                    tier >= Tier::Avx2 || t == 1,
                    "attention",
                ) else {
                    continue;
                };
                let fast = fast.unwrap();
                assert_eq!(fast.shape(), [b, t, h * d]);
                let zeros = Tensor::zeros(&[b, 1, t, l], DType::F32, &Device::Cpu).unwrap();
                let slow = attention_reference(&q, &k, &v, &zeros);
                close(&fast.to_vec::<f32>().unwrap(), &slow, "unmasked attention");
            }
        });
    }

    #[test]
    fn silu_mul_matches_the_runtime_ops() {
        crate::cpu::features::each_tier(|tier| {
            let mut g = Generator::new(11);
            for n in [1usize, 17, 40000] {
                let a = g
                    .randn(&[n], DType::F32, &Device::Cpu)
                    .unwrap()
                    .mul_scalar(8.0)
                    .unwrap();
                let u = g.randn(&[n], DType::F32, &Device::Cpu).unwrap();
                let Some(fast) = taken(silu_mul(&a, &u), tier >= Tier::Avx2, "silu_mul") else {
                    continue;
                };
                let slow = a.silu().unwrap().mul(&u).unwrap().to_vec::<f32>().unwrap();
                close(&fast.unwrap().to_vec::<f32>().unwrap(), &slow, "silu_mul");
            }
        });
    }
}
