// shoal: what every CPU primitive of shoal's needs from MLX and mlx-c: allocating an output and
// queueing its computation on the CPU stream, and the mlx-c style error convention of the
// `extern "C"` entries.

#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"

#include "mlx/c/error.h"
#include "mlx/c/private/array.h"

namespace shoal {

/// Allocates `out` and runs `job` on the CPU stream `stream`'s encoder, after `inputs`.
template <typename F>
void dispatch(mlx::core::Stream stream, const std::vector<mlx::core::array>& inputs,
              mlx::core::array& out, F&& job) {
  out.set_data(mlx::core::allocator::malloc(out.nbytes()));
  auto& encoder = mlx::core::cpu::get_command_encoder(stream);
  for (const mlx::core::array& a : inputs) {
    encoder.set_input_array(a);
  }
  encoder.set_output_array(out);
  encoder.dispatch(std::forward<F>(job));
}

/// Offsets (in elements) of every row of `a` (`[..., k]`, any strides): the last axis walks
/// one row, the others enumerate rows in order.
inline std::vector<int64_t> row_offsets(const mlx::core::array& a) {
  const int nd = static_cast<int>(a.ndim());
  const int64_t k = nd == 0 ? 1 : a.shape(-1);
  const int64_t count = k == 0 ? 0 : static_cast<int64_t>(a.size()) / k;
  std::vector<int64_t> out(count);
  for (int64_t r = 0; r < count; ++r) {
    int64_t rest = r, offset = 0;
    for (int d = nd - 2; d >= 0; --d) {
      offset += (rest % a.shape(d)) * a.strides()[d];
      rest /= a.shape(d);
    }
    out[r] = offset;
  }
  return out;
}

/// The message of the last error a shoal entry reported on this thread (`shoal_take_last_error`):
/// mlx-rs's handler keeps mlx-c's messages to itself, so the Rust side reads shoal's here.
inline thread_local std::string last_error;

} // namespace shoal

/// Runs `build` into `*res` the way mlx-c's entries do: 0, or 1 after reporting the error
/// through mlx-c's handler (and keeping its message in `shoal::last_error`).
template <typename F>
int mlx_c_entry(mlx_array* res, F&& build) {
  try {
    mlx_array_set_(*res, build());
  } catch (std::exception& e) {
    shoal::last_error = e.what();
    mlx_error("%s", e.what());
    return 1;
  }
  return 0;
}
