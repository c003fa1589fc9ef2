// shoal: when the few-rows product runs on int8 activations, and the rows quantized for it
// (see int8_dot.h for the products themselves).

#pragma once

#include <vector>

#include "affine_kernels.h"
#include "int8_dot.h"

namespace shoal {

/// `p`'s rows quantized for the int8 products, and the columns function that runs them.
struct Int8Plan {
  std::vector<int8_t> xq;
  std::vector<float> dx, xsum;
  std::vector<int32_t> xqsum;
  Int8Job job{};
  Int8Columns columns = nullptr;
};

/// Whether `isa` runs `p` on int8 activations (an int8 instruction set asked for, or `Auto`
/// on a CPU with AVX2; 4 or 8 bits, groups of a multiple of 32) and, if so, `plan` ready to
/// run: `x` quantized per row and chunk of 32 to `round(x / dx)` with `dx = max|x| / 127`.
bool plan_int8(const Problem& p, Isa isa, Int8Plan& plan);

/// Whether this CPU can run `isa` (the Rust side lists the instruction sets to test).
bool isa_available(Isa isa);

} // namespace shoal
