// shoal: the body of the int8 few-rows product, included by each instruction-set translation
// unit (int8_avx2.cpp, int8_vnni.cpp twice) inside an anonymous namespace,
// after that unit defines `Dot` (how 32 byte products are summed into a 256-bit register of
// eight int32) for its instructions. Includes nothing (see int8_dot.h).

/// A scale or bias of `job` as f32 (f16 through F16C, bf16 by its bits).
inline float scale_at(const Int8Job& job, const void* base, int64_t i) {
  const uint16_t* half = static_cast<const uint16_t*>(base);
  switch (job.sb_kind) {
    case 1:
      return _cvtsh_ss(half[i]);
    case 2: {
      const uint32_t bits = static_cast<uint32_t>(half[i]) << 16;
      float value;
      __builtin_memcpy(&value, &bits, sizeof value);
      return value;
    }
    default:
      return static_cast<const float*>(base)[i];
  }
}

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

/// Weights `c..c + 32` of a column as unsigned bytes, in the order `x` was quantized in: for
/// 4 bits the low nibbles of the chunk's 16 bytes (elements 0, 2, .., 30) then the high ones
/// (1, 3, .., 31); for 8 bits the 32 bytes as stored.
template <int BITS>
inline __m256i weights32(const uint32_t* column, int c) {
  if (BITS == 4) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(column + c / 8));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
  }
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(column + c / 4));
}

/// Columns ahead whose weights are fetched into the cache while this one is summed.
constexpr int PREFETCH_AHEAD = 4;

/// Output columns `[n0, n1)` of rows `first..first + ROWS`: each chunk of 32 weights is
/// decoded once and used for every row; each chunk's integer sums become floats scaled by the
/// weights' scale times the row's step for that chunk. The weights are centred
/// (`s * q + b = s * (q - middle) + (b + s * middle)`) so that x's rounding meets only
/// `q - middle`, and the constant part meets the exact sum of x: rounding x then costs half
/// to a third of what it would against `q` itself.
template <int BITS, int ROWS>
void int8_block(const Int8Job& job, int first, int n0, int n1) {
  constexpr int MIDDLE = 1 << (BITS - 1);
  const int groups = job.k / job.group;
  const int8_t* xr[ROWS];
  for (int i = 0; i < ROWS; ++i) {
    xr[i] = job.xq + static_cast<int64_t>(first + i) * job.k;
  }
  const int column_bytes = job.k * BITS / 8;
  for (int r = n0; r < n1; ++r) {
    const uint32_t* column = job.w + r * job.w_row;
    if (r + PREFETCH_AHEAD < n1) {
      // The hardware's prefetcher alone left every weight load waiting on memory.
      const char* ahead = reinterpret_cast<const char*>(column + PREFETCH_AHEAD * job.w_row);
      for (int offset = 0; offset < column_bytes; offset += 64) {
        _mm_prefetch(ahead + offset, _MM_HINT_T0);
      }
    }
    __m256 acc[ROWS];
    float bias_acc[ROWS];
    for (int i = 0; i < ROWS; ++i) {
      acc[i] = _mm256_setzero_ps();
      bias_acc[i] = 0.0f;
    }
    for (int g = 0; g < groups; ++g) {
      const float s = scale_at(job, job.scales, r * job.sb_row + g);
      const float b = scale_at(job, job.biases, r * job.sb_row + g);
      const int c0 = g * job.group;
      for (int c = c0; c < c0 + job.group; c += 32) {
        const __m256i q = weights32<BITS>(column, c);
        for (int i = 0; i < ROWS; ++i) {
          const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr[i] + c));
          __m256i sum = Dot::template add<BITS>(_mm256_setzero_si256(), q, x);
          const int64_t chunk = (static_cast<int64_t>(first + i) * job.k + c) / 32;
          if (BITS == 4 || !Dot::CENTERED_8BIT) {
            // Centre the weights: sum (q - middle) * x, the eight lanes taking middle *
            // sum(x) / 8 each (the middle's share goes to the bias term, with the exact x).
            sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(MIDDLE / 8 * job.xqsum[chunk]));
          }
          acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(s * job.dx[chunk]),
                                   acc[i]);
        }
      }
      for (int i = 0; i < ROWS; ++i) {
        bias_acc[i] += (b + MIDDLE * s) * job.xsum[static_cast<int64_t>(first + i) * groups + g];
      }
    }
    for (int i = 0; i < ROWS; ++i) {
      job.out[job.out_rows[first + i] * job.n + r] = horizontal_sum(acc[i]) + bias_acc[i];
    }
  }
}

template <int BITS>
void int8_all_rows(const Int8Job& job, int n0, int n1) {
  int i = 0;
  for (; i + 8 <= job.rows; i += 8) {
    int8_block<BITS, 8>(job, i, n0, n1);
  }
  for (; i + 4 <= job.rows; i += 4) {
    int8_block<BITS, 4>(job, i, n0, n1);
  }
  for (; i + 2 <= job.rows; i += 2) {
    int8_block<BITS, 2>(job, i, n0, n1);
  }
  for (; i < job.rows; ++i) {
    int8_block<BITS, 1>(job, i, n0, n1);
  }
}

void int8_columns(const Int8Job& job, int n0, int n1) {
  if (job.bits == 4) {
    int8_all_rows<4>(job, n0, n1);
  } else {
    int8_all_rows<8>(job, n0, n1);
  }
}
