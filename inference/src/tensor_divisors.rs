//! What a tensor-parallel ring size must divide ([`TensorDivisor`]) and the rule the dense and
//! Mixture-of-Experts families share ([`standard_divisors`]); a family with its own rule
//! overrides [`crate::models::base::Family::tensor_divisors`]. A leaf beside
//! [`crate::tensor_split`], which asks each family, so the families can use it.

use crate::config::ModelConfig;
/// What a ring size must divide: placement's type, so that the model card carries the
/// families' rules as they are.
pub use placement::TensorDivisor;

/// The divisors of the attention and feed-forward kinds the dense and Mixture-of-Experts
/// families share: grouped-query heads, the dense MLP's width where a layer has one, each
/// expert's width where a layer has experts, and their quantization groups.
pub fn standard_divisors(config: &ModelConfig) -> Vec<TensorDivisor> {
    let mut out = vec![
        TensorDivisor {
            what: "attention heads".into(),
            count: count_of(config.num_heads),
        },
        TensorDivisor {
            what: "key/value heads".into(),
            count: count_of(config.num_kv_heads),
        },
    ];
    let dense_layer = match &config.moe {
        Some(moe) => (0..config.num_layers).any(|l| !moe.is_moe_layer(l)),
        None => true,
    };
    let mut widths = vec![(
        "output projection inputs",
        config.num_heads * config.head_dim,
    )];
    if dense_layer {
        widths.push(("MLP units", config.intermediate_size));
    }
    if let Some(moe) = &config.moe {
        widths.push(("expert width", moe.expert_width));
        if moe.shared_width > 0 {
            widths.push(("shared expert width", moe.shared_width));
        }
    }
    let group = config.quantization.as_ref().map(|q| q.group_size as usize);
    for (what, width) in widths {
        if what != "output projection inputs" {
            out.push(TensorDivisor {
                what: what.into(),
                count: count_of(width),
            });
        }
        if let Some(g) = group.filter(|&g| g > 0) {
            out.push(TensorDivisor {
                what: format!("{what} ({width}) in quantization groups of {g}"),
                count: count_of(width / g),
            });
        }
    }
    out
}

/// A count as the model card holds it (one that does not fit is 0, which no ring size
/// divides: refused, never wrongly allowed).
pub(crate) fn count_of(count: usize) -> u32 {
    u32::try_from(count).unwrap_or(0)
}
