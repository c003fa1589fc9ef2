// shoal: products with MLX affine-quantized weights on the CPU, as an MLX primitive.
//
// MLX's own CPU kernel for `quantized_matmul` unpacks one weight at a time and runs at about
// a tenth of what the memory allows (0.7 GB/s on a 4-bit 2048 x 5632 product, where OpenBLAS
// reads f32 at 8.6 GB/s). This primitive computes `out = x @ dequantize(w)^T` for 2-, 3-, 4-,
// 5-, 6- and 8-bit affine weights (any group size that is a multiple of 8, 16 included, which
// MLX's own kernels refuse) reading each packed word once for every row of `x`: AVX2 + FMA
// where the CPU has them (chosen at run time), plain C++ elsewhere. Being a primitive, it runs
// inside MLX's graph on the CPU stream like any other operation: no evaluation barrier is
// added. A second primitive dequantizes (embedding lookups of such weights).
//
// Layout (MLX's): `w` is `[n, k * bits / 32]` uint32, each row a little-endian bit stream with
// value `c` in bits `bits * c ..` (packed_bits.h); `scales` and `biases` are `[n, k / group]`
// (f32, f16 or bf16); `x` is `[..., k]` f32. The value of element `(r, c)` is
// `scales[r, c / g] * q + biases[r, c / g]`.

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

#include "mlx/c/error.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"

#include "affine_kernels.h"
#include "mlx_glue.h"
#include "int8_path.h"

namespace shoal {

using namespace mlx::core;

/// Offsets (in elements) of every element of `a`, in order, for any strides.
std::vector<int64_t> element_offsets(const array& a) {
  const int nd = static_cast<int>(a.ndim());
  std::vector<int64_t> out(a.size());
  for (int64_t i = 0; i < static_cast<int64_t>(out.size()); ++i) {
    int64_t rest = i, offset = 0;
    for (int d = nd - 1; d >= 0; --d) {
      offset += (rest % a.shape(d)) * a.strides()[d];
      rest /= a.shape(d);
    }
    out[i] = offset;
  }
  return out;
}

/// `x`'s rows as the kernels read them: in place when each row is contiguous, else copied
/// into `copy`.
const float* rows_of(const array& x, std::vector<int64_t>& rows, std::vector<float>& copy) {
  rows = row_offsets(x);
  const int64_t k = x.shape(-1);
  const float* base = x.data<float>();
  if (x.ndim() == 0 || x.strides().back() == 1 || k <= 1) {
    return base;
  }
  const int64_t step = x.strides().back();
  copy.resize(rows.size() * k);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int64_t c = 0; c < k; ++c) {
      copy[r * k + c] = base[rows[r] + c * step];
    }
    rows[r] = static_cast<int64_t>(r) * k;
  }
  return copy.data();
}

/// The product `out = x @ dequantize(w)^T` of `x`'s rows (`xs` + `rows`, `k` wide) with the
/// 2-D weights `w` (or the last two axes of stacked ones, from their start).
Problem plain_problem(
    const float* xs,
    std::vector<int64_t> rows,
    int k,
    const array& w,
    const array& scales,
    const array& biases,
    int group,
    int bits,
    float* out) {
  Problem p;
  p.k = k;
  p.group = group;
  p.bits = bits;
  p.x = xs;
  p.sb_type = scales.dtype();
  p.out = out;
  const int wd = static_cast<int>(w.ndim());
  p.n = w.shape(wd - 2);
  p.w_row = w.strides()[wd - 2];
  p.sb_row = scales.strides()[wd - 2];
  p.rows = std::move(rows);
  p.out_rows.resize(p.rows.size());
  for (size_t i = 0; i < p.out_rows.size(); ++i) {
    p.out_rows[i] = static_cast<int64_t>(i);
  }
  p.w = w.data<uint32_t>();
  p.scales = scales.data<void>();
  p.biases = biases.data<void>();
  return p;
}

/// One output per row of `x` per weight row: `x @ dequantize(w)^T` on the CPU (see the file's
/// comment); with `gather`, batch entry `b` of `x` (`[b..., m, k]`) uses the matrix
/// `indices[b]` of stacked weights `[experts, n, k']`, as MLX's `gather_qmm` does.
class AffineProduct : public UnaryPrimitive {
 public:
  AffineProduct(Stream stream, int group, int bits, Isa isa, bool gather)
      : UnaryPrimitive(stream), group_(group), bits_(bits), isa_(isa), gather_(gather) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    dispatch(stream(), inputs, out, [inputs, out, group = group_, bits = bits_, isa = isa_,
                                     gather = gather_]() mutable {
      const array& x = inputs[0];
      const array& w = inputs[1];
      const array& scales = inputs[2];
      const array& biases = inputs[3];
      std::vector<float> copy;
      std::vector<int64_t> rows;
      const float* xs = rows_of(x, rows, copy);
      if (!gather) {
        run(plain_problem(xs, rows, x.shape(-1), w, scales, biases, group, bits,
                          out.data<float>()),
            isa);
        return;
      }
      Problem p = plain_problem(xs, {}, x.shape(-1), w, scales, biases, group, bits,
                                out.data<float>());
      // Gathered: group the rows by the matrix they use, one product per matrix.
      const array& indices = inputs[4];
      const int experts = w.shape(0);
      const int64_t m = x.shape(-2);
      const std::vector<int64_t> picks = element_offsets(indices);
      std::vector<std::vector<int64_t>> by_expert(experts);
      for (size_t b = 0; b < picks.size(); ++b) {
        const int64_t e = read_index(indices, picks[b]);
        if (e < 0 || e >= experts) {
          // Out of range: the rows stay zero rather than read past the weights.
          for (int64_t i = 0; i < m; ++i) {
            std::fill_n(p.out + (b * m + i) * p.n, p.n, 0.0f);
          }
          continue;
        }
        by_expert[e].push_back(static_cast<int64_t>(b));
      }
      for (int e = 0; e < experts; ++e) {
        if (by_expert[e].empty()) {
          continue;
        }
        p.rows.clear();
        p.out_rows.clear();
        for (int64_t b : by_expert[e]) {
          for (int64_t i = 0; i < m; ++i) {
            p.rows.push_back(rows[b * m + i]);
            p.out_rows.push_back(b * m + i);
          }
        }
        p.w = w.data<uint32_t>() + e * w.strides()[0];
        p.scales = static_cast<const char*>(scales.data<void>()) +
            e * scales.strides()[0] * scales.itemsize();
        p.biases = static_cast<const char*>(biases.data<void>()) +
            e * biases.strides()[0] * biases.itemsize();
        run(p, isa);
      }
    });
  }

  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("shoal's CPU quantized product runs on the CPU only");
  }

  const char* name() const override {
    return "ShoalAffineProduct";
  }

  bool is_equivalent(const Primitive& other) const override {
    auto* o = dynamic_cast<const AffineProduct*>(&other);
    return o && o->group_ == group_ && o->bits_ == bits_ && o->isa_ == isa_ &&
        o->gather_ == gather_;
  }

 private:
  static int64_t read_index(const array& indices, int64_t offset) {
    switch (indices.dtype()) {
      case uint32:
        return indices.data<uint32_t>()[offset];
      case int32:
        return indices.data<int32_t>()[offset];
      case int64:
        return indices.data<int64_t>()[offset];
      case uint64:
        return static_cast<int64_t>(indices.data<uint64_t>()[offset]);
      default:
        return -1;
    }
  }

  int group_;
  int bits_;
  Isa isa_;
  bool gather_;
};

/// SwiGLU's two products and their combination as one primitive: `silu(x @ G^T) * (x @ U^T)`
/// for a gate `G` and an up projection `U` of one layout (MLX's `silu(g) = g · sigmoid(g)`,
/// in that order). One array instead of four (two products, the activation, the product of
/// the two) in every MLP of a decode step.
class SwigluProduct : public UnaryPrimitive {
 public:
  SwigluProduct(Stream stream, int group, int bits, Isa isa)
      : UnaryPrimitive(stream), group_(group), bits_(bits), isa_(isa) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    dispatch(stream(), inputs, out, [inputs, out, group = group_, bits = bits_,
                                     isa = isa_]() mutable {
      const array& x = inputs[0];
      std::vector<float> copy;
      std::vector<int64_t> rows;
      const float* xs = rows_of(x, rows, copy);
      const int k = x.shape(-1);
      float* gate = out.data<float>();
      std::vector<float> up(out.size());
      run(plain_problem(xs, rows, k, inputs[1], inputs[2], inputs[3], group, bits, gate), isa);
      run(plain_problem(xs, rows, k, inputs[4], inputs[5], inputs[6], group, bits, up.data()),
          isa);
      for (size_t i = 0; i < up.size(); ++i) {
        const float g = gate[i];
        gate[i] = g * (1.0f / (1.0f + std::exp(-g))) * up[i];
      }
    });
  }

  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("shoal's CPU SwiGLU product runs on the CPU only");
  }

  const char* name() const override {
    return "ShoalSwigluProduct";
  }

  bool is_equivalent(const Primitive& other) const override {
    auto* o = dynamic_cast<const SwigluProduct*>(&other);
    return o && o->group_ == group_ && o->bits_ == bits_ && o->isa_ == isa_;
  }

 private:
  int group_;
  int bits_;
  Isa isa_;
};

[[noreturn]] void fail(const std::string& what) {
  throw std::invalid_argument("[shoal cpu_affine_qmm] " + what);
}

/// A weight as the kernels read it: a materialized array whose last axis is contiguous is
/// read in place (a tensor-parallel rank's slice included); anything else is copied once.
array readable(const array& a, Stream stream) {
  if (a.is_available() && a.ndim() > 0 && a.strides().back() == 1) {
    return a;
  }
  return contiguous(a, false, stream);
}

/// Checks the operands (weights `[..., n, k * bits / 32]`) and returns `n`.
int check_operands(
    const array& x,
    const array& w,
    const array& scales,
    const array& biases,
    int group,
    int bits,
    int weight_axes) {
  if (bits < 2 || bits > 8 || bits == 7) {
    fail("only 2-, 3-, 4-, 5-, 6- and 8-bit weights; got " + std::to_string(bits));
  }
  if (group <= 0 || group % 8 != 0) {
    fail("the group size must be a positive multiple of 8; got " + std::to_string(group));
  }
  if (x.dtype() != float32 || x.ndim() < 1) {
    fail("x must be float32 with at least one axis");
  }
  if (w.dtype() != uint32 || static_cast<int>(w.ndim()) != weight_axes) {
    fail("w must be a " + std::to_string(weight_axes) + "-D uint32 array");
  }
  const int n = w.shape(-2);
  const int k = x.shape(-1);
  if (static_cast<int64_t>(w.shape(-1)) * 32 != static_cast<int64_t>(k) * bits || k % group != 0) {
    fail("x's last axis (" + std::to_string(k) + ") does not match w's packed width (" +
         std::to_string(w.shape(-1)) + " words of " + std::to_string(bits) + " bits, groups of " +
         std::to_string(group) + ")");
  }
  for (const array* a : {&scales, &biases}) {
    Shape want = w.shape();
    want.back() = k / group;
    if (a->shape() != want) {
      fail("scales and biases must be w's shape with k / group columns");
    }
    if (a->dtype() != float32 && a->dtype() != float16 && a->dtype() != bfloat16) {
      fail("scales and biases must be f32, f16 or bf16");
    }
  }
  if (scales.dtype() != biases.dtype()) {
    fail("scales and biases must have one dtype");
  }
  return n;
}

/// Builds the product's node.
array affine_product(
    const array& x,
    const array& w,
    const array& scales,
    const array& biases,
    int group,
    int bits,
    Isa isa,
    Stream stream) {
  const int n = check_operands(x, w, scales, biases, group, bits, 2);
  Shape shape = x.shape();
  shape.back() = n;
  return array(
      std::move(shape),
      float32,
      std::make_shared<AffineProduct>(stream, group, bits, isa, false),
      {x, readable(w, stream), readable(scales, stream), readable(biases, stream)});
}

/// Builds SwiGLU's node: `x` `[..., k]` and a gate and an up projection `[n, k']` of one
/// layout; the output is `[..., n]`.
array swiglu_product(
    const array& x,
    const array& wg,
    const array& sg,
    const array& bg,
    const array& wu,
    const array& su,
    const array& bu,
    int group,
    int bits,
    Isa isa,
    Stream stream) {
  const int n = check_operands(x, wg, sg, bg, group, bits, 2);
  if (check_operands(x, wu, su, bu, group, bits, 2) != n) {
    fail("the gate and up projections must have as many rows");
  }
  Shape shape = x.shape();
  shape.back() = n;
  return array(
      std::move(shape),
      float32,
      std::make_shared<SwigluProduct>(stream, group, bits, isa),
      {x, readable(wg, stream), readable(sg, stream), readable(bg, stream), readable(wu, stream),
       readable(su, stream), readable(bu, stream)});
}

/// Builds the gathered product's node: `x` `[..., m, k]`, `indices` `[...]` (broadcast
/// together), weights `[experts, n, k']`; the output is `[broadcast..., m, n]`.
array affine_gather_product(
    const array& x,
    const array& w,
    const array& scales,
    const array& biases,
    const array& indices,
    int group,
    int bits,
    Isa isa,
    Stream stream) {
  const int n = check_operands(x, w, scales, biases, group, bits, 3);
  if (x.ndim() < 2) {
    fail("a gathered product's x must be [..., m, k]");
  }
  if (!issubdtype(indices.dtype(), integer)) {
    fail("expert indices must be integers");
  }
  Shape batch(x.shape().begin(), x.shape().end() - 2);
  batch = broadcast_shapes(batch, indices.shape());
  Shape x_shape = batch;
  x_shape.push_back(x.shape(-2));
  x_shape.push_back(x.shape(-1));
  Shape out_shape = batch;
  out_shape.push_back(x.shape(-2));
  out_shape.push_back(n);
  return array(
      std::move(out_shape),
      float32,
      std::make_shared<AffineProduct>(stream, group, bits, isa, true),
      {broadcast_to(x, x_shape, stream),
       readable(w, stream),
       readable(scales, stream),
       readable(biases, stream),
       broadcast_to(indices, batch, stream)});
}

/// Every weight of a row-contiguous `[..., n, k * bits / 32]` stack as f32 `[..., n, k]`.
class AffineDequantize : public UnaryPrimitive {
 public:
  AffineDequantize(Stream stream, int group, int bits, Isa isa)
      : UnaryPrimitive(stream), group_(group), bits_(bits), isa_(isa) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    dispatch(stream(), inputs, out, [inputs, out, group = group_, bits = bits_,
                                     isa = isa_]() mutable {
      const array& w = inputs[0];
      Problem p;
      p.k = out.shape(-1);
      p.n = p.k == 0 ? 0 : static_cast<int>(out.size() / p.k);
      p.group = group;
      p.bits = bits;
      p.w = w.data<uint32_t>();
      p.w_row = w.shape(-1);
      p.scales = inputs[1].data<void>();
      p.biases = inputs[2].data<void>();
      p.sb_row = inputs[1].shape(-1);
      p.sb_type = inputs[1].dtype();
      dequantize(p, out.data<float>(), isa);
    });
  }

  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("shoal's CPU dequantization runs on the CPU only");
  }

  const char* name() const override {
    return "ShoalAffineDequantize";
  }

  bool is_equivalent(const Primitive& other) const override {
    auto* o = dynamic_cast<const AffineDequantize*>(&other);
    return o && o->group_ == group_ && o->bits_ == bits_ && o->isa_ == isa_;
  }

 private:
  int group_;
  int bits_;
  Isa isa_;
};

/// Builds the dequantization's node (operands as for a product; any leading axes).
array affine_dequantize(
    const array& w,
    const array& scales,
    const array& biases,
    int group,
    int bits,
    Isa isa,
    Stream stream) {
  if (w.ndim() < 2) {
    fail("w must have at least two axes");
  }
  const int k = static_cast<int>(static_cast<int64_t>(w.shape(-1)) * 32 / bits);
  Shape x_shape = {1, k};
  check_operands(
      zeros(x_shape, float32, stream), w, scales, biases, group, bits, static_cast<int>(w.ndim()));
  Shape shape = w.shape();
  shape.back() = k;
  auto dense = [&](const array& a) {
    return a.flags().row_contiguous ? a : contiguous(a, false, stream);
  };
  return array(
      std::move(shape),
      float32,
      std::make_shared<AffineDequantize>(stream, group, bits, isa),
      {dense(w), dense(scales), dense(biases)});
}

} // namespace shoal

/// The path a code names (`shoal::Isa`'s numbers); an unknown code is `Auto`.
shoal::Isa isa_of(int code) {
  return code >= 0 && code <= static_cast<int>(shoal::Isa::Exact)
      ? static_cast<shoal::Isa>(code)
      : shoal::Isa::Auto;
}

/// The message of the last error a shoal entry reported on this thread, then forgets it (""
/// when there is none); valid until the thread's next call.
extern "C" const char* shoal_take_last_error() {
  static thread_local std::string taken;
  taken = std::move(shoal::last_error);
  shoal::last_error.clear();
  return taken.c_str();
}

/// Whether this CPU runs the path `isa` names: 1 or 0.
extern "C" int shoal_cpu_qmm_isa_available(int isa) {
  return shoal::isa_available(isa_of(isa)) ? 1 : 0;
}

/// mlx-c style entry: `*res = x @ dequantize(w, scales, biases)^T`. `isa`: 0 picks the fastest
/// the CPU has, the others force one path (`shoal::Isa`; for tests). A forced path this CPU
/// lacks falls back to the plain C++ f32 path.
extern "C" int shoal_cpu_affine_qmm(
    mlx_array* res,
    const mlx_array x,
    const mlx_array w,
    const mlx_array scales,
    const mlx_array biases,
    int group_size,
    int bits,
    int isa,
    const mlx_stream s) {
  return mlx_c_entry(res, [&] {
    return shoal::affine_product(
        mlx_array_get_(x), mlx_array_get_(w), mlx_array_get_(scales), mlx_array_get_(biases),
        group_size, bits, isa_of(isa), mlx_stream_get_(s));
  });
}

/// The gathered form (`gather_qmm` without left indices): `*res[b] = x[b] @
/// dequantize(w[indices[b]])^T` for every batch entry `b` of `x` `[..., m, k]` broadcast with
/// `indices`; weights `[experts, n, k * bits / 32]`.
extern "C" int shoal_cpu_affine_gather_qmm(
    mlx_array* res,
    const mlx_array x,
    const mlx_array w,
    const mlx_array scales,
    const mlx_array biases,
    const mlx_array indices,
    int group_size,
    int bits,
    int isa,
    const mlx_stream s) {
  return mlx_c_entry(res, [&] {
    return shoal::affine_gather_product(
        mlx_array_get_(x), mlx_array_get_(w), mlx_array_get_(scales), mlx_array_get_(biases),
        mlx_array_get_(indices), group_size, bits, isa_of(isa), mlx_stream_get_(s));
  });
}

/// `*res = dequantize(w, scales, biases)` as f32, for the layouts the products read (groups of
/// 16 included, which MLX's `dequantize` refuses).
extern "C" int shoal_cpu_affine_dequantize(
    mlx_array* res,
    const mlx_array w,
    const mlx_array scales,
    const mlx_array biases,
    int group_size,
    int bits,
    int isa,
    const mlx_stream s) {
  return mlx_c_entry(res, [&] {
    return shoal::affine_dequantize(
        mlx_array_get_(w), mlx_array_get_(scales), mlx_array_get_(biases), group_size, bits,
        isa_of(isa), mlx_stream_get_(s));
  });
}

/// `*res = silu(x @ dequantize(wg, sg, bg)^T) * (x @ dequantize(wu, su, bu)^T)`: SwiGLU's gate
/// and up projections, of one layout, as one primitive.
extern "C" int shoal_cpu_swiglu_qmm(
    mlx_array* res,
    const mlx_array x,
    const mlx_array wg,
    const mlx_array sg,
    const mlx_array bg,
    const mlx_array wu,
    const mlx_array su,
    const mlx_array bu,
    int group_size,
    int bits,
    int isa,
    const mlx_stream s) {
  return mlx_c_entry(res, [&] {
    return shoal::swiglu_product(
        mlx_array_get_(x), mlx_array_get_(wg), mlx_array_get_(sg), mlx_array_get_(bg),
        mlx_array_get_(wu), mlx_array_get_(su), mlx_array_get_(bu), group_size, bits,
        isa_of(isa), mlx_stream_get_(s));
  });
}
