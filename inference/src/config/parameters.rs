//! How many parameters a configuration's layers hold, in all and per token: for memory
//! estimates, the load watchdog, `/v1/models` and splitting a pipeline by bytes.

use super::ModelConfig;

impl ModelConfig {
    /// Parameters of layer `layer` (every expert counted), for memory and watchdog estimates
    /// and for splitting layers by their bytes.
    pub fn parameters_of_layer(&self, layer: usize) -> usize {
        match crate::models::family(self.architecture).layer_parameters(self, layer) {
            Some(own) => own.all,
            None => self.shared_parameters_of_layer(layer),
        }
    }

    /// The shared count of layer `layer`: an attention (grouped-query, latent or gated, with
    /// a block-sparse indexer where it has one) or a linear mixer, then a gated MLP or experts
    /// of three matrices each, and two norms.
    pub fn shared_parameters_of_layer(&self, layer: usize) -> usize {
        let gate = usize::from(self.attention.output_gate);
        let attn = match (&self.attention.latent, &self.attention.linear) {
            (_, Some(linear)) if linear.is_linear(layer) => {
                linear.shape.parameters(self.hidden_size)
            }
            (Some(latent), _) => latent.parameters(self.hidden_size, self.num_heads),
            _ => {
                self.hidden_size
                    * self.head_dim
                    * ((2 + gate) * self.num_heads + 2 * self.num_kv_heads)
            }
        };
        // The block-sparse indexer (MiniMax M3): its query heads, one key and their norms.
        let indexer = match &self.attention.block_index {
            Some(index) if index.is_sparse(layer) => {
                self.hidden_size * index.head_dim * (index.heads + 1) + 2 * index.head_dim
            }
            _ => 0,
        };
        attn + indexer + self.ffn_parameters(layer).0 + 2 * self.hidden_size
    }

    /// Parameters of layer `layer`'s feed-forward in the shared form (a gated MLP of
    /// `intermediate_size`, or the experts with their router and shared expert): every one,
    /// and those one token runs through.
    pub fn ffn_parameters(&self, layer: usize) -> (usize, usize) {
        match &self.moe {
            Some(moe) if moe.is_moe_layer(layer) => (
                moe.parameters(self.hidden_size),
                moe.active_parameters(self.hidden_size),
            ),
            _ => {
                let dense = 3 * self.hidden_size * self.intermediate_size;
                (dense, dense)
            }
        }
    }

    /// Parameters of every layer, summed.
    pub fn all_layer_parameters(&self) -> usize {
        (0..self.num_layers)
            .map(|l| self.parameters_of_layer(l))
            .sum()
    }

    /// Parameters of layers `range`, summed.
    pub fn range_parameters(&self, range: &std::ops::Range<usize>) -> usize {
        range.clone().map(|l| self.parameters_of_layer(l)).sum()
    }

    /// Parameters one token runs through in every layer (all of them for a dense model; the
    /// router and the top-k experts of an MoE layer).
    pub fn active_layer_parameters(&self) -> usize {
        let family = crate::models::family(self.architecture);
        (0..self.num_layers)
            .map(|l| match family.layer_parameters(self, l) {
                Some(own) => own.active,
                None => {
                    let (all, active) = self.ffn_parameters(l);
                    self.shared_parameters_of_layer(l) - all + active
                }
            })
            .sum()
    }

    /// Parameters outside the layers beyond the embedding, the final norm and the head
    /// ([`crate::models::base::Family::model_parameters_beyond_layers`]).
    pub fn model_parameters_beyond_layers(&self) -> usize {
        crate::models::family(self.architecture).model_parameters_beyond_layers(self)
    }
}
