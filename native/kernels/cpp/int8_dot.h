// shoal: the integer products of the few-rows path (decode): activations quantized to int8
// against 4- or 8-bit affine weights, as plain data, so that the per-instruction-set
// translation units (int8_avx2.cpp, int8_vnni.cpp twice) need no other
// header: each is compiled for instructions some CPUs lack (its own flags in build.rs), and
// any inline function of a shared header compiled there could be picked by the linker for
// every caller. Only <cstdint> is included here.

#pragma once

#include <cstdint>

namespace shoal {

/// One product `out = xq @ dequantize(w)^T` with `x` already quantized per group
/// (see int8_path.cpp): everything as pointers and counts.
struct Int8Job {
  const uint32_t* w;      // packed weights, `w_row` words between output columns
  int64_t w_row;
  const void* scales;     // per column and group, `sb_row` elements between columns
  const void* biases;
  int64_t sb_row;
  int sb_kind;            // 0 f32, 1 f16, 2 bf16
  const int8_t* xq;       // rows * k: each chunk of 32 in the weights' byte order
  const float* dx;        // rows * k / 32: the step of each chunk of 32 (x ~ dx * xq)
  const int32_t* xqsum;   // rows * k / 32: the sum of each chunk's xq
  const float* xsum;      // rows * groups: the sum of the group's x (what biases multiply)
  float* out;
  const int64_t* out_rows; // output row of each row
  int rows, n, k, group, bits;
};

/// Output columns `[n0, n1)` of every row of `job`.
using Int8Columns = void (*)(const Int8Job& job, int n0, int n1);

#if defined(__x86_64__)
/// AVX2: byte products with `vpmaddubsw`, eight 32-bit sums per instruction pair.
void int8_columns_avx2(const Int8Job& job, int n0, int n1);
/// AVX-VNNI (VEX): `vpdpbusd` sums four byte products into each 32-bit lane.
void int8_columns_avxvnni(const Int8Job& job, int n0, int n1);
/// AVX-512 VNNI on 256-bit registers (the same `vpdpbusd`, EVEX-encoded).
void int8_columns_avx512vnni(const Int8Job& job, int n0, int n1);
#endif

} // namespace shoal
