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
    /// The quantized weights of a pre-quantized checkpoint, under their HF names.
    prequantized: Option<zoo_hub::PreQuantized>,
    bar: Mutex<Option<ProgressBar>>,
}

impl HubSource {
    pub(crate) fn new(
        weights: zoo_hub::Weights,
        prequantized: Option<zoo_hub::PreQuantized>,
        show_progress: bool,
    ) -> HubSource {
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
            prequantized,
            bar: Mutex::new(bar),
        }
    }

    /// The checkpoint's tensors.
    pub(crate) fn inventory(&self) -> &zoo_hub::Inventory {
        self.weights.inventory()
    }

    /// The opened files.
    pub(crate) fn files(&self) -> &zoo_hub::Weights {
        &self.weights
    }

    /// The checkpoint's pre-quantized weights, if it has them.
    pub(crate) fn prequantized(&self) -> Option<&zoo_hub::PreQuantized> {
        self.prequantized.as_ref()
    }

    fn tick(&self) {
        if let Some(bar) = self.bar.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            bar.inc(1);
        }
    }

    /// Drops the mapped pages of a pre-quantized weight's parts once read.
    fn release_parts(&self, name: &str) {
        if let Some(q) = self.prequantized.as_ref().and_then(|c| c.get(name)) {
            for part in q.parts() {
                self.weights.release(part);
            }
        }
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
        if let Some(q) = self.prequantized.as_ref().and_then(|c| c.get(name)) {
            return Some(q.shape.to_vec());
        }
        self.weights.inventory().get(name).map(|i| i.shape.clone())
    }

    fn load(&self, name: &str, dtype: DType, device: &Device) -> Result<Tensor> {
        let hub = |source| Error::Hub {
            name: name.to_string(),
            source: Box::new(source),
        };
        if let Some((c, q)) = self
            .prequantized
            .as_ref()
            .and_then(|c| c.get(name).map(|q| (c, q)))
        {
            let shape = q.shape;
            let w = c.dequantize(&self.weights, name).map_err(hub)?;
            self.release_parts(name);
            self.tick();
            return Tensor::from_vec(w, &shape, &Device::Cpu)?
                .to_dtype(dtype)?
                .to_device(device);
        }
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
        let Some(c) = &self.prequantized else {
            return self.weights.names();
        };
        let mut names: Vec<String> = self
            .weights
            .names()
            .into_iter()
            .filter(|n| !c.is_part(n))
            .collect();
        names.extend(c.names().map(str::to_string));
        names
    }

    fn quantized(&self, name: &str) -> Option<Result<QuantizedWeight>> {
        if let Some(c) = self.prequantized.as_ref().filter(|c| c.get(name).is_some()) {
            let blocks = c.blocks(&self.weights, name).transpose()?;
            let shape = c.get(name).map(|q| q.shape.to_vec()).unwrap_or_default();
            return Some(blocks.map_err(|e| hub_err(name, e)).map(|(ggml, data)| {
                self.release_parts(name);
                self.tick();
                QuantizedWeight {
                    name: name.to_string(),
                    ggml,
                    shape,
                    data,
                }
            }));
        }
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

fn hub_err(name: &str, source: zoo_hub::HubError) -> Error {
    Error::Hub {
        name: name.to_string(),
        source: Box::new(source),
    }
}
