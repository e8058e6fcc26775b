//! Low-rank adapters merged into the weights they change, at load: a [`WeightSource`] over
//! the base checkpoint whose patched tensors come out as `W + scale · B·A` (DoRA rescales
//! each output row to its learned magnitude), the rest untouched.

use std::collections::HashMap;
use std::sync::Arc;

use super::{QuantizedWeight, WeightSource};
use crate::{DType, Device, Error, Result, Tensor};

/// How a LoRA product lies over the stored weight it changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoraLayout {
    /// `nn.Linear`: the weight is stored `[out, in]`, as `B·A` is.
    Linear,
    /// Stored `[in, out]`: GPT-2's `Conv1D` (PEFT's `fan_in_fan_out`) and embedding tables
    /// (`[vocab, dim]`, where `lora_embedding_B·lora_embedding_A` is `[dim, vocab]`).
    Transposed,
}

/// One adapter's low-rank update of one weight.
#[derive(Clone, Debug)]
pub struct LoraPair {
    /// `lora_A`, `[r, in]`.
    pub a: Tensor,
    /// `lora_B`, `[out, r]`.
    pub b: Tensor,
    /// The product's factor: `lora_alpha / r` (over `√r` under rsLoRA) times the adapter's
    /// weight.
    pub scale: f64,
    /// DoRA's `lora_magnitude_vector`, `[out]`: each output row of the updated weight is
    /// rescaled to it.
    pub magnitude: Option<Tensor>,
    /// How `B·A` maps onto the stored weight.
    pub layout: LoraLayout,
}

/// What an adapter does to one stored tensor.
#[derive(Clone, Debug)]
pub enum WeightPatch {
    /// Adds a low-rank update.
    Lora(LoraPair),
    /// Replaces the tensor (PEFT's `modules_to_save`, trained biases).
    Replace(Tensor),
}

impl WeightPatch {
    /// `weight` (f32, on the host, as stored) with this patch applied.
    pub fn apply(&self, weight: &Tensor) -> Result<Tensor> {
        let pair = match self {
            WeightPatch::Replace(t) => return t.to_dtype(DType::F32)?.to_device(&Device::Cpu),
            WeightPatch::Lora(p) => p,
        };
        // Everything below works on the `[out, in]` view.
        let w = match pair.layout {
            LoraLayout::Linear => weight.clone(),
            LoraLayout::Transposed => weight.t()?,
        };
        let a = pair.a.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
        let b = pair.b.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
        let mut merged = w.add(&b.matmul(&a)?.mul_scalar(pair.scale)?)?;
        if let Some(m) = &pair.magnitude {
            // DoRA: m / ‖W + s·BA‖ per output row, the norm over the row's inputs.
            let m = m.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
            let norm = merged.square()?.sum(&[1], true)?.sqrt()?;
            let rows = merged.shape()[0];
            merged = merged.mul(&m.reshape_to(&[rows, 1])?.div(&norm)?)?;
        }
        match pair.layout {
            LoraLayout::Linear => Ok(merged),
            LoraLayout::Transposed => merged.t()?.contiguous(),
        }
    }
}

/// A checkpoint with adapters merged into it: tensors without a patch load as the base
/// has them (GGUF blocks stay blocks); a patched tensor loads in f32 on the host, takes its
/// patches in order (adapters merge one after another, as PEFT's `merge_and_unload` does),
/// then converts to the asked dtype and device.
pub struct PatchedWeights {
    base: Arc<dyn WeightSource>,
    patches: HashMap<String, Vec<WeightPatch>>,
}

impl PatchedWeights {
    /// `base` with `patches` by full tensor name. Each name must exist in `base`, and a
    /// replacement must have its shape.
    pub fn new(
        base: Arc<dyn WeightSource>,
        patches: HashMap<String, Vec<WeightPatch>>,
    ) -> Result<PatchedWeights> {
        for (name, list) in &patches {
            let shape = base.shape(name).ok_or_else(|| Error::MissingWeight {
                name: name.clone(),
                hint: "; the adapter changes a weight the base checkpoint does not have (was it \
                       trained on another model?)"
                    .into(),
            })?;
            for p in list {
                let found = match p {
                    WeightPatch::Replace(t) => t.shape().to_vec(),
                    WeightPatch::Lora(l) => {
                        let (out, r) = (l.b.shape()[0], l.b.shape()[1]);
                        let inp = l.a.shape()[1];
                        if l.a.shape()[0] != r {
                            return Err(Error::InvalidArgument {
                                op: "lora",
                                msg: format!(
                                    "{name}: lora_A is {:?} but lora_B is {:?}; their ranks differ",
                                    l.a.shape(),
                                    l.b.shape()
                                ),
                            });
                        }
                        if let Some(m) = &l.magnitude {
                            if m.shape() != [out] {
                                return Err(Error::InvalidArgument {
                                    op: "lora",
                                    msg: format!(
                                        "{name}: the DoRA magnitude is {:?}, the update has {out} rows",
                                        m.shape()
                                    ),
                                });
                            }
                        }
                        match l.layout {
                            LoraLayout::Linear => vec![out, inp],
                            LoraLayout::Transposed => vec![inp, out],
                        }
                    }
                };
                if found != shape {
                    return Err(Error::InvalidArgument {
                        op: "lora",
                        msg: format!(
                            "{name}: the adapter's tensor is {found:?} but the base checkpoint \
                             stores {shape:?}; was the adapter trained on another model?"
                        ),
                    });
                }
            }
        }
        Ok(PatchedWeights { base, patches })
    }

    /// The names that have patches.
    pub fn patched(&self) -> impl Iterator<Item = &str> {
        self.patches.keys().map(String::as_str)
    }
}

impl WeightSource for PatchedWeights {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.base.shape(name)
    }

    fn load(&self, name: &str, dtype: DType, device: &Device) -> Result<Tensor> {
        let Some(list) = self.patches.get(name) else {
            return self.base.load(name, dtype, device);
        };
        let mut w = self.base.load(name, DType::F32, &Device::Cpu)?;
        for p in list {
            w = p.apply(&w)?;
        }
        w.to_dtype(dtype)?.to_device(device)
    }

    fn names(&self) -> Vec<String> {
        self.base.names()
    }

    fn quantized(&self, name: &str) -> Option<Result<QuantizedWeight>> {
        // A merged weight is dense: its blocks no longer hold it.
        if self.patches.contains_key(name) {
            return None;
        }
        self.base.quantized(name)
    }

    fn load_tile(
        &self,
        name: &str,
        dtype: DType,
        origin: &[usize],
        shape: &[usize],
    ) -> Option<Result<Tensor>> {
        if self.patches.contains_key(name) {
            return None;
        }
        self.base.load_tile(name, dtype, origin, shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::MemWeights;

    fn t(v: &[f32], shape: &[usize]) -> Tensor {
        Tensor::from_vec(v.to_vec(), shape, &Device::Cpu).unwrap()
    }

    fn source(w: Tensor) -> Arc<dyn WeightSource> {
        let mut m = MemWeights::new();
        m.insert("w", w);
        Arc::new(m)
    }

    #[test]
    fn linear_and_transposed_updates_agree() {
        // W [2, 3]; B [2, 1], A [1, 3].
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let (a, b) = (t(&[1.0, 0.0, -1.0], &[1, 3]), t(&[2.0, 1.0], &[2, 1]));
        let pair = |layout| LoraPair {
            a: a.clone(),
            b: b.clone(),
            scale: 0.5,
            magnitude: None,
            layout,
        };
        let lin = PatchedWeights::new(
            source(t(&w, &[2, 3])),
            HashMap::from([(
                "w".into(),
                vec![WeightPatch::Lora(pair(LoraLayout::Linear))],
            )]),
        )
        .unwrap();
        let got = lin.load("w", DType::F32, &Device::Cpu).unwrap();
        assert_eq!(got.to_vec::<f32>().unwrap(), [2.0, 2.0, 2.0, 4.5, 5.0, 5.5]);
        // The same weight stored [in, out].
        let tw = t(&w, &[2, 3]).t().unwrap().contiguous().unwrap();
        let tr = PatchedWeights::new(
            source(tw),
            HashMap::from([(
                "w".into(),
                vec![WeightPatch::Lora(pair(LoraLayout::Transposed))],
            )]),
        )
        .unwrap();
        let got = tr.load("w", DType::F32, &Device::Cpu).unwrap();
        assert_eq!(got.shape(), [3, 2]);
        assert_eq!(got.to_vec::<f32>().unwrap(), [2.0, 4.5, 2.0, 5.0, 2.0, 5.5]);
    }

    #[test]
    fn dora_rescales_rows_to_the_magnitude() {
        let pair = LoraPair {
            a: t(&[0.0, 0.0], &[1, 2]),
            b: t(&[0.0, 0.0], &[2, 1]),
            scale: 1.0,
            magnitude: Some(t(&[10.0, 1.0], &[2])),
            layout: LoraLayout::Linear,
        };
        let p = PatchedWeights::new(
            source(t(&[3.0, 4.0, 0.0, 2.0], &[2, 2])),
            HashMap::from([("w".into(), vec![WeightPatch::Lora(pair)])]),
        )
        .unwrap();
        let got = p.load("w", DType::F32, &Device::Cpu).unwrap();
        assert_eq!(got.to_vec::<f32>().unwrap(), [6.0, 8.0, 0.0, 1.0]);
    }

    #[test]
    fn mismatched_shapes_are_refused() {
        let pair = LoraPair {
            a: t(&[0.0; 4], &[1, 4]),
            b: t(&[0.0; 2], &[2, 1]),
            scale: 1.0,
            magnitude: None,
            layout: LoraLayout::Linear,
        };
        let e = PatchedWeights::new(
            source(t(&[0.0; 6], &[2, 3])),
            HashMap::from([("w".into(), vec![WeightPatch::Lora(pair)])]),
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("[2, 4]"), "{e}");
        let e = PatchedWeights::new(
            source(t(&[0.0; 6], &[2, 3])),
            HashMap::from([("v".into(), vec![WeightPatch::Replace(t(&[0.0], &[1]))])]),
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("`v`"), "{e}");
    }
}
