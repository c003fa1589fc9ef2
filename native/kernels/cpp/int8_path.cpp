// shoal: the int8-activation path of the few-rows product (decode): which instruction set runs
// it, the rows of x quantized for it, and its plain C++ form (the reference the instruction-set
// forms are tested against, and what other CPUs run when asked for it).
//
// Why int8 activations: one token's products are bound by decoding weights, not by memory.
// Decoding eight 4-bit weights to floats and multiplying them costs about five instructions;
// with x in bytes, 32 weights cost about six (`vpmaddubsw`, or one `vpdpbusd` with VNNI), and
// each group's integer sum becomes a float once. The price is x's rounding: each row's values
// are rounded to steps of `max|x| / 127` per chunk of 32 (llama.cpp's Q8_0 blocks: a larger
// block lets one outlier erase its neighbours), an error per product of at most
// `sum |w| * dx / 2` (what `inference/tests/cpu_qmm.rs` asserts).

#include "int8_path.h"

#include <algorithm>
#include <cmath>

#include "mlx/types/half_types.h"

namespace shoal {

using namespace mlx::core;

namespace {

/// Position of element `e` (0..32) of a chunk in the byte order the weights decode in (see
/// `weights32` in int8_body.h): 4-bit chunks put even elements first, then odd ones.
inline int chunk_position(int bits, int e) {
  return bits == 4 ? (e % 2) * 16 + e / 2 : e;
}

float scale_of(const Int8Job& job, const void* base, int64_t i) {
  switch (job.sb_kind) {
    case 1:
      return static_cast<float>(static_cast<const float16_t*>(base)[i]);
    case 2:
      return static_cast<float>(static_cast<const bfloat16_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

/// The int8 product in plain C++, one element at a time.
void int8_columns_scalar(const Int8Job& job, int n0, int n1) {
  const int groups = job.k / job.group;
  const int per_word = 32 / job.bits;
  const uint32_t mask = (1u << job.bits) - 1;
  const int middle = 1 << (job.bits - 1); // the weights centred as in int8_body.h
  for (int r = n0; r < n1; ++r) {
    const uint32_t* column = job.w + r * job.w_row;
    for (int i = 0; i < job.rows; ++i) {
      const int8_t* xr = job.xq + static_cast<int64_t>(i) * job.k;
      float acc = 0.0f;
      float bias_acc = 0.0f;
      for (int g = 0; g < groups; ++g) {
        const float s = scale_of(job, job.scales, r * job.sb_row + g);
        for (int c0 = g * job.group; c0 < (g + 1) * job.group; c0 += 32) {
          int32_t sum = 0;
          for (int c = c0; c < c0 + 32; ++c) {
            const int q =
                static_cast<int>((column[c / per_word] >> (job.bits * (c % per_word))) & mask);
            sum += (q - middle) * xr[c0 + chunk_position(job.bits, c - c0)];
          }
          acc += s * job.dx[(static_cast<int64_t>(i) * job.k + c0) / 32] * static_cast<float>(sum);
        }
        bias_acc += (scale_of(job, job.biases, r * job.sb_row + g) + middle * s) *
            job.xsum[static_cast<int64_t>(i) * groups + g];
      }
      job.out[job.out_rows[i] * job.n + r] = acc + bias_acc;
    }
  }
}

bool cpu_has(const char* feature) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_strcmp(feature, "avx2") == 0) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c");
  }
  if (__builtin_strcmp(feature, "avxvnni") == 0) {
    return cpu_has("avx2") && __builtin_cpu_supports("avxvnni");
  }
  if (__builtin_strcmp(feature, "avx512vnni") == 0) {
    return cpu_has("avx2") && __builtin_cpu_supports("avx512vnni") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
  }
#endif
  return false;
}

/// The int8 columns function for `isa` (`Auto`: the best this CPU has), or null.
Int8Columns int8_columns_for(Isa isa) {
#if defined(__x86_64__)
  static const bool avx2 = cpu_has("avx2");
  static const bool avxvnni = cpu_has("avxvnni");
  static const bool avx512vnni = cpu_has("avx512vnni");
  switch (isa) {
    case Isa::Auto:
      return avxvnni ? int8_columns_avxvnni
          : avx512vnni ? int8_columns_avx512vnni
          : avx2 ? int8_columns_avx2
                 : nullptr;
    case Isa::Int8Avx2:
      return avx2 ? int8_columns_avx2 : nullptr;
    case Isa::Int8AvxVnni:
      return avxvnni ? int8_columns_avxvnni : nullptr;
    case Isa::Int8Avx512Vnni:
      return avx512vnni ? int8_columns_avx512vnni : nullptr;
    default:
      break;
  }
#endif
  return isa == Isa::Int8Scalar ? int8_columns_scalar : nullptr;
}

} // namespace

bool isa_available(Isa isa) {
  switch (isa) {
    case Isa::Auto:
    case Isa::Exact:
    case Isa::Scalar:
    case Isa::Int8Scalar:
      return true;
    case Isa::Avx2:
      return cpu_has("avx2");
    default:
      return int8_columns_for(isa) != nullptr;
  }
}

bool plan_int8(const Problem& p, Isa isa, Int8Plan& plan) {
  if ((p.bits != 4 && p.bits != 8) || p.group % 32 != 0 || p.k % p.group != 0) {
    return false;
  }
  plan.columns = int8_columns_for(isa);
  if (plan.columns == nullptr) {
    return false;
  }
  const int m = static_cast<int>(p.rows.size());
  const int groups = p.k / p.group;
  const int chunks = p.k / 32;
  plan.xq.assign(static_cast<size_t>(m) * p.k, 0);
  plan.dx.assign(static_cast<size_t>(m) * chunks, 0.0f);
  plan.xqsum.assign(plan.dx.size(), 0);
  plan.xsum.assign(static_cast<size_t>(m) * groups, 0.0f);
  for (int i = 0; i < m; ++i) {
    const float* xr = p.x + p.rows[i];
    int8_t* qr = plan.xq.data() + static_cast<int64_t>(i) * p.k;
    for (int g = 0; g < groups; ++g) {
      float sum = 0.0f;
      for (int c = g * p.group; c < (g + 1) * p.group; ++c) {
        sum += xr[c];
      }
      plan.xsum[static_cast<int64_t>(i) * groups + g] = sum;
    }
    for (int b = 0; b < chunks; ++b) {
      const int c0 = b * 32;
      float amax = 0.0f;
      for (int c = c0; c < c0 + 32; ++c) {
        amax = std::max(amax, std::fabs(xr[c]));
      }
      const float dx = amax / 127.0f;
      const float inverse = dx > 0.0f ? 1.0f / dx : 0.0f;
      int32_t qsum = 0;
      for (int c = c0; c < c0 + 32; ++c) {
        const int q = std::clamp(static_cast<int>(std::nearbyint(xr[c] * inverse)), -127, 127);
        qr[c0 + chunk_position(p.bits, c - c0)] = static_cast<int8_t>(q);
        qsum += q;
      }
      const int64_t at = static_cast<int64_t>(i) * chunks + b;
      plan.dx[at] = dx;
      plan.xqsum[at] = qsum;
    }
  }
  Int8Job& job = plan.job;
  job.w = p.w;
  job.w_row = p.w_row;
  job.scales = p.scales;
  job.biases = p.biases;
  job.sb_row = p.sb_row;
  job.sb_kind = p.sb_type == float16 ? 1 : p.sb_type == bfloat16 ? 2 : 0;
  job.xq = plan.xq.data();
  job.dx = plan.dx.data();
  job.xqsum = plan.xqsum.data();
  job.xsum = plan.xsum.data();
  job.out = p.out;
  job.out_rows = p.out_rows.data();
  job.rows = m;
  job.n = p.n;
  job.k = p.k;
  job.group = p.group;
  job.bits = p.bits;
  return true;
}

} // namespace shoal
