//! Reading checkpoint tensors into runtime tensors, with a progress bar and one resident copy.

use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressStyle};
use zoo_runtime::nn::{QuantizedWeight, WeightSource};
use zoo_runtime::{DType, Device, Error, Result, Tensor};

/// A hub checkpoint as a [`WeightSource`] that counts loaded tensors on a progress bar and
/// converts through `load_f32`/`load_bf16`/`load_f16`, which drop each tensor's mapped pages
/// once converted, so a loaded model keeps about one copy of its weights resident instead of
/// the converted copy plus the page cache of the file.
pub(crate) struct HubSource {
    weights: zoo_hub::Weights,
    bar: Mutex<Option<ProgressBar>>,
}

impl HubSource {
    pub(crate) fn new(weights: zoo_hub::Weights, show_progress: bool) -> HubSource {
        let bar = show_progress.then(|| {
            let bar = ProgressBar::new(weights.inventory().len() as u64);
            bar.set_style(
                ProgressStyle::with_template(
                    "loading weights {bar:30} {pos}/{len} tensors {elapsed}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar
        });
        HubSource {
            weights,
            bar: Mutex::new(bar),
        }
    }

    /// The checkpoint's tensors.
    pub(crate) fn inventory(&self) -> &zoo_hub::Inventory {
        self.weights.inventory()
    }

    /// Ends the progress bar (leaving its last line on screen).
    pub(crate) fn finish(&self) {
        if let Some(bar) = self.bar.lock().unwrap_or_else(|p| p.into_inner()).take() {
            bar.finish();
        }
    }
}

impl WeightSource for HubSource {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.weights.inventory().get(name).map(|i| i.shape.clone())
    }

    fn load(&self, name: &str, dtype: DType, device: &Device) -> Result<Tensor> {
        let hub = |source| Error::Hub {
            name: name.to_string(),
            source: Box::new(source),
        };
        let shape = self.shape(name).ok_or_else(|| Error::MissingWeight {
            name: name.to_string(),
            hint: String::new(),
        })?;
        let t = match dtype {
            DType::F32 => {
                Tensor::from_vec(self.weights.load_f32(name).map_err(hub)?, &shape, device)?
            }
            DType::BF16 => {
                Tensor::from_vec(self.weights.load_bf16(name).map_err(hub)?, &shape, device)?
            }
            DType::F16 => {
                Tensor::from_vec(self.weights.load_f16(name).map_err(hub)?, &shape, device)?
            }
            other => self.weights.load(name, other, device)?,
        };
        if let Some(bar) = self.bar.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            bar.inc(1);
        }
        Ok(t)
    }

    fn names(&self) -> Vec<String> {
        self.weights.names()
    }

    fn quantized(&self, name: &str) -> Option<Result<QuantizedWeight>> {
        let view = self.weights.tensor(name).ok()?;
        let zoo_hub::Dtype::Quantized(ggml) = view.info.dtype else {
            return None;
        };
        let q = QuantizedWeight {
            name: name.to_string(),
            ggml,
            shape: view.info.shape.clone(),
            data: view.row_bytes(),
        };
        // The copy is what stays resident; the file's pages can go.
        self.weights.release(name);
        if let Some(bar) = self.bar.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            bar.inc(1);
        }
        Some(Ok(q))
    }
}
