//! The experts of a mixture-of-experts layer: gated MLPs `down(act(gate(x)) * up(x))`, each
//! token running through the few its router picked, weighted and summed.
//!
//! Eager devices keep one set of layers per expert and run each expert over exactly the
//! tokens routed to it: the routing is read back (a few integers per token) and the tokens
//! grouped, and each token's slots ordered by expert, on the host, as transformers' expert
//! loop does. A lazy (PJRT) graph needs shapes
//! known before it runs, so there the experts are stacked (`[E, 2I, H]`, `[E, H, I]`) and
//! indexed in the graph: when a batch routes fewer token slots than there are experts
//! (decoding), each slot gathers its expert's matrices and only the chosen experts are
//! computed; otherwise (prefill, where nearly every expert is hit) every expert runs over
//! every token as one batched product and each slot picks its row. Both sum a token's expert
//! outputs in increasing expert order, rounding to the model dtype after each addition, as
//! transformers' `index_add_` into a model-dtype buffer does.

use super::{Linear, Weights};
use crate::{Activation, DType, Device, Error, Result, Tensor};

/// The stored names of one expert's three projections (`w1`, `w3`, `w2` in Mixtral's
/// checkpoints; `gate_proj`, `up_proj`, `down_proj` in Qwen's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertNames {
    pub gate: &'static str,
    pub up: &'static str,
    pub down: &'static str,
}

#[derive(Clone, Debug)]
enum Store {
    /// Eager: `[gate, up, down]` per expert (a GGUF block matrix stays blocks).
    PerExpert(Vec<[Linear; 3]>),
    /// Lazy: `gate_up [E, 2I, H]` (gate rows first) and `down [E, H, I]`.
    Stacked { gate_up: Tensor, down: Tensor },
}

/// `E` gated MLPs of width `I` over a residual stream of width `H`.
#[derive(Clone, Debug)]
pub struct Experts {
    store: Store,
    act: Activation,
    experts: usize,
    hidden: usize,
}

impl Experts {
    /// Loads `experts` experts under `w` (the `experts` module), from any layout a checkpoint
    /// stores: transformers' fused `gate_up_proj [E, 2I, H]` and `down_proj [E, H, I]`;
    /// stacked but unfused `gate_proj`, `up_proj` `[E, I, H]` and `down_proj` (llama.cpp's
    /// `ffn_*_exps`, as zoo-hub names them); or per-expert `N.{gate,up,down}.weight` under
    /// `names`. A checkpoint holding more experts than `experts` is refused rather than
    /// truncated.
    pub fn load(
        w: &Weights,
        experts: usize,
        hidden: usize,
        intermediate: usize,
        names: ExpertNames,
        act: Activation,
    ) -> Result<Experts> {
        let (e, h, i) = (experts, hidden, intermediate);
        if e == 0 {
            return Err(Error::InvalidArgument {
                op: "Experts::load",
                msg: format!(
                    "{}: a mixture-of-experts layer needs at least one expert",
                    w.full_name("")
                ),
            });
        }
        let eager = w.device().is_eager();
        let fused = w.contains("gate_up_proj");
        let store = if fused || w.contains("gate_proj") {
            // gate and up `[E, I, H]` each: views of the fused tensor, or stored apart.
            let gate_up = if fused {
                Some(w.get("gate_up_proj", &[e, 2 * i, h])?)
            } else {
                None
            };
            let (gate, up) = match &gate_up {
                Some(gu) => (gu.narrow(1, 0, i)?, gu.narrow(1, i, i)?),
                None => (
                    w.get("gate_proj", &[e, i, h])?,
                    w.get("up_proj", &[e, i, h])?,
                ),
            };
            let down = w.get("down_proj", &[e, h, i])?;
            if eager {
                let expert = |t: &Tensor, x: usize| -> Result<Linear> {
                    Ok(Linear::new(t.narrow(0, x, 1)?.squeeze(0)?, None))
                };
                let per = (0..e)
                    .map(|x| Ok([expert(&gate, x)?, expert(&up, x)?, expert(&down, x)?]))
                    .collect::<Result<_>>()?;
                Store::PerExpert(per)
            } else {
                let gate_up = match gate_up {
                    Some(gu) => gu,
                    None => {
                        let gu = Tensor::cat(&[&gate, &up], 1)?;
                        gu.sync()?;
                        gu
                    }
                };
                Store::Stacked { gate_up, down }
            }
        } else {
            let extra = format!("{e}.{}.weight", names.gate);
            if w.contains(&extra) {
                return Err(Error::InvalidArgument {
                    op: "Experts::load",
                    msg: format!(
                        "the checkpoint holds `{}`, an expert beyond the {e} the config declares; does config.json's expert count match these weights?",
                        w.full_name(&extra)
                    ),
                });
            }
            let per: Vec<[Linear; 3]> = (0..e)
                .map(|x| -> Result<[Linear; 3]> {
                    let ew = w.pp(x.to_string());
                    Ok([
                        Linear::load(&ew.pp(names.gate), h, i, false)?,
                        Linear::load(&ew.pp(names.up), h, i, false)?,
                        Linear::load(&ew.pp(names.down), i, h, false)?,
                    ])
                })
                .collect::<Result<_>>()?;
            if eager {
                Store::PerExpert(per)
            } else {
                stacked(&per)?
            }
        };
        Ok(Experts {
            store,
            act,
            experts: e,
            hidden: h,
        })
    }

    /// The number of experts.
    pub fn len(&self) -> usize {
        self.experts
    }

    /// Always false: a layer has at least one expert.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The device the experts' weights live on.
    pub fn device(&self) -> Device {
        match &self.store {
            Store::PerExpert(v) => v[0][0].device(),
            Store::Stacked { gate_up, .. } => gate_up.device(),
        }
    }

    /// `x [N, H]` through the experts `index [N, k]` (integers in `0..E`) weighted by
    /// `weights [N, k]` → `[N, H]` in x's dtype. Each expert output is multiplied by its
    /// weight in the promoted dtype of the two (f32 weights keep the product in f32) and
    /// rounded to x's dtype before the sum.
    pub fn forward(&self, x: &Tensor, index: &Tensor, weights: &Tensor) -> Result<Tensor> {
        let op = "Experts::forward";
        let (n, k) = match (x.shape(), index.shape()) {
            ([n, h], [n2, k]) if *h == self.hidden && n == n2 && weights.shape() == [*n, *k] => {
                (*n, *k)
            }
            _ => {
                return Err(Error::InvalidArgument {
                    op,
                    msg: format!(
                        "expected x [N, {}], index and weights [N, k]; got x {:?}, index {:?}, weights {:?}",
                        self.hidden,
                        x.shape(),
                        index.shape(),
                        weights.shape()
                    ),
                })
            }
        };
        if k == 0 || k > self.experts {
            return Err(Error::InvalidArgument {
                op,
                msg: format!("{k} experts per token of {}", self.experts),
            });
        }
        // Slots come back ordered by expert within each token, with their weights.
        let (slots, weights) = match &self.store {
            Store::PerExpert(layers) => self.routed(layers, x, index, weights, k)?,
            Store::Stacked { gate_up, down } => {
                let (index, weights) = ascending(index, weights, k)?;
                let slots = if n * k < self.experts {
                    self.gathered(gate_up, down, x, &index, k)?
                } else {
                    self.dense(gate_up, down, x, &index, k)?
                };
                (slots, weights)
            }
        };
        let weighted = slots
            .mul(&weights.reshape_to(&[n * k, 1])?)?
            .to_dtype(x.dtype())?
            .reshape_to(&[n, k, self.hidden])?;
        let mut out = weighted.narrow(1, 0, 1)?.squeeze(1)?;
        for j in 1..k {
            out = out.add(&weighted.narrow(1, j, 1)?.squeeze(1)?)?;
        }
        Ok(out)
    }

    /// Eager: each expert over the tokens routed to it. The indices are read back anyway to
    /// group the tokens, so each token's slots are put in expert order here, on the host;
    /// returns the rows `[N * k, H]` in that order and the weights reordered to match.
    fn routed(
        &self,
        layers: &[[Linear; 3]],
        x: &Tensor,
        index: &Tensor,
        weights: &Tensor,
        k: usize,
    ) -> Result<(Tensor, Tensor)> {
        let ids: Vec<i64> = index.to_dtype(DType::I64)?.to_vec()?;
        let mut slots_of: Vec<Vec<usize>> = vec![Vec::new(); self.experts];
        for (slot, &e) in ids.iter().enumerate() {
            let e = usize::try_from(e)
                .ok()
                .filter(|&e| e < self.experts)
                .ok_or_else(|| Error::InvalidArgument {
                    op: "Experts::forward",
                    msg: format!("expert index {e} is outside 0..{}", self.experts),
                })?;
            slots_of[e].push(slot);
        }
        let device = x.device();
        let mut parts = Vec::new();
        let mut row_of_slot = vec![0i64; ids.len()];
        let mut row = 0;
        for (e, slots) in slots_of.iter().enumerate() {
            if slots.is_empty() {
                continue;
            }
            let tokens: Vec<i64> = slots.iter().map(|s| (s / k) as i64).collect();
            let xe = x.index_select(0, &Tensor::from_vec(tokens, &[slots.len()], &device)?)?;
            let [gate, up, down] = &layers[e];
            let [g, u] = Linear::forward_each([gate, up], &xe)?;
            parts.push(down.forward(&self.act.apply_gated(&g, &u)?)?);
            for &s in slots {
                row_of_slot[s] = row;
                row += 1;
            }
        }
        let mut order: Vec<usize> = (0..ids.len()).collect();
        for token in order.chunks_mut(k) {
            token.sort_by_key(|&s| ids[s]);
        }
        let rows_in_order: Vec<i64> = order.iter().map(|&s| row_of_slot[s]).collect();
        let slot_order: Vec<i64> = order.iter().map(|&s| s as i64).collect();
        let parts: Vec<&Tensor> = parts.iter().collect();
        let rows = Tensor::cat(&parts, 0)?
            .index_select(0, &Tensor::from_vec(rows_in_order, &[ids.len()], &device)?)?;
        let weights = weights
            .reshape_to(&[ids.len()])?
            .index_select(0, &Tensor::from_vec(slot_order, &[ids.len()], &device)?)?;
        Ok((rows, weights))
    }

    /// Lazy, few slots: each slot gathers its expert's matrices `[N * k, 2I, H]`.
    fn gathered(
        &self,
        gate_up: &Tensor,
        down: &Tensor,
        x: &Tensor,
        index: &Tensor,
        k: usize,
    ) -> Result<Tensor> {
        let (n, h) = (x.shape()[0], self.hidden);
        let flat = index.reshape_to(&[n * k])?;
        let xs = x
            .unsqueeze(1)?
            .broadcast_as(&[n, k, h])?
            .reshape_to(&[n * k, 1, h])?;
        let gu = xs.matmul(&gate_up.index_select(0, &flat)?.transpose(-1, -2)?)?;
        let a = self.gated(&gu)?;
        let y = a.matmul(&down.index_select(0, &flat)?.transpose(-1, -2)?)?;
        y.reshape_to(&[n * k, h])
    }

    /// Lazy, many slots: every expert over every token `[E, N, H]`, then each slot's row.
    fn dense(
        &self,
        gate_up: &Tensor,
        down: &Tensor,
        x: &Tensor,
        index: &Tensor,
        k: usize,
    ) -> Result<Tensor> {
        let (n, h, e) = (x.shape()[0], self.hidden, self.experts);
        let xs = x.unsqueeze(0)?.broadcast_as(&[e, n, h])?;
        let a = self.gated(&xs.matmul(&gate_up.transpose(-1, -2)?)?)?;
        let y = a
            .matmul(&down.transpose(-1, -2)?)?
            .reshape_to(&[e * n, h])?;
        // Row of slot (t, j): expert index[t, j], token t.
        let tokens = Tensor::arange(0.0, n as f64, 1.0, DType::I64, &x.device())?
            .unsqueeze(1)?
            .broadcast_as(&[n, k])?;
        let rows = index
            .to_dtype(DType::I64)?
            .mul_scalar(n as f64)?
            .to_dtype(DType::I64)?
            .add(&tokens)?
            .reshape_to(&[n * k])?;
        y.index_select(0, &rows)
    }

    /// `act(gate) * up` of a fused `[.., 2I]` product.
    fn gated(&self, gu: &Tensor) -> Result<Tensor> {
        let i = gu.dim(-1)? / 2;
        self.act
            .apply_gated(&gu.narrow(-1, 0, i)?, &gu.narrow(-1, i, i)?)
    }
}

/// Each token's slots reordered by increasing expert index, the order transformers adds
/// expert outputs in (on the device: a lazy graph cannot read the indices back).
fn ascending(index: &Tensor, weights: &Tensor, k: usize) -> Result<(Tensor, Tensor)> {
    if k == 1 {
        return Ok((index.clone(), weights.clone()));
    }
    // Expert indices are far below 2^24, so f32 holds them exactly.
    let (_, order) = index.to_dtype(DType::F32)?.neg()?.topk(k, -1)?;
    Ok((index.gather(-1, &order)?, weights.gather(-1, &order)?))
}

/// Per-expert layers stacked for a lazy device, computed once at load.
fn stacked(per: &[[Linear; 3]]) -> Result<Store> {
    let mut gate_up = Vec::with_capacity(per.len());
    let mut down = Vec::with_capacity(per.len());
    for [g, u, d] in per {
        gate_up.push(Tensor::cat(&[&g.weight()?, &u.weight()?], 0)?);
        down.push(d.weight()?);
    }
    let gate_up = Tensor::stack(&gate_up.iter().collect::<Vec<_>>(), 0)?;
    let down = Tensor::stack(&down.iter().collect::<Vec<_>>(), 0)?;
    Tensor::sync_all(&[&gate_up, &down])?;
    Ok(Store::Stacked { gate_up, down })
}
