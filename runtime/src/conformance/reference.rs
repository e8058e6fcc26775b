//! f64 host arrays and the reference semantics the suite checks every backend against.
//! Written from the op definitions (PyTorch docs), independently of any backend.

/// A row-major f64 array on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct Host {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Calls `f` with every multi-index of `shape` in row-major order.
pub(crate) fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    let n: usize = shape.iter().product();
    let mut idx = vec![0; shape.len()];
    for _ in 0..n {
        f(&idx);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

impl Host {
    pub fn new(shape: &[usize], data: Vec<f64>) -> Host {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "reference shape/data mismatch"
        );
        Host {
            shape: shape.to_vec(),
            data,
        }
    }

    /// Builds an array of `shape` whose value at each index is `f(index)`.
    pub fn from_fn(shape: &[usize], mut f: impl FnMut(&[usize]) -> f64) -> Host {
        let mut data = Vec::with_capacity(shape.iter().product());
        for_each_index(shape, |i| data.push(f(i)));
        Host::new(shape, data)
    }

    pub fn at(&self, idx: &[usize]) -> f64 {
        let s = strides(&self.shape);
        self.data[idx.iter().zip(&s).map(|(i, s)| i * s).sum::<usize>()]
    }

    /// Value at an index of a broadcast shape (leading dims absent, size-1 dims stretched).
    pub fn at_broadcast(&self, idx: &[usize]) -> f64 {
        let off = idx.len() - self.shape.len();
        let i: Vec<usize> = self
            .shape
            .iter()
            .enumerate()
            .map(|(d, &n)| if n == 1 { 0 } else { idx[off + d] })
            .collect();
        self.at(&i)
    }

    pub fn map(&self, f: impl Fn(f64) -> f64) -> Host {
        Host::new(&self.shape, self.data.iter().map(|&v| f(v)).collect())
    }

    pub fn zip(&self, other: &Host, f: impl Fn(f64, f64) -> f64) -> Host {
        let shape = broadcast(&self.shape, &other.shape);
        Host::from_fn(&shape, |i| f(self.at_broadcast(i), other.at_broadcast(i)))
    }

    /// Reduces `dims` with `f` over the values (given as a slice per output element).
    pub fn reduce(&self, dims: &[usize], keepdim: bool, f: impl Fn(&[f64]) -> f64) -> Host {
        let kept: Vec<usize> = self
            .shape
            .iter()
            .enumerate()
            .map(|(d, &n)| if dims.contains(&d) { 1 } else { n })
            .collect();
        let mut out = Host::from_fn(&kept, |_| 0.0);
        let red: Vec<usize> = dims.iter().map(|&d| self.shape[d]).collect();
        let mut vals = Vec::new();
        let mut k = 0;
        for_each_index(&kept, |oi| {
            vals.clear();
            for_each_index(&red, |ri| {
                let mut full = oi.to_vec();
                for (j, &d) in dims.iter().enumerate() {
                    full[d] = ri[j];
                }
                vals.push(self.at(&full));
            });
            out.data[k] = f(&vals);
            k += 1;
        });
        if !keepdim {
            out.shape = self
                .shape
                .iter()
                .enumerate()
                .filter(|(d, _)| !dims.contains(d))
                .map(|(_, &n)| n)
                .collect();
        }
        out
    }

    /// Applies `f` to every 1-D lane along `dim` (softmax, cumsum, ...).
    pub fn lanes(&self, dim: usize, f: impl Fn(&[f64]) -> Vec<f64>) -> Host {
        let mut out = self.clone();
        let n = self.shape[dim];
        let st = strides(&self.shape)[dim];
        let mut outer = self.shape.clone();
        outer[dim] = 1;
        for_each_index(&outer, |oi| {
            let base: usize = oi
                .iter()
                .zip(strides(&self.shape))
                .map(|(i, s)| i * s)
                .sum();
            let lane: Vec<f64> = (0..n).map(|j| self.data[base + j * st]).collect();
            for (j, v) in f(&lane).into_iter().enumerate() {
                out.data[base + j * st] = v;
            }
        });
        out
    }

    /// Batched matmul with batch-dim broadcasting; also returns `|a| @ |b|`, the magnitude
    /// that bounds rounding error of the sum.
    pub fn matmul(&self, b: &Host) -> (Host, Host) {
        let (ra, rb) = (self.shape.len(), b.shape.len());
        let (m, k, n) = (self.shape[ra - 2], self.shape[ra - 1], b.shape[rb - 1]);
        let batch = broadcast(&self.shape[..ra - 2], &b.shape[..rb - 2]);
        let mut shape = batch.clone();
        shape.extend([m, n]);
        let a_b = Host::new(
            &self.shape[..ra - 2],
            vec![0.0; self.shape[..ra - 2].iter().product()],
        );
        let b_b = Host::new(
            &b.shape[..rb - 2],
            vec![0.0; b.shape[..rb - 2].iter().product()],
        );
        let bidx = |h: &Host, idx: &[usize]| -> Vec<usize> {
            let off = idx.len() - h.shape.len();
            h.shape
                .iter()
                .enumerate()
                .map(|(d, &s)| if s == 1 { 0 } else { idx[off + d] })
                .collect()
        };
        let mut val = Vec::new();
        let mut mag = Vec::new();
        for_each_index(&shape, |i| {
            let bi = &i[..i.len() - 2];
            let (r, c) = (i[i.len() - 2], i[i.len() - 1]);
            let mut ia = bidx(&a_b, bi);
            ia.extend([r, 0]);
            let mut ib = bidx(&b_b, bi);
            ib.extend([0, c]);
            let (mut s, mut sa) = (0.0, 0.0);
            for kk in 0..k {
                let la = ia.len();
                ia[la - 1] = kk;
                let lb = ib.len();
                ib[lb - 2] = kk;
                let p = self.at(&ia) * b.at(&ib);
                s += p;
                sa += p.abs();
            }
            val.push(s);
            mag.push(sa);
        });
        (Host::new(&shape, val), Host::new(&shape, mag))
    }
}

/// PyTorch broadcast of two shapes (callers pass compatible shapes).
pub fn broadcast(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = if i < r - a.len() {
                1
            } else {
                a[i - (r - a.len())]
            };
            let db = if i < r - b.len() {
                1
            } else {
                b[i - (r - b.len())]
            };
            da.max(db)
        })
        .collect()
}

/// erf by its Maclaurin series (|x| < 3) or continued fraction tail, accurate to ~1e-15.
pub fn erf(x: f64) -> f64 {
    if x.abs() < 3.0 {
        // erf x = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1))
        let mut term = x;
        let mut sum = x;
        let x2 = x * x;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs().max(1e-300) {
            n += 1.0;
            term *= -x2 / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc x = exp(-x^2)/sqrt(pi) * 1/(x + 1/2/(x + 1/(x + 3/2/(x + ...))))
        let ax = x.abs();
        let mut f = ax;
        for k in (1..60).rev() {
            f = ax + (k as f64 / 2.0) / f;
        }
        let erfc = (-ax * ax).exp() / std::f64::consts::PI.sqrt() / f;
        (1.0 - erfc) * x.signum()
    }
}

pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
}

pub fn gelu_tanh(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub fn softmax(lane: &[f64]) -> Vec<f64> {
    let m = lane.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = lane.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}
