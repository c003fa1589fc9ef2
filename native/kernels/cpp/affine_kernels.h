// shoal: the arithmetic of the CPU products with MLX affine-quantized weights (see
// cpu_qmm.cpp for the primitive that runs it inside MLX's graph).

#pragma once

#include <cstdint>
#include <vector>

#include "mlx/dtype.h"

namespace shoal {

using mlx::core::Dtype;

/// Which path and instructions a product uses. `Auto` is the fastest this CPU has: for fewer
/// than 32 rows the int8-activation products (int8_path.cpp) with the best of AVX-VNNI,
/// AVX-512 VNNI and AVX2, for more dequantized tiles through sgemm. The others force one path
/// (tests compare each with a reference); `Exact` is `Auto` with x kept in f32, as are
/// `Scalar` and `Avx2`.
enum class Isa : int {
  Auto = 0,
  Scalar = 1,
  Avx2 = 2,
  Int8Scalar = 3,
  Int8Avx2 = 4,
  Int8AvxVnni = 5,
  Int8Avx512Vnni = 6,
  Exact = 7,
};

/// Everything one product needs, resolved to pointers and strides.
struct Problem {
  const float* x;            // rows of `k` floats
  std::vector<int64_t> rows; // offset of each row of x, in floats
  const uint32_t* w;
  int64_t w_row;             // words between weight rows
  const void* scales;
  const void* biases;
  int64_t sb_row;            // elements between rows of scales / biases
  Dtype sb_type = mlx::core::float32;
  float* out;
  std::vector<int64_t> out_rows; // output row of each row of x (its offset / n)
  int n, k, group, bits; // bits: 2, 3, 4, 5, 6 or 8 (MLX's packing, see packed_bits.h)
};

/// The whole product `out = x @ dequantize(w)^T` for the rows and weights `p` describes, shared
/// with a helper thread per core when it is large.
void run(const Problem& p, Isa isa);

/// Every weight `p` describes as floats, `[n, k]` row-major, into `out` (`x` and the rows are
/// not read).
void dequantize(const Problem& p, float* out, Isa isa);

} // namespace shoal
