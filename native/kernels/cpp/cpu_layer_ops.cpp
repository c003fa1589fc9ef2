// shoal: a transformer layer's small operations on the CPU as single MLX primitives: RMS norm,
// rotary embeddings, and attention of a few new positions over a cache.
//
// MLX 0.32 has no CPU kernels for its `fast::` operations: on the CPU stream `rms_norm` becomes
// five primitives, `rope` about fifteen (arange, exp, cos, sin, four products, a concatenation,
// ...) and attention eight. In a decode step those operations compute on a few hundred floats
// and cost far more to schedule than to run: a SmolLM2-135M token was ~2,900 arrays and ~6,200
// tasks on MLX's CPU stream, and the thread building the graph waited on the throttle of ten
// tasks in flight ~230 times per token. Each primitive here replaces one such group, computing
// in f32 in the order MLX's own composition does (so results agree to float rounding).
//
// Inputs may have any strides (views of a KV cache, transposed heads); outputs are
// row-contiguous f32.

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"

#include "mlx/c/private/stream.h"

#include "mlx_glue.h"

// The inner loops compiled twice on x86-64 Linux, for AVX2 and for the baseline, the loader
// picking one for the CPU it runs on (GCC's function multi-versioning).
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define SHOAL_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SHOAL_VECTOR_CLONES
#endif

namespace shoal {

using namespace mlx::core;

namespace {

[[noreturn]] void fail(const std::string& op, const std::string& what) {
  throw std::invalid_argument("[shoal " + op + "] " + what);
}

/// Offset in elements of element `(i0, i1, i2)` of the leading three axes of a 4-D array.
inline int64_t at3(const array& a, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * a.strides()[0] + i1 * a.strides()[1] + i2 * a.strides()[2];
}

/// Sum of squares of `n` floats `step` apart, in eight running sums as a vectorised reduction
/// adds them.
inline float sum_of_squares(const float* x, int64_t n, int64_t step) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    for (int j = 0; j < 8; ++j) {
      const float v = x[(c + j) * step];
      lanes[j] += v * v;
    }
  }
  float total = 0.0f;
  for (; c < n; ++c) {
    total += x[c * step] * x[c * step];
  }
  for (float l : lanes) {
    total += l;
  }
  return total;
}

/// `out[t] = q · k[t]` for `t < T`, key `t` at `k + t * kt`, its floats `kd` apart. With
/// contiguous keys, four keys at a time in eight running sums each, which the compiler keeps
/// in vector registers (one sum per key would wait on the previous addition at every step).
inline void scores_of(const float* q, const float* k, int64_t kt, int64_t kd, int64_t D,
                      int64_t T, float* out) {
  int64_t t = 0;
  if (kd == 1 && D % 8 == 0) {
    for (; t + 4 <= T; t += 4) {
      float lanes[4][8] = {};
      for (int64_t c = 0; c < D; c += 8) {
        for (int u = 0; u < 4; ++u) {
          const float* kr = k + (t + u) * kt + c;
          for (int j = 0; j < 8; ++j) {
            lanes[u][j] += q[c + j] * kr[j];
          }
        }
      }
      for (int u = 0; u < 4; ++u) {
        float total = 0.0f;
        for (int j = 0; j < 8; ++j) {
          total += lanes[u][j];
        }
        out[t + u] = total;
      }
    }
  }
  for (; t < T; ++t) {
    float total = 0.0f;
    for (int64_t c = 0; c < D; ++c) {
      total += q[c] * k[t * kt + c * kd];
    }
    out[t] = total;
  }
}

/// `out = Σ_t p[t] · v[t]` over `Dv` floats, value `t` at `v + t * vt`, its floats `vd` apart.
/// With contiguous values, 32 outputs at a time held in registers across every `t`.
inline void weighted_sum(const float* p, const float* v, int64_t vt, int64_t vd, int64_t Dv,
                         int64_t T, float* out) {
  int64_t c = 0;
  if (vd == 1) {
    for (; c + 32 <= Dv; c += 32) {
      float acc[32] = {};
      for (int64_t t = 0; t < T; ++t) {
        const float pt = p[t];
        const float* vr = v + t * vt + c;
        for (int j = 0; j < 32; ++j) {
          acc[j] += pt * vr[j];
        }
      }
      std::copy(acc, acc + 32, out + c);
    }
  }
  for (; c < Dv; ++c) {
    float total = 0.0f;
    for (int64_t t = 0; t < T; ++t) {
      total += p[t] * v[t * vt + c * vd];
    }
    out[c] = total;
  }
}

} // namespace

/// `x / sqrt(mean(x²) + eps) * w` over the last axis.
class RmsNormOp : public UnaryPrimitive {
 public:
  RmsNormOp(Stream stream, float eps) : UnaryPrimitive(stream), eps_(eps) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    dispatch(stream(), inputs, out, [inputs, out, eps = eps_]() mutable {
      const array& x = inputs[0];
      const array& w = inputs[1];
      const int64_t d = x.shape(-1);
      const int64_t step = x.strides().back();
      const int64_t w_step = w.strides().back();
      const std::vector<int64_t> rows = row_offsets(x);
      const float* xs = x.data<float>();
      const float* ws = w.data<float>();
      float* o = out.data<float>();
      for (size_t r = 0; r < rows.size(); ++r) {
        const float* xr = xs + rows[r];
        const float mean = sum_of_squares(xr, d, step) / static_cast<float>(d);
        const float inv = 1.0f / std::sqrt(mean + eps);
        float* orow = o + static_cast<int64_t>(r) * d;
        for (int64_t c = 0; c < d; ++c) {
          orow[c] = (xr[c * step] * inv) * ws[c * w_step];
        }
      }
    });
  }

  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("shoal's RMS norm runs on the CPU only");
  }

  const char* name() const override {
    return "ShoalRmsNorm";
  }

  bool is_equivalent(const Primitive& other) const override {
    auto* o = dynamic_cast<const RmsNormOp*>(&other);
    return o && o->eps_ == eps_;
  }

 private:
  float eps_;
};

array rms_norm(const array& x, const array& w, float eps, Stream stream) {
  if (x.dtype() != float32 || w.dtype() != float32) {
    fail("rms_norm", "x and w must be float32");
  }
  if (x.ndim() < 1 || w.ndim() != 1 || w.shape(0) != x.shape(-1)) {
    fail("rms_norm", "w must be one weight per element of x's last axis");
  }
  return array(x.shape(), float32, std::make_shared<RmsNormOp>(stream, eps), {x, w});
}

/// Rotary embeddings in the half-split layout: for `i < dims / 2`, features `i` and
/// `i + dims / 2` of position `p` turn by `p · scale · f_i`, `f_i = base^(-2i/dims)` or
/// `1 / periods[i]`; features from `dims` on are copied. Positions start at `offset`, or at
/// `starts[b]` for batch entry `b` when given.
class RopeOp : public UnaryPrimitive {
 public:
  RopeOp(Stream stream, int dims, float base, float scale, int offset, bool starts, bool periods)
      : UnaryPrimitive(stream),
        dims_(dims),
        base_(base),
        scale_(scale),
        offset_(offset),
        starts_(starts),
        periods_(periods) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    dispatch(stream(), inputs, out, [inputs, out, dims = dims_, base = base_, scale = scale_,
                                     offset = offset_, starts = starts_,
                                     periods = periods_]() mutable {
      const array& x = inputs[0];
      const int64_t B = x.shape(0), H = x.shape(1), L = x.shape(2), D = x.shape(3);
      const int half = dims / 2;
      // MLX: exp(-i · ln(base) / half) in f32, or the reciprocal of the periods.
      std::vector<float> freq(half);
      if (periods) {
        const array& p = inputs[starts ? 2 : 1];
        const float* ps = p.data<float>();
        for (int i = 0; i < half; ++i) {
          freq[i] = 1.0f / ps[i * p.strides()[0]];
        }
      } else {
        const float step = std::log(base) / static_cast<float>(half);
        for (int i = 0; i < half; ++i) {
          freq[i] = std::exp(static_cast<float>(-i) * step);
        }
      }
      const float* xs = x.data<float>();
      const int64_t xd = x.strides()[3];
      float* o = out.data<float>();
      std::vector<float> cos_t(half), sin_t(half);
      for (int64_t b = 0; b < B; ++b) {
        int64_t first = offset;
        if (starts) {
          const array& s = inputs[1];
          first = s.dtype() == int64 ? s.data<int64_t>()[b * s.strides()[0]]
                                     : s.data<int32_t>()[b * s.strides()[0]];
        }
        for (int64_t l = 0; l < L; ++l) {
          const float position = (static_cast<float>(l) + static_cast<float>(first)) * scale;
          for (int i = 0; i < half; ++i) {
            const float theta = position * freq[i];
            cos_t[i] = std::cos(theta);
            sin_t[i] = std::sin(theta);
          }
          for (int64_t h = 0; h < H; ++h) {
            const float* xr = xs + at3(x, b, h, l);
            float* orow = o + ((b * H + h) * L + l) * D;
            for (int i = 0; i < half; ++i) {
              const float x1 = xr[i * xd], x2 = xr[(i + half) * xd];
              orow[i] = x1 * cos_t[i] - x2 * sin_t[i];
              orow[i + half] = x1 * sin_t[i] + x2 * cos_t[i];
            }
            for (int64_t c = dims; c < D; ++c) {
              orow[c] = xr[c * xd];
            }
          }
        }
      }
    });
  }

  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("shoal's RoPE runs on the CPU only");
  }

  const char* name() const override {
    return "ShoalRope";
  }

  bool is_equivalent(const Primitive& other) const override {
    auto* o = dynamic_cast<const RopeOp*>(&other);
    return o && o->dims_ == dims_ && o->base_ == base_ && o->scale_ == scale_ &&
        o->offset_ == offset_ && o->starts_ == starts_ && o->periods_ == periods_;
  }

 private:
  int dims_;
  float base_, scale_;
  int offset_;
  bool starts_, periods_;
};

array rope(
    const array& x,
    int dims,
    float base,
    float scale,
    int offset,
    const array* starts,
    const array* periods,
    Stream stream) {
  if (x.dtype() != float32 || x.ndim() != 4) {
    fail("rope", "x must be float32 [batch, heads, positions, head_dim]");
  }
  if (dims <= 0 || dims % 2 != 0 || dims > x.shape(3)) {
    fail("rope", "the rotated width must be even and at most the head width");
  }
  std::vector<array> inputs = {x};
  if (starts != nullptr) {
    if (starts->ndim() != 1 || starts->shape(0) != x.shape(0) ||
        (starts->dtype() != int32 && starts->dtype() != int64)) {
      fail("rope", "positions must be one int32 start per batch entry");
    }
    inputs.push_back(*starts);
  }
  if (periods != nullptr) {
    if (periods->dtype() != float32 || periods->ndim() != 1 || periods->shape(0) != dims / 2) {
      fail("rope", "periods must be dims / 2 float32 values");
    }
    inputs.push_back(*periods);
  } else if (!(base > 0.0f)) {
    fail("rope", "the base must be positive");
  }
  return array(
      x.shape(),
      float32,
      std::make_shared<RopeOp>(
          stream, dims, base, scale, offset, starts != nullptr, periods != nullptr),
      std::move(inputs));
}

/// The attention `AttentionOp` describes, for every batch entry and key/value head: the
/// queries of that head's group one after another, its keys and values still in the cache
/// from the first.
SHOAL_VECTOR_CLONES void attend(const std::vector<array>& inputs, array& out, float scale, int mask) {
  const array& q = inputs[0];
  const array& k = inputs[1];
  const array& v = inputs[2];
  const int64_t B = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
  const int64_t Hkv = k.shape(1), T = k.shape(2), Dv = v.shape(3);
  const int64_t repeats = Hq / Hkv, queries = repeats * L;
  const int64_t qd = q.strides()[3], kd = k.strides()[3], vd = v.strides()[3];
  const int64_t kt = k.strides()[2], vt = v.strides()[2];
  std::vector<float> qs(queries * D), scores(queries * T), acc(queries * Dv);
  std::vector<char> visible(queries * T);
  std::vector<float> top(queries);
  std::vector<char> any(queries);
  float* o = out.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t g = 0; g < Hkv; ++g) {
      const float* kb = k.data<float>() + k.strides()[0] * b + k.strides()[1] * g;
      const float* vb = v.data<float>() + v.strides()[0] * b + v.strides()[1] * g;
      // Query `i` of the group is head `g · repeats + i / L`, position `i % L`.
      for (int64_t i = 0; i < queries; ++i) {
        const float* qr = q.data<float>() + at3(q, b, g * repeats + i / L, i % L);
        for (int64_t c = 0; c < D; ++c) {
          qs[i * D + c] = scale * qr[c * qd];
        }
        top[i] = -FLT_MAX;
        any[i] = 0;
      }
      for (int64_t i = 0; i < queries; ++i) {
        scores_of(&qs[i * D], kb, kt, kd, D, T, &scores[i * T]);
      }
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t i = 0; i < queries; ++i) {
          float s = scores[i * T + t];
          const int64_t l = i % L;
          bool seen = true;
          if (mask == 1) {
            seen = t <= T - L + l;
          } else if (mask >= 2) {
            const array& m = inputs[3];
            const int64_t at = at3(m, b, g * repeats + i / L, l) + t * m.strides()[3];
            if (mask == 2) {
              seen = m.data<bool>()[at];
            } else {
              s += m.data<float>()[at];
            }
          }
          visible[i * T + t] = seen;
          scores[i * T + t] = s;
          if (seen) {
            any[i] = 1;
            top[i] = std::max(top[i], s);
          }
        }
      }
      for (int64_t i = 0; i < queries; ++i) {
        float sum = 0.0f;
        float* si = &scores[i * T];
        for (int64_t t = 0; t < T; ++t) {
          // Masked keys take MLX's finfo.min: nothing beside a visible key, and an equal share
          // when no key is visible.
          const float e = !any[i] ? 1.0f : visible[i * T + t] ? std::exp(si[t] - top[i]) : 0.0f;
          si[t] = e;
          sum += e;
        }
        for (int64_t t = 0; t < T; ++t) {
          si[t] /= sum;
        }
      }
      for (int64_t i = 0; i < queries; ++i) {
        weighted_sum(&scores[i * T], vb, vt, vd, Dv, T, &acc[i * Dv]);
      }
      for (int64_t i = 0; i < queries; ++i) {
        const int64_t h = g * repeats + i / L;
        std::copy(&acc[i * Dv], &acc[i * Dv] + Dv, o + ((b * Hq + h) * L + i % L) * Dv);
      }
    }
  }
}

/// Attention of `[B, Hq, L, D]` queries over `[B, Hkv, T, D]` keys and `[B, Hkv, T, Dv]`
/// values (query head `h` reads key/value head `h / (Hq / Hkv)`), softmax of `scale · q·k`
/// over the visible keys: all, the causal ones (query `i` sees keys up to `T - L + i`), or
/// those a mask `[B, Hq, L, T]` (broadcast) allows: boolean, or added to the scores. A row
/// whose keys are all masked averages them all, as MLX's composition does.
class AttentionOp : public UnaryPrimitive {
 public:
  enum Mask : int { None = 0, Causal = 1, Boolean = 2, Additive = 3 };

  AttentionOp(Stream stream, float scale, Mask mask)
      : UnaryPrimitive(stream), scale_(scale), mask_(mask) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    dispatch(stream(), inputs, out, [inputs, out, scale = scale_, mask = mask_]() mutable {
      attend(inputs, out, scale, mask);
    });
  }

  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("shoal's attention runs on the CPU only");
  }

  const char* name() const override {
    return "ShoalAttention";
  }

  bool is_equivalent(const Primitive& other) const override {
    auto* o = dynamic_cast<const AttentionOp*>(&other);
    return o && o->scale_ == scale_ && o->mask_ == mask_;
  }

 private:
  float scale_;
  Mask mask_;
};

array attention(
    const array& q,
    const array& k,
    const array& v,
    float scale,
    int mask_mode,
    const array* mask,
    Stream stream) {
  for (const array* a : {&q, &k, &v}) {
    if (a->dtype() != float32 || a->ndim() != 4) {
      fail("attention", "queries, keys and values must be float32 [batch, heads, positions, dim]");
    }
  }
  const int B = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
  const int Hkv = k.shape(1), T = k.shape(2);
  if (k.shape(0) != B || v.shape(0) != B || v.shape(1) != Hkv || v.shape(2) != T ||
      k.shape(3) != D || Hkv == 0 || Hq % Hkv != 0) {
    fail("attention", "keys and values must match the queries' batch, width and head groups");
  }
  std::vector<array> inputs = {q, k, v};
  AttentionOp::Mask kind = AttentionOp::None;
  if (mask_mode == 1) {
    kind = AttentionOp::Causal;
  } else if (mask != nullptr) {
    kind = mask->dtype() == bool_ ? AttentionOp::Boolean : AttentionOp::Additive;
    if (kind == AttentionOp::Additive && mask->dtype() != float32) {
      fail("attention", "an additive mask must be float32");
    }
    inputs.push_back(broadcast_to(*mask, {B, Hq, L, T}, stream));
  }
  return array(
      {B, Hq, L, v.shape(3)},
      float32,
      std::make_shared<AttentionOp>(stream, scale, kind),
      std::move(inputs));
}

} // namespace shoal

/// `*res = rms_norm(x, w, eps)` (float32, `w` one weight per element of `x`'s last axis).
extern "C" int shoal_cpu_rms_norm(
    mlx_array* res,
    const mlx_array x,
    const mlx_array w,
    float eps,
    const mlx_stream s) {
  return mlx_c_entry(res, [&] {
    return shoal::rms_norm(mlx_array_get_(x), mlx_array_get_(w), eps, mlx_stream_get_(s));
  });
}

/// `*res` = `x` `[B, H, L, D]` rotated (half-split layout) over its first `dims` features,
/// positions from `offset`, or from `starts[b]` when `starts` holds an array; frequencies
/// `base^(-2i/dims)` or `1 / periods[i]` when `periods` holds an array.
extern "C" int shoal_cpu_rope(
    mlx_array* res,
    const mlx_array x,
    int dims,
    float base,
    float scale,
    int offset,
    const mlx_array starts,
    const mlx_array periods,
    const mlx_stream s) {
  return mlx_c_entry(res, [&] {
    const mlx::core::array* st = starts.ctx ? &mlx_array_get_(starts) : nullptr;
    const mlx::core::array* pe = periods.ctx ? &mlx_array_get_(periods) : nullptr;
    return shoal::rope(
        mlx_array_get_(x), dims, base, scale, offset, st, pe, mlx_stream_get_(s));
  });
}

/// `*res` = attention of `q` over `k`, `v` (see `AttentionOp`); `mask_mode` 1 causal, else
/// `mask` when it holds an array (boolean or additive float32).
extern "C" int shoal_cpu_attention(
    mlx_array* res,
    const mlx_array q,
    const mlx_array k,
    const mlx_array v,
    float scale,
    int mask_mode,
    const mlx_array mask,
    const mlx_stream s) {
  return mlx_c_entry(res, [&] {
    const mlx::core::array* m = mask.ctx ? &mlx_array_get_(mask) : nullptr;
    return shoal::attention(
        mlx_array_get_(q), mlx_array_get_(k), mlx_array_get_(v), scale, mask_mode, m,
        mlx_stream_get_(s));
  });
}
