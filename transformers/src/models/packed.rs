//! The real tokens of a padded batch as rows of their own, shared by the encoders (BERT's
//! family, ModernBERT).

use zoo_runtime::{Device, Tensor};

use crate::Result;

/// The real tokens of a padded batch as rows of their own, `[1, N, hidden]`: the linear
/// layers, norms and MLPs run on them alone, so padding costs only attention's keys (what
/// text-embeddings-inference's unpadded batches save; a batch of sentences of mixed
/// lengths pads to its longest). Index tensors on one device.
#[derive(Clone, Debug)]
pub(crate) struct Packed {
    /// Rows of the padded batch.
    pub batch: usize,
    /// Its padded length.
    pub seq: usize,
    /// Each real token's flat index `b * T + t`, `[N]`.
    take: Tensor,
    /// Each padded slot's packed row, or `N` (a row of zeros) for padding, `[B * T]`.
    place: Tensor,
}

impl Packed {
    /// The packing of `keep` (`[B * T]`, true for a real token) on `device`, `None` when no
    /// token is padding.
    pub fn new(
        keep: &[bool],
        (batch, seq): (usize, usize),
        device: &Device,
    ) -> Result<Option<Packed>> {
        if keep.iter().all(|&k| k) {
            return Ok(None);
        }
        let take: Vec<i64> = (0..keep.len() as i64)
            .filter(|&i| keep[i as usize])
            .collect();
        let n = take.len() as i64;
        let mut next = 0;
        let place: Vec<i64> = keep
            .iter()
            .map(|&k| {
                if k {
                    next += 1;
                    next - 1
                } else {
                    n
                }
            })
            .collect();
        Ok(Some(Packed {
            batch,
            seq,
            take: Tensor::from_vec(take, &[n as usize], device)?,
            place: Tensor::from_vec(place, &[keep.len()], device)?,
        }))
    }

    /// The packing on `device`: this one where it is there, else its copy in `copies`, made
    /// the first time a layer on that device asks.
    pub fn on(&self, device: &Device, copies: &mut Vec<(Device, Packed)>) -> Result<Packed> {
        if self.take.device() == *device {
            return Ok(self.clone());
        }
        if let Some((_, p)) = copies.iter().find(|(d, _)| d == device) {
            return Ok(p.clone());
        }
        let p = Packed {
            take: self.take.to_device(device)?,
            place: self.place.to_device(device)?,
            ..self.clone()
        };
        copies.push((*device, p.clone()));
        Ok(p)
    }

    /// `[B, T, width]` → the real tokens' rows `[1, N, width]`.
    pub fn pack(&self, x: &Tensor) -> Result<Tensor> {
        let w = x.shape()[2];
        let flat = x.reshape_to(&[self.batch * self.seq, w])?;
        let n = self.take.shape()[0];
        Ok(flat.index_select(0, &self.take)?.reshape_to(&[1, n, w])?)
    }

    /// `[1, N, width]` → `[B, T, width]`, padding slots zero.
    pub fn unpack(&self, x: &Tensor) -> Result<Tensor> {
        let (n, w) = (x.shape()[1], x.shape()[2]);
        let zero = Tensor::zeros(&[1, w], x.dtype(), &x.device())?;
        let rows = Tensor::cat(&[&x.reshape_to(&[n, w])?, &zero], 0)?;
        Ok(rows
            .index_select(0, &self.place)?
            .reshape_to(&[self.batch, self.seq, w])?)
    }
}
