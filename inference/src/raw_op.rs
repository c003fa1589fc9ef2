//! Calling an mlx-c operation that mlx-rs does not expose (a mode argument it leaves out,
//! shoal's own CPU primitives) as an mlx-rs [`Array`]: `kernels::raw_op`, with its error as
//! this crate's.

use crate::error::{InferenceError, Result};
use mlx_rs::Array;

/// Runs an mlx-c op that mlx-rs does not expose with a mode, on the thread's default stream.
pub(crate) fn raw_op(
    name: &str,
    f: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32,
) -> Result<Array> {
    Ok(kernels::raw_op(name, f)?)
}

/// A kernel's rejection is a request this crate cannot serve, with MLX's reason.
impl From<kernels::KernelError> for InferenceError {
    fn from(e: kernels::KernelError) -> Self {
        InferenceError::InvalidRequest(e.to_string())
    }
}
