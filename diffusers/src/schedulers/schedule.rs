//! What every discrete-time scheduler derives from its config: the betas of the training
//! noise schedule, their cumulative products, and the inference timesteps — computed in the
//! precision diffusers computes them (float32 torch tensors, float64 numpy arrays), so that
//! timesteps, sigmas and step coefficients equal diffusers' own.

use serde::Deserialize;

use crate::configuration::register_to_config;
use crate::{Error, Result};

/// `beta_schedule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BetaSchedule {
    /// `linspace(beta_start, beta_end)`.
    Linear,
    /// `linspace(sqrt(beta_start), sqrt(beta_end)) ** 2` (Stable Diffusion).
    ScaledLinear,
    /// The cosine schedule of improved DDPM (`betas_for_alpha_bar`).
    #[serde(rename = "squaredcos_cap_v2")]
    SquaredcosCapV2,
    /// `betas_for_alpha_bar` with the laplace transform (DDPM only).
    Laplace,
    /// `sigmoid(linspace(-6, 6)) * (beta_end - beta_start) + beta_start` (DDPM only).
    Sigmoid,
}

/// `timestep_spacing`: how inference timesteps sit among the training ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimestepSpacing {
    /// Evenly from 0 to `num_train_timesteps - 1`.
    Linspace,
    /// Multiples of `num_train_timesteps // steps`, plus `steps_offset`.
    Leading,
    /// Counting down from `num_train_timesteps` by `num_train_timesteps / steps`, minus 1.
    Trailing,
}

impl TimestepSpacing {
    /// The sigma schedulers' `init_noise_sigma` for largest sigma `max`: `max`, or
    /// `sqrt(max^2 + 1)` for `leading` spacing.
    pub fn init_noise_sigma(self, max: f32) -> f64 {
        match self {
            TimestepSpacing::Linspace | TimestepSpacing::Trailing => max as f64,
            TimestepSpacing::Leading => (max * max + 1.0).sqrt() as f64,
        }
    }
}

/// `prediction_type`: what the model predicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PredictionType {
    /// The noise.
    Epsilon,
    /// The clean sample (`original_sample` is an old name of it).
    #[serde(alias = "original_sample")]
    Sample,
    /// The velocity `alpha * noise - sigma * sample`.
    VPrediction,
}

/// The sigma-spacing switches of the sigma schedulers (Euler, DPM-Solver, LMS).
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(default)]
pub struct SigmaSpacing {
    /// Karras et al.'s sigmas (rho 7).
    pub use_karras_sigmas: Option<bool>,
    /// Sigmas evenly spaced in log.
    pub use_exponential_sigmas: Option<bool>,
    /// Beta-distributed sigmas.
    pub use_beta_sigmas: Option<bool>,
}

/// Which of [`SigmaSpacing`]'s schedules a config asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SigmaKind {
    /// The training sigmas at the inference timesteps.
    Interpolated,
    /// Karras.
    Karras,
    /// Exponential.
    Exponential,
    /// Beta-distributed (Beta(0.6, 0.6) quantiles, as diffusers' `_convert_to_beta`).
    Beta,
}

impl SigmaKind {
    /// `n` Karras or exponential sigmas from `smax` down to `smin`; `None` for the
    /// interpolated schedule, which the scheduler computes itself.
    pub fn spaced(self, smin: f64, smax: f64, n: usize) -> Option<Vec<f64>> {
        match self {
            SigmaKind::Interpolated => None,
            SigmaKind::Karras => Some(karras_sigmas(smin, smax, n)),
            SigmaKind::Exponential => Some(exponential_sigmas(smin, smax, n)),
            SigmaKind::Beta => Some(beta_sigmas(smin, smax, n)),
        }
    }
}

impl SigmaSpacing {
    /// The schedule asked for: at most one switch on.
    pub fn kind(&self, class: &str) -> Result<SigmaKind> {
        let on = |f: Option<bool>| f == Some(true);
        let (k, e, b) = (
            on(self.use_karras_sigmas),
            on(self.use_exponential_sigmas),
            on(self.use_beta_sigmas),
        );
        if [k, e, b].iter().filter(|&&f| f).count() > 1 {
            return Err(Error::Scheduler(format!(
                "{class}: only one of use_karras_sigmas, use_exponential_sigmas, use_beta_sigmas can be true"
            )));
        }
        Ok(if k {
            SigmaKind::Karras
        } else if e {
            SigmaKind::Exponential
        } else if b {
            SigmaKind::Beta
        } else {
            SigmaKind::Interpolated
        })
    }
}

register_to_config! {
    /// The training noise schedule's fields, common to every discrete scheduler, with the
    /// default all of diffusers' share (1000 linear betas).
    pub struct NoiseConfig {
        /// Training timesteps.
        pub num_train_timesteps: usize = 1000,
        /// First beta.
        pub beta_start: f64 = 0.0001,
        /// Last beta.
        pub beta_end: f64 = 0.02,
        /// How betas go from the first to the last.
        pub beta_schedule: BetaSchedule = BetaSchedule::Linear,
        /// Betas given outright (they win over the schedule).
        pub trained_betas: Option<Vec<f64>> = None,
        /// Rescale betas to zero terminal SNR.
        pub rescale_betas_zero_snr: bool = false,
    }
}

/// `torch.linspace(start, end, n, dtype=float32)` as PyTorch's CPU kernel computes it: from
/// the start for the first half, from the end for the second, each value one fused
/// multiply-add (its vectorized loop's; two roundings differ in about a fifth of the betas
/// of a 1000-step schedule, enough to move a timestep rounded from a sigma).
pub fn linspace_f32(start: f64, end: f64, n: usize) -> Vec<f32> {
    let (s, e) = (start as f32, end as f32);
    if n == 1 {
        return vec![s];
    }
    let step = (e - s) / (n - 1) as f32;
    let half = n / 2;
    (0..n)
        .map(|i| {
            if i < half {
                step.mul_add(i as f32, s)
            } else {
                (-step).mul_add((n - i - 1) as f32, e)
            }
        })
        .collect()
}

/// `np.linspace(start, stop, n)` in float64.
pub fn linspace_f64(start: f64, stop: f64, n: usize) -> Vec<f64> {
    match n {
        0 => Vec::new(),
        1 => vec![start],
        _ => {
            let step = (stop - start) / (n - 1) as f64;
            let mut v: Vec<f64> = (0..n).map(|i| i as f64 * step + start).collect();
            v[n - 1] = stop;
            v
        }
    }
}

/// `torch.cumprod` of a float32 vector on the CPU (accumulated in float64).
pub fn cumprod_f32(x: &[f32]) -> Vec<f32> {
    let mut acc = 1f64;
    x.iter()
        .map(|&v| {
            acc *= v as f64;
            acc as f32
        })
        .collect()
}

/// `betas_for_alpha_bar`: betas that discretize `alpha_bar`, capped at 0.999.
fn betas_for_alpha_bar(n: usize, laplace: bool) -> Vec<f32> {
    let alpha_bar = |t: f64| -> f64 {
        if laplace {
            let lmb = -0.5 * (0.5 - t).signum() * (1.0 - 2.0 * (0.5 - t).abs() + 1e-6).ln();
            let snr = lmb.exp();
            (snr / (1.0 + snr)).sqrt()
        } else {
            ((t + 0.008) / 1.008 * std::f64::consts::PI / 2.0)
                .cos()
                .powi(2)
        }
    };
    (0..n)
        .map(|i| {
            let (t1, t2) = (i as f64 / n as f64, (i + 1) as f64 / n as f64);
            (1.0 - alpha_bar(t2) / alpha_bar(t1)).min(0.999) as f32
        })
        .collect()
}

/// `rescale_zero_terminal_snr`: betas whose last cumulative alpha is zero.
fn rescale_zero_terminal_snr(betas: &[f32]) -> Vec<f32> {
    let alphas: Vec<f32> = betas.iter().map(|b| 1.0 - b).collect();
    let mut sqrt: Vec<f32> = cumprod_f32(&alphas).iter().map(|a| a.sqrt()).collect();
    let (first, last) = (sqrt[0], sqrt[sqrt.len() - 1]);
    let scale = first / (first - last);
    for s in &mut sqrt {
        *s -= last;
        *s *= scale;
    }
    let bar: Vec<f32> = sqrt.iter().map(|s| s * s).collect();
    let mut out = Vec::with_capacity(bar.len());
    out.push(1.0 - bar[0]);
    for w in bar.windows(2) {
        out.push(1.0 - w[1] / w[0]);
    }
    out
}

/// The training schedule: betas and cumulative alphas.
#[derive(Clone, Debug)]
pub struct NoiseSchedule {
    /// Per training timestep.
    pub betas: Vec<f32>,
    /// `cumprod(1 - betas)`.
    pub alphas_cumprod: Vec<f32>,
}

impl NoiseSchedule {
    /// The schedule of `c`; `extra` allows the DDPM-only schedules.
    pub fn new(c: &NoiseConfig, class: &str, ddpm_only: bool) -> Result<NoiseSchedule> {
        let n = c.num_train_timesteps;
        if n == 0 {
            return Err(Error::Scheduler(format!(
                "{class}: num_train_timesteps must be at least 1, got 0"
            )));
        }
        let betas = match (&c.trained_betas, c.beta_schedule) {
            (Some(b), _) => {
                if b.len() != n {
                    return Err(Error::Scheduler(format!(
                        "{class}: trained_betas has {} values for num_train_timesteps {n}",
                        b.len()
                    )));
                }
                b.iter().map(|&v| v as f32).collect()
            }
            (None, BetaSchedule::Linear) => linspace_f32(c.beta_start, c.beta_end, n),
            (None, BetaSchedule::ScaledLinear) => {
                linspace_f32(c.beta_start.sqrt(), c.beta_end.sqrt(), n)
                    .into_iter()
                    .map(|b| b * b)
                    .collect()
            }
            (None, BetaSchedule::SquaredcosCapV2) => betas_for_alpha_bar(n, false),
            (None, s @ (BetaSchedule::Laplace | BetaSchedule::Sigmoid)) if !ddpm_only => {
                return Err(Error::Scheduler(format!(
                    "{class}: beta_schedule {s:?} is DDPMScheduler's only; use linear, scaled_linear or squaredcos_cap_v2"
                )))
            }
            (None, BetaSchedule::Laplace) => betas_for_alpha_bar(n, true),
            (None, BetaSchedule::Sigmoid) => {
                let (lo, span) = (c.beta_start as f32, (c.beta_end - c.beta_start) as f32);
                linspace_f32(-6.0, 6.0, n)
                    .into_iter()
                    .map(|x| (1.0 / (1.0 + (-x).exp())) * span + lo)
                    .collect()
            }
        };
        let betas = if c.rescale_betas_zero_snr {
            rescale_zero_terminal_snr(&betas)
        } else {
            betas
        };
        let alphas: Vec<f32> = betas.iter().map(|b| 1.0 - b).collect();
        Ok(NoiseSchedule {
            alphas_cumprod: cumprod_f32(&alphas),
            betas,
        })
    }

    /// The schedule of a sigma-parameterized scheduler (Euler, DPM-Solver, UniPC): a zero
    /// terminal alpha (`rescale_betas_zero_snr`) would make an infinite sigma, so diffusers
    /// sets it to 2^-24.
    pub fn for_sigmas(c: &NoiseConfig, class: &str) -> Result<NoiseSchedule> {
        let mut schedule = NoiseSchedule::new(c, class, false)?;
        if c.rescale_betas_zero_snr {
            if let Some(last) = schedule.alphas_cumprod.last_mut() {
                *last = 2f32.powi(-24);
            }
        }
        Ok(schedule)
    }

    /// `((1 - alphas_cumprod) / alphas_cumprod) ** 0.5`, per training timestep.
    pub fn sigmas(&self) -> Vec<f32> {
        self.alphas_cumprod
            .iter()
            .map(|a| ((1.0 - a) / a).sqrt())
            .collect()
    }
}

/// Inference timesteps (descending, float64) for `steps` of `train` training timesteps,
/// as numpy computes them for `spacing`; `round` rounds `linspace` ones (the integer
/// schedulers do, the sigma schedulers do not).
pub fn spaced_timesteps(
    spacing: TimestepSpacing,
    train: usize,
    steps: usize,
    steps_offset: usize,
    round: bool,
) -> Vec<f64> {
    match spacing {
        TimestepSpacing::Linspace => {
            let mut t = linspace_f64(0.0, (train - 1) as f64, steps);
            if round {
                t.iter_mut().for_each(|v| *v = v.round_ties_even());
            }
            t.reverse();
            t
        }
        TimestepSpacing::Leading => {
            let ratio = train / steps;
            (0..steps)
                .rev()
                .map(|i| (i * ratio + steps_offset) as f64)
                .collect()
        }
        TimestepSpacing::Trailing => {
            // np.arange(train, 0, -ratio): ceil(train / ratio) values, which float error
            // can make one more than `steps`, as in diffusers.
            let ratio = train as f64 / steps as f64;
            let len = ((0.0 - train as f64) / -ratio).ceil().max(0.0) as usize;
            (0..len)
                .map(|i| (train as f64 - i as f64 * ratio).round_ties_even() - 1.0)
                .collect()
        }
    }
}

/// The integer timesteps of DDPM, DDIM and PNDM for `steps` (checked against the training
/// schedule), descending.
pub fn integer_timesteps(
    class: &str,
    spacing: TimestepSpacing,
    train: usize,
    steps: usize,
    steps_offset: usize,
) -> Result<Vec<f64>> {
    if steps == 0 || steps > train {
        return Err(Error::Scheduler(format!(
            "{class}: num_inference_steps must be in 1..={train} (num_train_timesteps), got {steps}"
        )));
    }
    Ok(spaced_timesteps(spacing, train, steps, steps_offset, true))
}

/// The timesteps of the multistep solvers (DPM-Solver, UniPC): `steps + 1` spaced points
/// without the last (0), counting from `last` (the training timesteps left after DPM-Solver's
/// `lambda_min_clipped`; all of them for UniPC).
pub fn multistep_timesteps(
    spacing: TimestepSpacing,
    train: usize,
    last: usize,
    steps: usize,
    steps_offset: usize,
) -> Vec<f64> {
    match spacing {
        TimestepSpacing::Linspace => {
            let mut t: Vec<f64> = linspace_f64(0.0, last as f64 - 1.0, steps + 1)
                .into_iter()
                .map(f64::round_ties_even)
                .collect();
            t.reverse();
            t.pop();
            t
        }
        TimestepSpacing::Leading => {
            let ratio = last / (steps + 1);
            (1..=steps)
                .rev()
                .map(|i| (i * ratio + steps_offset) as f64)
                .collect()
        }
        TimestepSpacing::Trailing => {
            let ratio = train as f64 / steps as f64;
            let len = (last as f64 / ratio).ceil().max(0.0) as usize;
            (0..len)
                .map(|i| (last as f64 - i as f64 * ratio).round_ties_even() - 1.0)
                .collect()
        }
    }
}

/// `np.interp(x, 0..ys.len(), ys)`.
pub fn interp(x: f64, ys: &[f32]) -> f64 {
    let last = ys.len() - 1;
    if x <= 0.0 {
        return ys[0] as f64;
    }
    if x >= last as f64 {
        return ys[last] as f64;
    }
    let i = x.floor() as usize;
    let (a, b) = (ys[i] as f64, ys[i + 1] as f64);
    let w = x - i as f64;
    // numpy's form: slope * (x - xp[i]) + fp[i].
    (b - a) * w + a
}

/// `_sigma_to_t`: the fractional training timestep of `sigma`, interpolating log sigmas.
pub fn sigma_to_t(sigma: f64, log_sigmas: &[f32]) -> f64 {
    let log_sigma = sigma.max(1e-10).ln();
    let n = log_sigmas.len();
    // numpy's `cumsum(dists >= 0).argmax()`: the last index whose log sigma is at or below
    // `log_sigma` (0 when none is), at most n - 2.
    let low = log_sigmas
        .iter()
        .rposition(|&l| log_sigma - l as f64 >= 0.0)
        .unwrap_or(0)
        .min(n - 2);
    let (lo, hi) = (log_sigmas[low] as f64, log_sigmas[low + 1] as f64);
    let w = ((lo - log_sigma) / (lo - hi)).clamp(0.0, 1.0);
    (1.0 - w) * low as f64 + w * (low + 1) as f64
}

/// Karras et al.'s sigmas (rho 7) from `smax` down to `smin`, float64 as numpy computes them.
pub fn karras_sigmas(smin: f64, smax: f64, n: usize) -> Vec<f64> {
    let rho = 7.0;
    let (min_inv, max_inv) = (smin.powf(1.0 / rho), smax.powf(1.0 / rho));
    linspace_f64(0.0, 1.0, n)
        .into_iter()
        .map(|r| (max_inv + r * (min_inv - max_inv)).powf(rho))
        .collect()
}

/// Sigmas evenly spaced in log from `smax` down to `smin`.
pub fn exponential_sigmas(smin: f64, smax: f64, n: usize) -> Vec<f64> {
    linspace_f64(smax.ln(), smin.ln(), n)
        .into_iter()
        .map(f64::exp)
        .collect()
}

/// Sigmas at the Beta(0.6, 0.6) quantiles of `1 - linspace(0, 1, n)` between `smax` and
/// `smin` ("Beta Sampling is All You Need", diffusers' `_convert_to_beta` with scipy's
/// `beta.ppf`).
pub fn beta_sigmas(smin: f64, smax: f64, n: usize) -> Vec<f64> {
    linspace_f64(0.0, 1.0, n)
        .into_iter()
        .map(|t| smin + beta_ppf(1.0 - t, 0.6, 0.6) * (smax - smin))
        .collect()
}

/// The `q` quantile of Beta(a, b): the `x` in [0, 1] where the regularized incomplete beta
/// function reaches `q`, by bisection down to adjacent doubles (the function is monotone, and
/// each evaluation is accurate to about 1e-15).
fn beta_ppf(q: f64, a: f64, b: f64) -> f64 {
    if q <= 0.0 {
        return 0.0;
    }
    if q >= 1.0 {
        return 1.0;
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    loop {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            return mid;
        }
        if incomplete_beta(mid, a, b) < q {
            lo = mid;
        } else {
            hi = mid;
        }
    }
}

/// The regularized incomplete beta function `I_x(a, b)`: its continued fraction (modified
/// Lentz), on the side of `x` where it converges fast.
fn incomplete_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_fraction(x, a, b) / a
    } else {
        1.0 - front * beta_fraction(1.0 - x, b, a) / b
    }
}

/// The continued fraction of the incomplete beta function.
fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    d = 1.0 / if d.abs() < TINY { TINY } else { d };
    let mut h = d;
    for m in 1..=1000 {
        let m = m as f64;
        let m2 = 2.0 * m;
        for aa in [
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ] {
            d = 1.0 + aa * d;
            d = 1.0 / if d.abs() < TINY { TINY } else { d };
            c = 1.0 + aa / c;
            if c.abs() < TINY {
                c = TINY;
            }
            h *= d * c;
        }
        // The last factor's distance from 1: converged to double precision.
        if (d * c - 1.0).abs() < 1e-16 {
            break;
        }
    }
    h
}

/// `ln Γ(x)` for `x > 0` (Lanczos, g = 7, nine terms: about 1e-15 relative).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1 - x) = π / sin(πx).
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let sum = G[1..]
        .iter()
        .enumerate()
        .fold(G[0], |acc, (i, g)| acc + g / (x + (i + 1) as f64));
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beta_quantiles_match_scipy() {
        // scipy.stats.beta.ppf(q, 0.6, 0.6).
        for (q, want) in [
            (0.001, 1.855873851745199e-05),
            (0.1, 0.03958440558878085),
            (0.25, 0.17568037865269498),
            (0.5, 0.5000000000000001),
            (0.7, 0.7659829961247643),
            (0.999999, 0.9999999998144118),
        ] {
            let got = beta_ppf(q, 0.6, 0.6);
            assert!(
                (got - want).abs() <= 1e-13 * want.max(1e-3),
                "ppf({q}) = {got}, scipy {want}"
            );
        }
        assert_eq!(
            (beta_ppf(0.0, 0.6, 0.6), beta_ppf(1.0, 0.6, 0.6)),
            (0.0, 1.0)
        );
    }

    #[test]
    fn linspace_matches_torch_at_both_ends() {
        let v = linspace_f32(0.0001, 0.02, 1000);
        assert_eq!(v[0], 0.0001f32);
        assert_eq!(v[999], 0.02f32);
        assert_eq!(linspace_f64(0.0, 999.0, 4), vec![0.0, 333.0, 666.0, 999.0]);
    }

    #[test]
    fn spacings_follow_numpy() {
        use TimestepSpacing::*;
        assert_eq!(
            spaced_timesteps(Leading, 1000, 4, 1, true),
            vec![751.0, 501.0, 251.0, 1.0]
        );
        assert_eq!(
            spaced_timesteps(Trailing, 1000, 4, 0, true),
            vec![999.0, 749.0, 499.0, 249.0]
        );
        assert_eq!(
            spaced_timesteps(Linspace, 1000, 3, 0, true),
            vec![999.0, 500.0, 0.0]
        );
    }

    #[test]
    fn zero_snr_rescale_ends_at_zero() {
        let c: NoiseConfig = serde_json::from_str(r#"{"rescale_betas_zero_snr": true}"#).unwrap();
        let s = NoiseSchedule::new(&c, "DDIMScheduler", false).unwrap();
        assert_eq!(*s.alphas_cumprod.last().unwrap(), 0.0);
        assert_eq!(*s.betas.last().unwrap(), 1.0);
    }
}
