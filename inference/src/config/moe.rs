//! The Mixture-of-Experts part of a configuration: how many experts, how a token picks them,
//! which layers have them.

/// How a Mixture-of-Experts layer picks its experts for a token.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum RouterKind {
    /// Softmax over every expert, then the top k (Qwen3-MoE); with `normalize`, the k
    /// weights are divided by their sum (`norm_topk_prob`).
    SoftmaxTopK {
        /// `norm_topk_prob`.
        normalize: bool,
    },
    /// The top k of the router's logits, then a softmax over those k (gpt-oss).
    TopKSoftmax,
    /// Sigmoid scores; the experts are chosen by score plus a learned per-expert correction
    /// (`e_score_correction_bias`, which balances the load without weighting the output),
    /// first among the `top_groups` best of `groups` groups of experts (a group ranks by its
    /// two best scores), then the top k. The chosen experts' plain sigmoid scores, optionally
    /// divided by their sum, times `scale` weigh their outputs (DeepSeek V3, GLM-4.5,
    /// MiniMax M2).
    SigmoidGroupedTopK {
        /// `n_group` (1: no grouping).
        groups: usize,
        /// `topk_group`: groups whose experts may be chosen.
        top_groups: usize,
        /// Divide the k weights by their sum (`norm_topk_prob`).
        normalize: bool,
        /// `routed_scaling_factor`.
        scale: f32,
    },
    /// Softmax scores, otherwise as [`RouterKind::SigmoidGroupedTopK`] with no correction
    /// (Mistral 4): groups ranked by their two best scores, the top k in the kept ones, their
    /// scores divided by their sum when `normalize` (whatever k), times `scale`.
    SoftmaxGroupedTopK {
        /// `n_group` (1: no grouping).
        groups: usize,
        /// `topk_group`: groups whose experts may be chosen.
        top_groups: usize,
        /// Divide the k weights by their sum (`norm_topk_prob`).
        normalize: bool,
        /// `routed_scaling_factor`.
        scale: f32,
    },
}

/// The Mixture-of-Experts part of a configuration.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MoeConfig {
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Experts each token runs through (top k).
    pub experts_per_token: usize,
    /// Hidden width of one expert's SwiGLU (`moe_intermediate_size`).
    pub expert_width: usize,
    /// How experts are chosen.
    pub router: RouterKind,
    /// Layers that keep a dense MLP (`mlp_only_layers`).
    pub dense_layers: Vec<usize>,
    /// Every `sparse_step`-th layer is MoE (`decoder_sparse_step`; 1: all).
    pub sparse_step: usize,
    /// The first layers that stay dense (`first_k_dense_replace`).
    pub first_dense: usize,
    /// Width of the shared expert every token also runs through, beside the routed ones
    /// (`n_shared_experts × moe_intermediate_size`; 0: none).
    #[serde(default)]
    pub shared_width: usize,
    /// Width the routed experts read and write when it is not the hidden size: Nemotron 3
    /// Super's `moe_latent_size`, with a projection down before them and one up after (0:
    /// the hidden size, no projections).
    #[serde(default)]
    pub latent_width: usize,
}

impl MoeConfig {
    /// Whether layer `layer` has experts (else a dense MLP of `intermediate_size`).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.num_experts > 0
            && layer >= self.first_dense
            && !self.dense_layers.contains(&layer)
            && (layer + 1).is_multiple_of(self.sparse_step.max(1))
    }

    /// Parameters of one MoE feed-forward (router, every expert, the shared expert and the
    /// latent projections).
    pub fn parameters(&self, hidden: usize) -> usize {
        self.parameters_with(hidden, self.num_experts)
    }

    /// Parameters one token runs through in one MoE feed-forward.
    pub fn active_parameters(&self, hidden: usize) -> usize {
        self.parameters_with(hidden, self.experts_per_token)
    }

    /// The router, `experts` routed experts at their input width, the shared expert and the
    /// latent projections (the router and shared expert read the hidden state itself).
    fn parameters_with(&self, hidden: usize, experts: usize) -> usize {
        let (io, projections) = match self.latent_width {
            0 => (hidden, 0),
            latent => (latent, 2 * hidden * latent),
        };
        hidden * self.num_experts
            + 3 * io * self.expert_width * experts
            + 3 * hidden * self.shared_width
            + projections
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn experts(latent_width: usize) -> MoeConfig {
        MoeConfig {
            num_experts: 8,
            experts_per_token: 2,
            expert_width: 32,
            router: RouterKind::TopKSoftmax,
            dense_layers: Vec::new(),
            sparse_step: 1,
            first_dense: 0,
            shared_width: 16,
            latent_width,
        }
    }

    #[test]
    fn latent_experts_are_counted_at_their_width_with_both_projections() {
        let hidden = 128;
        let (wide, latent) = (experts(0), experts(64));
        assert_eq!(
            wide.parameters(hidden),
            128 * 8 + 3 * 128 * 32 * 8 + 3 * 128 * 16
        );
        assert_eq!(
            latent.parameters(hidden),
            128 * 8 + 3 * 64 * 32 * 8 + 3 * 128 * 16 + 2 * 128 * 64
        );
        assert_eq!(
            latent.active_parameters(hidden),
            128 * 8 + 3 * 64 * 32 * 2 + 3 * 128 * 16 + 2 * 128 * 64
        );
    }
}
