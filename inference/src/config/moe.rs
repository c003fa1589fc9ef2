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
}

impl MoeConfig {
    /// Whether layer `layer` has experts (else a dense MLP of `intermediate_size`).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.num_experts > 0
            && layer >= self.first_dense
            && !self.dense_layers.contains(&layer)
            && (layer + 1).is_multiple_of(self.sparse_step.max(1))
    }

    /// Parameters of one MoE feed-forward (router, every expert and the shared expert).
    pub fn parameters(&self, hidden: usize) -> usize {
        hidden * self.num_experts
            + 3 * hidden * (self.expert_width * self.num_experts + self.shared_width)
    }

    /// Parameters one token runs through in one MoE feed-forward.
    pub fn active_parameters(&self, hidden: usize) -> usize {
        hidden * self.num_experts
            + 3 * hidden * (self.expert_width * self.experts_per_token + self.shared_width)
    }
}
