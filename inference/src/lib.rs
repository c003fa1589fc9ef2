//! Inference: transformer decoders on MLX (through mlx-rs), shardable by layer range.

pub mod platform;
pub mod ring;
