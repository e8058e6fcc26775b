//! The logits processors and the sampler as tensor ops, so that on a compiled (PJRT) device a
//! decode step returns token ids instead of a `[batch, vocab]` row of logits.
//!
//! It makes the same choices as the host path in `generation.rs` (transformers' order:
//! repetition penalty, min-new-tokens eos suppression, temperature, top-k, top-p, min-p, then
//! inverse-CDF sampling over the sorted distribution with one uniform number per row from the
//! same seeded stream), computed in f32 on the device instead of f64 on the host. Every value
//! that varies between calls or steps (temperature, k, p, the uniforms, the eos bias) is a
//! device tensor rather than a program constant, so one compiled program serves every step and
//! every call with the same switches.

use zoo_runtime::{DType, Device, Tensor};

use super::options::GenerationOptions;
use crate::Result;

/// Device-resident state of the processors for one `generate` call.
pub(crate) struct DeviceSampler {
    device: Device,
    vocab: usize,
    do_sample: bool,
    /// `[vocab]` token ids, for one-hot updates of `seen` and sorted ranks.
    iota: Tensor,
    /// Repetition penalty: the factor and which tokens each row has seen (`[batch, vocab]`).
    penalty: Option<(Tensor, Tensor)>,
    /// Min new tokens: `[vocab]` biases, -inf on the eos ids, and zeros once allowed.
    eos_bias: Option<(Tensor, Tensor)>,
    min_new_tokens: usize,
    temperature: Option<Tensor>,
    top_k: Option<Tensor>,
    top_p: Option<Tensor>,
    min_p: Option<Tensor>,
}

impl DeviceSampler {
    /// Uploads the options and the prompts' tokens (for the repetition penalty) to `device`.
    pub(crate) fn new(
        opts: &GenerationOptions,
        prompts: &[Vec<u32>],
        eos: &[u32],
        vocab: usize,
        device: &Device,
    ) -> Result<DeviceSampler> {
        let scalar = |v: f64| -> Result<Tensor> { Ok(Tensor::scalar(v, DType::F32, device)?) };
        let iota = Tensor::arange(0.0, vocab as f64, 1.0, DType::I64, device)?;
        let penalty = match opts.repetition_penalty {
            Some(r) => {
                let mut seen = vec![0u8; prompts.len() * vocab];
                for (b, p) in prompts.iter().enumerate() {
                    for &id in p {
                        if (id as usize) < vocab {
                            seen[b * vocab + id as usize] = 1;
                        }
                    }
                }
                let seen = Tensor::from_vec(seen, &[prompts.len(), vocab], device)?
                    .to_dtype(DType::Bool)?;
                Some((scalar(r)?, seen))
            }
            None => None,
        };
        let eos_bias = if opts.min_new_tokens > 0 {
            let mut bias = vec![0f64; vocab];
            for &e in eos {
                if let Some(b) = bias.get_mut(e as usize) {
                    *b = f64::NEG_INFINITY;
                }
            }
            Some((
                Tensor::from_f64s(&bias, &[vocab], DType::F32, device)?,
                Tensor::zeros(&[vocab], DType::F32, device)?,
            ))
        } else {
            None
        };
        let sampling = |v: Option<f64>| v.filter(|_| opts.do_sample).map(scalar).transpose();
        Ok(DeviceSampler {
            device: *device,
            vocab,
            do_sample: opts.do_sample,
            iota,
            penalty,
            eos_bias,
            min_new_tokens: opts.min_new_tokens,
            temperature: sampling(Some(opts.temperature).filter(|&t| t != 1.0))?,
            top_k: match opts.top_k.filter(|_| opts.do_sample) {
                Some(k) => Some(Tensor::scalar(k.max(1) as f64, DType::I64, device)?),
                None => None,
            },
            top_p: sampling(opts.top_p)?,
            min_p: sampling(opts.min_p)?,
        })
    }

    /// Picks one token per row from `logits` (`[batch, 1, vocab]` or `[batch, vocab]`) at
    /// decode step `step`; `uniforms` (one per row, in [0, 1)) drive sampling and are ignored
    /// when greedy. Returns `[batch]` i64 ids, on the device.
    pub(crate) fn pick(&self, logits: &Tensor, step: usize, uniforms: &[f64]) -> Result<Tensor> {
        let b = logits.shape()[0];
        let v = self.vocab;
        let mut s = logits.reshape_to(&[b, v])?.to_dtype(DType::F32)?;
        if let Some((r, seen)) = &self.penalty {
            // Positive logits are divided by the penalty, negative ones multiplied.
            let shrunk = s
                .lt(&Tensor::scalar(0.0, DType::F32, &self.device)?)?
                .where_cond(&s.mul(r)?, &s.div(r)?)?;
            s = seen.where_cond(&shrunk, &s)?;
        }
        if let Some((suppress, allow)) = &self.eos_bias {
            s = s.add(if step < self.min_new_tokens {
                suppress
            } else {
                allow
            })?;
        }
        if !self.do_sample {
            return Ok(s.argmax(-1, false)?);
        }
        if let Some(t) = &self.temperature {
            s = s.div(t)?;
        }
        // Best first; exp(s - max) is 0 for suppressed (-inf) tokens.
        let (sorted, order) = s.topk(v, -1)?;
        let mut probs = sorted.sub(&sorted.narrow(1, 0, 1)?)?.exp()?;
        let zeros = probs.full_like(0.0)?;
        if let Some(k) = &self.top_k {
            probs = self.iota.lt(k)?.where_cond(&probs, &zeros)?;
        }
        probs = probs.div(&probs.sum(&[-1], true)?)?;
        if let Some(p) = &self.top_p {
            // Keep tokens until the mass reaches p, the one crossing it included.
            let before = probs.cumsum(-1)?.sub(&probs)?;
            probs = before.lt(p)?.where_cond(&probs, &zeros)?;
        }
        if let Some(m) = &self.min_p {
            let floor = probs.narrow(1, 0, 1)?.mul(m)?;
            probs = probs.ge(&floor)?.where_cond(&probs, &zeros)?;
        }
        // Inverse CDF: the first kept token whose cumulative mass exceeds u * total.
        let cdf = probs.cumsum(-1)?;
        let u = Tensor::from_f64s(uniforms, &[b, 1], DType::F32, &self.device)?;
        let target = u.mul(&cdf.narrow(1, v - 1, 1)?)?;
        let below = cdf.le(&target)?.to_dtype(DType::I64)?.sum(&[-1], true)?;
        let kept = probs
            .gt(&Tensor::scalar(0.0, DType::F32, &self.device)?)?
            .to_dtype(DType::I64)?
            .sum(&[-1], true)?;
        let last = kept.sub(&Tensor::scalar(1.0, DType::I64, &self.device)?)?;
        let at = below.minimum(&last)?;
        Ok(order.gather(-1, &at)?.reshape_to(&[b])?)
    }

    /// Marks `ids` (`[batch]`, on the device) as seen by each row, for the repetition penalty.
    pub(crate) fn observe(&mut self, ids: &Tensor) -> Result<()> {
        if let Some((_, seen)) = &mut self.penalty {
            let b = ids.shape()[0];
            let hit = self.iota.eq(&ids.reshape_to(&[b, 1])?)?;
            *seen = seen.logical_or(&hit)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use zoo_runtime::Generator;

    use super::*;

    /// The tensor path (run eagerly here; the same ops are recorded on PJRT) picks what the
    /// host path picks, over many random rows and every processor.
    #[test]
    fn device_processors_pick_what_the_host_picks() {
        let vocab = 96;
        let eos = [3u32, 50];
        let prompts = vec![vec![1u32, 2, 7, 7, 40], vec![3u32, 90]];
        let base = GenerationOptions::greedy(4);
        let variants = [
            GenerationOptions {
                repetition_penalty: Some(1.7),
                min_new_tokens: 2,
                ..base.clone()
            },
            GenerationOptions {
                do_sample: true,
                ..base.clone()
            },
            GenerationOptions {
                do_sample: true,
                temperature: 0.6,
                top_k: Some(9),
                ..base.clone()
            },
            GenerationOptions {
                do_sample: true,
                top_p: Some(0.7),
                repetition_penalty: Some(1.2),
                ..base.clone()
            },
            GenerationOptions {
                do_sample: true,
                temperature: 1.4,
                min_p: Some(0.1),
                top_k: Some(40),
                top_p: Some(0.95),
                min_new_tokens: 3,
                ..base.clone()
            },
        ];
        let mut logits_rng = Generator::new(5);
        for (v, opts) in variants.iter().enumerate() {
            let sampler = DeviceSampler::new(opts, &prompts, &eos, vocab, &Device::Cpu).unwrap();
            let mut u_rng = Generator::new(v as u64);
            for trial in 0..60 {
                let step = trial % 4;
                let logits = logits_rng
                    .randn(&[2, 1, vocab], DType::F32, &Device::Cpu)
                    .unwrap()
                    .mul_scalar(3.0)
                    .unwrap();
                let rows = logits.to_vec::<f32>().unwrap();
                let uniforms = [u_rng.next_f64(), u_rng.next_f64()];
                let got = sampler
                    .pick(&logits, step, &uniforms)
                    .unwrap()
                    .to_vec::<i64>()
                    .unwrap();
                for b in 0..2 {
                    let mut scores = rows[b * vocab..(b + 1) * vocab].to_vec();
                    // A generator whose next draw is this row's uniform.
                    let mut host_rng = FixedDraw(uniforms[b]);
                    let want = crate::generation::processors::pick_with(
                        &mut scores,
                        crate::generation::processors::Row {
                            seq: &prompts[b],
                            pads: 0,
                        },
                        step,
                        &eos,
                        opts,
                        &mut || host_rng.next(),
                    );
                    assert_eq!(
                        got[b],
                        i64::from(want),
                        "variant {v}, trial {trial}, row {b}"
                    );
                }
            }
        }
    }

    struct FixedDraw(f64);

    impl FixedDraw {
        fn next(&mut self) -> f64 {
            self.0
        }
    }
}
