//! `CLIPTextModelWithProjection` and `CLIPVisionModelWithProjection`: a tower whose pooled
//! state goes through a bias-free projection (`text_projection`, `visual_projection`) into
//! the shared embedding space.

use zoo_runtime::nn::{Linear, Weights};

use crate::kinds::{
    Encoder, EncoderArgs, EncoderOutput, ImageArgs, ImageEncoder, ImageTower, TextTower,
};
use crate::{Error, Result};

/// A CLIP tower under its projection: the projected pooled state is the output's `embeds`
/// (transformers' `text_embeds` / `image_embeds`), without a pooled output.
#[derive(Clone, Debug)]
pub struct WithProjection<T> {
    model: T,
    projection: Linear,
}

impl<T> WithProjection<T> {
    /// The tower under `projection` (`[projection_dim, hidden]`).
    pub fn new(model: T, projection: Linear) -> WithProjection<T> {
        WithProjection { model, projection }
    }

    /// The tower under the projection stored as `name` (`text_projection`,
    /// `visual_projection`) in `w`.
    pub(crate) fn load(
        model: T,
        w: &Weights,
        name: &str,
        hidden: usize,
        projection_dim: usize,
    ) -> Result<WithProjection<T>> {
        let projection = Linear::load(&w.pp(name), hidden, projection_dim, false)?;
        Ok(WithProjection::new(model, projection))
    }

    /// The tower's output with the projected pooled state in `embeds`, the pooled state
    /// kept (`CLIPModel` reports both).
    pub(crate) fn project(&self, mut out: EncoderOutput) -> Result<EncoderOutput> {
        let Some(pooled) = &out.pooler_output else {
            return Err(Error::Internal(
                "a CLIP tower returned no pooled state".into(),
            ));
        };
        let pooled = pooled.to_device(&self.projection.device())?;
        out.embeds = Some(self.projection.forward(&pooled)?);
        Ok(out)
    }

    fn embeds(&self, out: EncoderOutput) -> Result<EncoderOutput> {
        let mut out = self.project(out)?;
        out.pooler_output = None;
        Ok(out)
    }
}

impl<T: TextTower> WithProjection<T> {
    /// The text tower's output, projected ([`Self::project`]).
    pub(crate) fn project_text(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        self.project(self.model.run(args)?)
    }
}

impl<T: ImageTower> WithProjection<T> {
    /// The vision tower's output, projected ([`Self::project`]).
    pub(crate) fn project_image(&self, args: ImageArgs<'_>) -> Result<EncoderOutput> {
        self.project(self.model.run(args)?)
    }
}

impl<T: TextTower> Encoder for WithProjection<T> {
    fn tower(&self) -> &dyn TextTower {
        &self.model
    }
    fn projects(&self) -> bool {
        true
    }
    fn forward(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        self.embeds(self.model.run(args)?)
    }
}

impl<T: ImageTower> ImageEncoder for WithProjection<T> {
    fn tower(&self) -> &dyn ImageTower {
        &self.model
    }
    fn projects(&self) -> bool {
        true
    }
    fn forward(&self, args: ImageArgs<'_>) -> Result<EncoderOutput> {
        self.embeds(self.model.run(args)?)
    }
}
