//! CPU fast paths for the products of `Linear` layers on f32 CPU tensors.
//!
//! With one token per row, every `Linear` is a matrix-vector product that reads each weight
//! once: its speed is the memory bandwidth. The runtime's eager matmul hands it to a GEMM
//! kernel that reaches about a third of the bandwidth for a single row, so on f32 CPU tensors
//! zoo-transformers runs those products here instead: AVX2/FMA dot products over four weight
//! rows at a time, rows split across the rayon pool candle also uses.
//!
//! A prefill multiplies many rows by each weight: there the runtime's GEMM uses 256-bit
//! vectors only, so on CPUs with AVX-512 [`matmul_wt`] runs a register-tiled 8×32 kernel over
//! weight panels packed on the fly (each rayon task packs its own panel, so nothing is kept).
//!
//! Any other case (another device, dtype or layout, or a CPU without the instructions)
//! returns `None` and takes the runtime's path, so results never depend on this module.

use rayon::prelude::*;
use zoo_runtime::{DType, Device, Tensor};

use crate::Result;

/// The f32 contents of a contiguous eager CPU tensor, borrowed.
fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    if t.dtype() != DType::F32 || t.device() != Device::Cpu {
        return None;
    }
    let c = t.as_candle()?;
    let (storage, layout) = c.storage_and_layout();
    let (start, end) = layout.contiguous_offsets()?;
    match &*storage {
        candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => Some(f(&v[start..end])),
        _ => None,
    }
}

fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `w [out, in] @ x [in]` for f32 CPU tensors, or `None` when this path does not apply.
pub(crate) fn matvec(w: &Tensor, x: &Tensor) -> Option<Result<Tensor>> {
    if w.rank() != 2 || x.elem_count() != w.shape()[1] || !has_avx2_fma() {
        return None;
    }
    let (out, k) = (w.shape()[0], w.shape()[1]);
    let xv = with_f32(x, |v| v.to_vec())?;
    let y = with_f32(w, |wv| {
        let mut y = vec![0f32; out];
        // Blocks of rows big enough to amortise scheduling, small enough to balance 2+ threads.
        const ROWS: usize = 64;
        y.par_chunks_mut(ROWS).enumerate().for_each(|(b, ys)| {
            let rows = &wv[b * ROWS * k..(b * ROWS + ys.len()) * k];
            // SAFETY: AVX2 and FMA were detected above.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                dot_rows_avx2(rows, &xv, ys)
            }
        });
        y
    })?;
    Some(Tensor::from_vec(y, &[out], &Device::Cpu).map_err(Into::into))
}

/// `ys[r] = rows[r] · x` for each row of `rows` (row-major, `x.len()` columns).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_rows_avx2(rows: &[f32], x: &[f32], ys: &mut [f32]) {
    use std::arch::x86_64::*;
    let k = x.len();
    let vk = k / 8 * 8;
    let hsum = |v: __m256| -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    };
    let xp = x.as_ptr();
    let mut r = 0;
    // Four rows at a time share each load of x.
    while r + 4 <= ys.len() {
        let p = [0, 1, 2, 3].map(|i| rows.as_ptr().add((r + i) * k));
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < vk {
            let xv = _mm256_loadu_ps(xp.add(i));
            for j in 0..4 {
                acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(p[j].add(i)), xv, acc[j]);
            }
            i += 8;
        }
        for j in 0..4 {
            let tail: f32 = x[vk..]
                .iter()
                .enumerate()
                .map(|(o, &xv)| *p[j].add(vk + o) * xv)
                .sum();
            ys[r + j] = hsum(acc[j]) + tail;
        }
        r += 4;
    }
    while r < ys.len() {
        let p = rows.as_ptr().add(r * k);
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i < vk {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(p.add(i)), _mm256_loadu_ps(xp.add(i)), acc);
            i += 8;
        }
        let tail: f32 = x[vk..]
            .iter()
            .enumerate()
            .map(|(o, &xv)| *p.add(vk + o) * xv)
            .sum();
        ys[r] = hsum(acc) + tail;
        r += 1;
    }
}

fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Columns per packed weight panel: two 16-lane registers.
const NR: usize = 32;
/// Rows of the activation per register tile.
const MR: usize = 8;

/// A pointer to the output shared by tasks that write disjoint column panels.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every task writes only the columns of its own panel.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the raw field).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `x [m, k] @ w [n, k]^T` (`nn.Linear` without bias) for f32 CPU tensors, or `None` when this
/// path does not apply (no AVX-512, `n` not a multiple of 32, fewer than 8 rows).
pub(crate) fn matmul_wt(x: &Tensor, w: &Tensor) -> Option<Result<Tensor>> {
    if x.rank() != 2 || w.rank() != 2 || x.shape()[1] != w.shape()[1] || !has_avx512() {
        return None;
    }
    let (m, k, n) = (x.shape()[0], x.shape()[1], w.shape()[0]);
    if n % NR != 0 || m < MR || k == 0 {
        return None;
    }
    let c = with_f32(x, |a| {
        with_f32(w, |b| {
            let mut c = vec![0f32; m * n];
            let out = OutPtr(c.as_mut_ptr());
            (0..n / NR).into_par_iter().for_each(|panel| {
                // Pack columns panel*32.. as [k][32] so the kernel reads one contiguous row per k.
                let mut packed = vec![0f32; k * NR];
                for j in 0..NR {
                    let row = &b[(panel * NR + j) * k..(panel * NR + j + 1) * k];
                    for (kk, &v) in row.iter().enumerate() {
                        packed[kk * NR + j] = v;
                    }
                }
                let mut r = 0;
                while r < m {
                    let rows = (m - r).min(MR);
                    // SAFETY: AVX-512F was detected; `a` holds m*k values, `packed` k*32, and
                    // the tile writes rows r..r+rows of columns panel*32..+32 of the m*n output.
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        let (ap, cp) = (a.as_ptr().add(r * k), out.get().add(r * n + panel * NR));
                        match rows {
                            8 => tile::<8>(ap, k, packed.as_ptr(), cp, n),
                            7 => tile::<7>(ap, k, packed.as_ptr(), cp, n),
                            6 => tile::<6>(ap, k, packed.as_ptr(), cp, n),
                            5 => tile::<5>(ap, k, packed.as_ptr(), cp, n),
                            4 => tile::<4>(ap, k, packed.as_ptr(), cp, n),
                            3 => tile::<3>(ap, k, packed.as_ptr(), cp, n),
                            2 => tile::<2>(ap, k, packed.as_ptr(), cp, n),
                            _ => tile::<1>(ap, k, packed.as_ptr(), cp, n),
                        }
                    }
                    r += rows;
                }
            });
            c
        })
    })??;
    Some(Tensor::from_vec(c, &[m, n], &Device::Cpu).map_err(Into::into))
}

/// One `R × 32` tile of the output: `c[i][j] = Σ_k a[i][k] · packed[k][j]`, accumulated in
/// registers over the whole `k` (one broadcast of `a` per row and k, two FMAs).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile<const R: usize>(
    a: *const f32,
    k: usize,
    packed: *const f32,
    c: *mut f32,
    ldc: usize,
) {
    use std::arch::x86_64::*;
    let mut lo = [_mm512_setzero_ps(); R];
    let mut hi = [_mm512_setzero_ps(); R];
    for kk in 0..k {
        let b0 = _mm512_loadu_ps(packed.add(kk * NR));
        let b1 = _mm512_loadu_ps(packed.add(kk * NR + 16));
        for i in 0..R {
            let av = _mm512_set1_ps(*a.add(i * k + kk));
            lo[i] = _mm512_fmadd_ps(av, b0, lo[i]);
            hi[i] = _mm512_fmadd_ps(av, b1, hi[i]);
        }
    }
    for i in 0..R {
        _mm512_storeu_ps(c.add(i * ldc), lo[i]);
        _mm512_storeu_ps(c.add(i * ldc + 16), hi[i]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zoo_runtime::Generator;

    #[test]
    fn matmul_wt_matches_the_runtime_matmul() {
        let mut g = Generator::new(5);
        for (m, k, n) in [
            (8usize, 5usize, 32usize),
            (13, 64, 64),
            (512, 96, 96),
            (9, 1, 32),
        ] {
            let x = g.randn(&[m, k], DType::F32, &Device::Cpu).unwrap();
            let w = g.randn(&[n, k], DType::F32, &Device::Cpu).unwrap();
            let Some(fast) = matmul_wt(&x, &w) else {
                eprintln!("no AVX-512 here: the fast path is off");
                return;
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
    }

    #[test]
    fn matvec_matches_the_runtime_matmul() {
        let mut g = Generator::new(3);
        for (out, k) in [(1usize, 1usize), (7, 13), (64, 576), (131, 37)] {
            let w = g.randn(&[out, k], DType::F32, &Device::Cpu).unwrap();
            let x = g.randn(&[k], DType::F32, &Device::Cpu).unwrap();
            let Some(fast) = matvec(&w, &x) else {
                eprintln!("no AVX2/FMA here: the fast path is off");
                return;
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
    }
}
