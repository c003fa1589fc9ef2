//! Calling an mlx-c operation that mlx-rs does not expose (a mode argument it leaves out,
//! shoal's own CPU primitives) on the thread's default stream, as an mlx-rs [`Array`].

use crate::error::{InferenceError, Result};
use mlx_rs::{Array, Stream};

/// Runs an mlx-c op that mlx-rs does not expose with a mode, on the thread's default stream.
pub(crate) fn raw_op(
    name: &str,
    f: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32,
) -> Result<Array> {
    let stream = Stream::thread_local_or_default();
    // SAFETY: a fresh, empty array handle for MLX to fill.
    let mut res = unsafe { mlx_sys::mlx_array_new() };
    let rc = f(&mut res, stream.as_ptr());
    // SAFETY: `res` is the handle MLX filled (or left empty on failure); mlx-rs frees it.
    let array = unsafe { Array::from_ptr(res) };
    if rc != 0 {
        return Err(InferenceError::InvalidRequest(format!(
            "MLX rejected {name} (see the MLX error logged above)"
        )));
    }
    Ok(array)
}
