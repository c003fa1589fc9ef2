//! Calling an mlx-c operation that mlx-rs does not expose (a mode argument it leaves out,
//! shoal's own CPU primitives) on the thread's default stream, as an mlx-rs [`Array`].

use mlx_rs::{Array, Stream};

/// Why MLX rejected an operation's operands: `MLX rejected NAME: WHY` (the entry's own message
/// where it gave one). mlx-rs's error handler keeps mlx-c's messages to itself, so shoal's
/// entries leave theirs where this crate reads them back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelError {
    message: String,
}

impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for KernelError {}

/// Runs an mlx-c op that mlx-rs does not expose with a mode, on the thread's default stream:
/// `f` gets the result's handle to fill and the stream, and returns the entry's status (0 for
/// success). Used for shoal's entries ([`crate::ffi`]) and for MLX's own ops whose modes mlx-rs
/// leaves out.
pub fn raw_op(
    name: &str,
    f: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32,
) -> crate::Result<Array> {
    handler_installed();
    let stream = Stream::thread_local_or_default();
    // SAFETY: forgets any earlier message, so the one read below is this call's.
    unsafe { crate::ffi::shoal_take_last_error() };
    // SAFETY: a fresh, empty array handle for MLX to fill.
    let mut res = unsafe { mlx_sys::mlx_array_new() };
    let rc = f(&mut res, stream.as_ptr());
    // SAFETY: `res` is the handle MLX filled (or left empty on failure); mlx-rs frees it.
    let array = unsafe { Array::from_ptr(res) };
    if rc != 0 {
        // SAFETY: a NUL-terminated string the entries keep per thread until the next call.
        let why = unsafe { std::ffi::CStr::from_ptr(crate::ffi::shoal_take_last_error()) }
            .to_string_lossy()
            .into_owned();
        return Err(KernelError {
            message: if why.is_empty() {
                format!("MLX rejected {name}")
            } else {
                format!("MLX rejected {name}: {why}")
            },
        });
    }
    Ok(array)
}

/// Makes sure mlx-rs's error handler is MLX's before an mlx-c call of ours. mlx-rs installs it
/// at its first operation; before that mlx-c's default handler prints and exits the process,
/// so a rejected operand in the first operation a process ran would end it (a test that only
/// fed shoal's primitives bad operands exited with status 255).
fn handler_installed() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Any mlx-rs operation installs it; this one computes nothing.
        let _ = Array::from_f32(0.0).as_dtype(mlx_rs::Dtype::Float32);
    });
}
