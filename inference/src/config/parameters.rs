//! How many parameters a configuration's layers hold, in all and per token: for memory
//! estimates, the load watchdog, `/v1/models` and splitting a pipeline by bytes.

use super::ModelConfig;

impl ModelConfig {
    /// Parameters of layer `layer` (every expert counted), for memory and watchdog estimates
    /// and for splitting layers by their bytes.
    pub fn parameters_of_layer(&self, layer: usize) -> usize {
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
        let ffn = match &self.moe {
            Some(moe) if moe.is_moe_layer(layer) => moe.parameters(self.hidden_size),
            _ => 3 * self.hidden_size * self.intermediate_size,
        };
        attn + ffn + 2 * self.hidden_size
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
        (0..self.num_layers)
            .map(|l| match &self.moe {
                Some(moe) if moe.is_moe_layer(l) => {
                    self.parameters_of_layer(l) - moe.parameters(self.hidden_size)
                        + moe.active_parameters(self.hidden_size)
                }
                _ => self.parameters_of_layer(l),
            })
            .sum()
    }
}
