//! A whole model in this process, ready to generate: the simplest way to run a model
//! (`shoal generate`, the tests). It joins the [`crate::loader`] and [`crate::generate`].

use crate::error::Result;
use crate::loader::{load_shard, LoadOptions};
use crate::models::shard::ModelShard;
use crate::request::{Completion, GenerateRequest, Prompt, TokenEvent};
use crate::sequence_forward::LocalForward;
use crate::tokenizer::Tokenizer;
use crate::weights::WeightFormat;
use std::ops::ControlFlow;
use std::path::Path;

/// A whole model in this process, ready to generate.
pub struct Engine {
    /// The model (all layers).
    pub model: ModelShard,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
}

impl Engine {
    /// Loads the whole model at `path`.
    pub fn load(path: impl AsRef<Path>, format: Option<WeightFormat>) -> Result<Engine> {
        let (model, tokenizer) = load_shard(
            path.as_ref(),
            &LoadOptions {
                layers: None,
                format,
            },
            &mut |_, _| {},
        )?;
        Ok(Engine { model, tokenizer })
    }

    /// The prompt as token ids.
    pub fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        crate::generate::prompt_ids(&self.tokenizer, prompt)
    }

    /// Generates a completion, calling `on_token` for every token as it is produced; the
    /// callback returns `ControlFlow::Break(())` to cancel (checked between tokens).
    pub fn generate(
        &self,
        request: &GenerateRequest,
        on_token: impl FnMut(TokenEvent<'_>) -> ControlFlow<()>,
    ) -> Result<Completion> {
        let mut local = LocalForward::new(&self.model)?;
        crate::generate::generate(&mut local, &self.tokenizer, request, on_token)
    }
}
