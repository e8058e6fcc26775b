//! The fixed-capacity key/value cache of a decoder, and the attention masks read from it.
//!
//! Each layer holds `k` and `v` buffers of shape `[batch, kv_heads, capacity, head_dim]`,
//! allocated once on that layer's device. On eager devices a forward pass writes its keys and
//! values in place and attends over the slots filled so far. On compiled (PJRT) devices every
//! shape must stay the same from one decode step to the next, or each step would compile a
//! new program: the write is a `dynamic_update_slice` at a position tensor, attention spans
//! the whole capacity, and the mask hides the slots not filled yet. Per row, the cache also
//! remembers which slots hold real tokens, so that left padding is masked out.

use zoo_runtime::{DType, Device, Tensor};

use crate::{Error, Result};

/// What the cache holds for one attention layer, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheSpec {
    /// Self-attention over the tokens so far (with an optional window), or cross-attention
    /// to an encoder's output.
    pub attention: CacheAttention,
    /// Key/value heads of this layer.
    pub kv_heads: usize,
    /// Channels per head of this layer.
    pub head_dim: usize,
    /// The device of this layer's buffers (the layer's own).
    pub device: Device,
}

/// The kind of attention a cached layer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheAttention {
    /// Causal self-attention; a sliding `window` sees only that many slots back.
    SelfAttention {
        /// `None` for full attention.
        window: Option<usize>,
    },
    /// Cross-attention: keys and values of the encoder's output, written once
    /// ([`KvCache::store_cross`]) and read every step.
    Cross,
}

impl CacheSpec {
    /// A causal self-attention layer (full when `window` is `None`).
    pub fn self_attention(
        kv_heads: usize,
        head_dim: usize,
        window: Option<usize>,
        device: Device,
    ) -> CacheSpec {
        CacheSpec {
            attention: CacheAttention::SelfAttention { window },
            kv_heads,
            head_dim,
            device,
        }
    }

    /// A cross-attention layer.
    pub fn cross(kv_heads: usize, head_dim: usize, device: Device) -> CacheSpec {
        CacheSpec {
            attention: CacheAttention::Cross,
            kv_heads,
            head_dim,
            device,
        }
    }
}

/// Keys and values of every layer for a batch of sequences.
///
/// Not `Clone`: on eager devices the buffers are written in place, so a copy that shared them
/// would see the other's writes.
#[derive(Debug)]
pub struct KvCache {
    /// Per layer: its spec and its buffers (self-attention: allocated at full capacity;
    /// cross-attention: `None` until [`KvCache::store_cross`]).
    layers: Vec<(CacheSpec, Option<(Tensor, Tensor)>)>,
    batch: usize,
    capacity: usize,
    /// Slots filled so far (the same for every row: rows are left-padded to one length).
    len: usize,
    /// `valid[b][s]`: slot `s` of row `b` holds a real token (not padding).
    valid: Vec<Vec<bool>>,
    /// The device of each layer's buffers.
    devices: Vec<Device>,
    /// The write position `[0, 0, start, 0]` uploaded once per device and forward pass,
    /// not once per layer.
    write_at: std::collections::HashMap<Device, (usize, Tensor)>,
}

impl KvCache {
    /// An empty cache for `batch` rows of up to `capacity` tokens, one layer per spec, each
    /// with its own heads, head size and device.
    pub fn from_specs(
        specs: &[CacheSpec],
        batch: usize,
        capacity: usize,
        dtype: DType,
    ) -> Result<KvCache> {
        if batch == 0 || capacity == 0 {
            return Err(Error::Generation(format!(
                "a KV cache needs at least one row and one slot (batch {batch}, capacity {capacity})"
            )));
        }
        let layers = specs
            .iter()
            .map(|spec| {
                let shape = [batch, spec.kv_heads, capacity, spec.head_dim];
                let buffers = match spec.attention {
                    CacheAttention::SelfAttention { .. } => Some((
                        Tensor::zeros(&shape, dtype, &spec.device)?,
                        Tensor::zeros(&shape, dtype, &spec.device)?,
                    )),
                    CacheAttention::Cross => None,
                };
                Ok((spec.clone(), buffers))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache {
            layers,
            batch,
            capacity,
            len: 0,
            valid: vec![vec![false; capacity]; batch],
            devices: specs.iter().map(|s| s.device).collect(),
            write_at: std::collections::HashMap::new(),
        })
    }

    /// An empty cache of `layers` full self-attention layers of one shape on `device`.
    pub fn new(
        layers: usize,
        batch: usize,
        kv_heads: usize,
        capacity: usize,
        head_dim: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<KvCache> {
        let spec = CacheSpec::self_attention(kv_heads, head_dim, None, *device);
        KvCache::from_specs(&vec![spec; layers], batch, capacity, dtype)
    }

    /// The spec of each layer.
    pub fn specs(&self) -> impl Iterator<Item = &CacheSpec> {
        self.layers.iter().map(|(s, _)| s)
    }

    /// The device of each layer's buffers.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Rows in the batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Slots per row.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slots filled so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every token (the buffers are kept and overwritten).
    pub fn reset(&mut self) {
        self.len = 0;
        for row in &mut self.valid {
            row.fill(false);
        }
    }

    /// Reserves `t` slots for the next forward pass, marking which hold real tokens
    /// (`token_mask[b][i]`, all true when `None`). Returns the first slot.
    pub fn begin(&mut self, t: usize, token_mask: Option<&[Vec<bool>]>) -> Result<usize> {
        if self.len + t > self.capacity {
            return Err(Error::Generation(format!(
                "the KV cache holds {} tokens; {} more do not fit (context used {}); \
                 ask for fewer new tokens or a shorter prompt",
                self.capacity, t, self.len
            )));
        }
        if let Some(m) = token_mask {
            if m.len() != self.batch || m.iter().any(|r| r.len() != t) {
                return Err(Error::Generation(format!(
                    "attention mask must be [{}, {t}] to match the input ids",
                    self.batch
                )));
            }
        }
        let start = self.len;
        for (b, row) in self.valid.iter_mut().enumerate() {
            for i in 0..t {
                row[start + i] = token_mask.is_none_or(|m| m[b][i]);
            }
        }
        self.len += t;
        Ok(start)
    }

    /// Writes `k`, `v` (`[batch, kv_heads, t, head_dim]`) of `layer` at slot `start` and
    /// returns the keys and values of every filled slot (`[batch, kv_heads, len, head_dim]`).
    pub fn update(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        start: usize,
    ) -> Result<(Tensor, Tensor)> {
        let Some((_, Some((ck, cv)))) = self.layers.get_mut(layer) else {
            return Err(Error::Generation(format!(
                "the KV cache has no self-attention layer {layer}; it was built for another model"
            )));
        };
        let k = k.to_dtype(ck.dtype())?.contiguous()?;
        let v = v.to_dtype(cv.dtype())?.contiguous()?;
        let device = ck.device();
        if device.is_eager() {
            ck.write_slice_in_place(2, start, &k)?;
            cv.write_slice_in_place(2, start, &v)?;
            Ok((ck.narrow(2, 0, self.len)?, cv.narrow(2, 0, self.len)?))
        } else {
            let at = match self.write_at.get(&device) {
                Some((s, at)) if *s == start => at.clone(),
                _ => {
                    let at = Tensor::from_vec(vec![0i64, 0, start as i64, 0], &[4], &device)?;
                    self.write_at.insert(device, (start, at.clone()));
                    at
                }
            };
            *ck = ck.dynamic_update_slice(&k, &at)?;
            *cv = cv.dynamic_update_slice(&v, &at)?;
            Ok((ck.clone(), cv.clone()))
        }
    }

    /// Stores the encoder's keys and values (`[batch, kv_heads, encoder_len, head_dim]`) of
    /// cross-attention `layer`, computed once per prompt.
    pub fn store_cross(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let batch = self.batch;
        let Some((spec, slot)) = self.layers.get_mut(layer) else {
            return Err(Error::Generation(format!(
                "the KV cache has no layer {layer}; it was built for another model"
            )));
        };
        if spec.attention != CacheAttention::Cross {
            return Err(Error::Generation(format!(
                "layer {layer} of the KV cache is a self-attention layer, not cross-attention"
            )));
        }
        let want = [batch, spec.kv_heads, k.dim(2)?, spec.head_dim];
        if k.shape() != want || v.shape() != want {
            return Err(Error::Generation(format!(
                "cross-attention keys {:?} and values {:?} of layer {layer} must be {want:?}",
                k.shape(),
                v.shape()
            )));
        }
        *slot = Some((k.to_device(&spec.device)?, v.to_device(&spec.device)?));
        Ok(())
    }

    /// The encoder's keys and values of cross-attention `layer`, once stored.
    pub fn cross(&self, layer: usize) -> Option<(&Tensor, &Tensor)> {
        match self.layers.get(layer)? {
            (spec, Some((k, v))) if spec.attention == CacheAttention::Cross => Some((k, v)),
            _ => None,
        }
    }

    /// The slots attention reads on `device`: those filled so far on eager devices, the
    /// whole capacity on compiled ones (see the module docs).
    pub fn attended_len(&self, device: &Device) -> usize {
        if device.is_eager() {
            self.len
        } else {
            self.capacity
        }
    }

    /// Additive attention bias `[batch, 1, t, len]` on `device` for the `t` queries written at
    /// `start`, `len` being [`KvCache::attended_len`]: 0 where a query may see a key, the
    /// dtype's lowest finite value elsewhere (a finite value, as transformers uses, keeps fully
    /// masked padding rows free of NaN). A key is visible when it is a real token, not in the
    /// future, and, with a sliding `window`, less than `window` slots back.
    pub fn attention_bias(
        &self,
        start: usize,
        t: usize,
        window: Option<usize>,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let len = self.attended_len(device);
        let low = dtype.float_or_default().finite_min();
        let mut m = vec![0f64; self.batch * t * len];
        for (b, row) in self.valid.iter().enumerate() {
            for i in 0..t {
                let q = start + i;
                let base = (b * t + i) * len;
                for (j, &real) in row[..len].iter().enumerate() {
                    let visible = real && j <= q && window.is_none_or(|w| q - j < w);
                    if !visible {
                        m[base + j] = low;
                    }
                }
            }
        }
        Ok(Tensor::from_f64s(
            &m,
            &[self.batch, 1, t, len],
            dtype,
            device,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_follow_their_specs() {
        let specs = [
            CacheSpec::self_attention(2, 8, None, Device::Cpu),
            CacheSpec::self_attention(1, 16, Some(4), Device::Cpu),
            CacheSpec::cross(2, 8, Device::Cpu),
        ];
        let mut cache = KvCache::from_specs(&specs, 1, 6, DType::F32).unwrap();
        assert_eq!(cache.specs().cloned().collect::<Vec<_>>(), specs);
        let start = cache.begin(3, None).unwrap();
        let k = Tensor::ones(&[1, 1, 3, 16], DType::F32, &Device::Cpu).unwrap();
        let (ck, _) = cache.update(1, &k, &k, start).unwrap();
        assert_eq!(ck.shape(), [1, 1, 3, 16]);
        // A layer's own shape is enforced by its buffers; a cross layer takes no update.
        assert!(cache.update(0, &k, &k, start).is_err());
        assert!(cache.update(2, &k, &k, start).is_err());
        assert!(cache.cross(2).is_none());
        let enc = Tensor::ones(&[1, 2, 5, 8], DType::F32, &Device::Cpu).unwrap();
        cache.store_cross(2, &enc, &enc).unwrap();
        assert_eq!(cache.cross(2).unwrap().0.shape(), [1, 2, 5, 8]);
        assert!(cache.store_cross(0, &enc, &enc).is_err());
        let wrong = Tensor::ones(&[1, 1, 5, 8], DType::F32, &Device::Cpu).unwrap();
        assert!(cache.store_cross(2, &wrong, &wrong).is_err());
    }
}
