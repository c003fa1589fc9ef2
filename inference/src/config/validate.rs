//! Whether a configuration's numbers make a model that can be built: checked once after
//! reading, so that no later step divides by zero or allocates from a nonsense size.

use super::{ModelConfig, RopeScaling, RouterKind};
use crate::error::{InferenceError, Result};

impl ModelConfig {
    /// Checks that the numbers make a buildable model.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(InferenceError::BadConfig(m));
        let zero: Vec<&str> = [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("vocab_size", self.vocab_size),
        ]
        .iter()
        .filter(|(_, n)| *n == 0)
        .map(|(name, _)| *name)
        .collect();
        if !zero.is_empty() {
            return bad(format!(
                "a zero-sized model: {} must be positive",
                zero.join(", ")
            ));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "{} query heads are not a multiple of {} key/value heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim {} must be even and positive",
                self.head_dim
            ));
        }
        if self.hidden_size > 1 << 16
            || self.num_layers > 1 << 12
            || self.vocab_size > 1 << 22
            || self.head_dim > 1024
        {
            return bad("implausibly large dimensions".into());
        }
        // YaRN scales the whole head before rotating (crate::rope): with a partial rotary
        // width only the rotated part should be, which only latent attention does here.
        if matches!(self.rope_scaling, RopeScaling::Yarn { .. })
            && self.attention.latent.is_none()
            && self.attention.rotary_dim.is_some()
        {
            return bad(format!(
                "YaRN rope_scaling with a partial rotary width is not supported in this build \
                 ({:?})",
                self.architecture
            ));
        }
        if let Some(r) = self.attention.rotary_dim {
            if r == 0 || r > self.head_dim || !r.is_multiple_of(2) {
                return bad(format!(
                    "a rotary width of {r} in heads of {}: it must be even, positive and at \
                     most head_dim",
                    self.head_dim
                ));
            }
        }
        if let Some(latent) = &self.attention.latent {
            // Each width sizes tables and projections before any weight is read (YaRN's
            // periods: half the rotated width): an edited config once asked for 2 TiB.
            let heads = [
                latent.qk_nope_head_dim,
                latent.qk_rope_head_dim,
                latent.v_head_dim,
            ];
            let ranks = [latent.kv_lora_rank, latent.q_lora_rank.unwrap_or(0)];
            if heads.iter().any(|&w| w > 1024) || ranks.iter().any(|&r| r > 1 << 16) {
                return bad(format!(
                    "latent attention of {latent:?}: implausibly large widths (heads' at most \
                     1024, ranks at most 65536)"
                ));
            }
        }
        if let Some(moe) = &self.moe {
            if moe.num_experts == 0
                || moe.experts_per_token == 0
                || moe.experts_per_token > moe.num_experts
                || moe.expert_width == 0
                || moe.num_experts > 1 << 12
                || moe.expert_width > 1 << 16
            {
                return bad(format!(
                    "a Mixture-of-Experts layer of {} experts, {} per token, {} wide cannot be built",
                    moe.num_experts, moe.experts_per_token, moe.expert_width
                ));
            }
            if let RouterKind::SigmoidGroupedTopK {
                groups, top_groups, ..
            }
            | RouterKind::SoftmaxGroupedTopK {
                groups, top_groups, ..
            } = moe.router
            {
                let per_group = moe.num_experts.checked_div(groups).unwrap_or(0);
                if groups == 0
                    || !moe.num_experts.is_multiple_of(groups)
                    || top_groups == 0
                    || top_groups > groups
                    || top_groups * per_group < moe.experts_per_token
                    || (groups > 1 && per_group < 2)
                {
                    return bad(format!(
                        "{} experts in n_group {groups} with topk_group {top_groups} cannot \
                         route {} experts per token: n_group must divide the experts into \
                         groups of at least 2, and the kept groups must hold k experts",
                        moe.num_experts, moe.experts_per_token
                    ));
                }
            }
        }
        Ok(())
    }
}
