// shoal: the arithmetic of the CPU products with MLX affine-quantized weights (2, 3, 4, 5, 6
// and 8 bits, as packed_bits.h reads them): a plain C++ path, an AVX2 + FMA path chosen at
// run time, and the helper threads that share a large product (see cpu_qmm.cpp for the
// primitive that runs them inside MLX's graph).

#include "affine_kernels.h"
#include "int8_path.h"
#include "packed_bits.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>

#include <dlfcn.h>

#include "mlx/types/half_types.h"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace shoal {

using namespace mlx::core;

template <typename S>
inline float at(const void* p, int64_t i) {
  return static_cast<float>(static_cast<const S*>(p)[i]);
}

inline float scale_bias(const Problem& p, const void* base, int64_t i) {
  switch (p.sb_type) {
    case float16:
      return at<mlx::core::float16_t>(base, i);
    case bfloat16:
      return at<mlx::core::bfloat16_t>(base, i);
    default:
      return at<float>(base, i);
  }
}

#if defined(__x86_64__)
/// [`scale_bias`] in the AVX2 paths: f16 through F16C (one instruction; MLX's `float16_t`
/// converts in about a dozen integer operations, once per group of 32 weights), bf16 by its
/// bits.
__attribute__((target("avx2,fma,f16c"))) inline float
scale_bias_f16c(const Problem& p, const void* base, int64_t i) {
  const uint16_t* half = static_cast<const uint16_t*>(base);
  switch (p.sb_type) {
    case float16:
      return _cvtsh_ss(half[i]);
    case bfloat16: {
      const uint32_t bits = static_cast<uint32_t>(half[i]) << 16;
      float value;
      __builtin_memcpy(&value, &bits, sizeof value);
      return value;
    }
    default:
      return static_cast<const float*>(base)[i];
  }
}
#endif

/// Output columns `[n0, n1)` of every row, one element at a time.
void product_scalar(const Problem& p, const std::vector<float>& xsums, int n0, int n1) {
  const int m = static_cast<int>(p.rows.size());
  const int groups = p.k / p.group;
  std::vector<double> acc(m);
  for (int r = n0; r < n1; ++r) {
    const uint8_t* wr = reinterpret_cast<const uint8_t*>(p.w + r * p.w_row);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int g = 0; g < groups; ++g) {
      const float s = scale_bias(p, p.scales, r * p.sb_row + g);
      const float b = scale_bias(p, p.biases, r * p.sb_row + g);
      for (int i = 0; i < m; ++i) {
        const float* xr = p.x + p.rows[i];
        float dot = 0.0f;
        for (int c = g * p.group; c < (g + 1) * p.group; ++c) {
          dot += static_cast<float>(packed_value(wr, c, p.bits)) * xr[c];
        }
        acc[i] += s * dot + b * xsums[i * groups + g];
      }
    }
    for (int i = 0; i < m; ++i) {
      p.out[p.out_rows[i] * p.n + r] = static_cast<float>(acc[i]);
    }
  }
}

#if defined(__x86_64__)
/// The eight quantized values of weights `c..c + 8` of row `wr`, as integers: 4 and 8 bits
/// straight from their words, the other widths through `any` ([`Decoder`]).
template <int BITS>
__attribute__((target("avx2,fma,f16c"))) inline __m256i decode8(
    const uint32_t* wr,
    int c,
    __m256i shifts,
    __m256i nibble,
    const Decoder<BITS>& any) {
  if constexpr (BITS == 4) {
    const __m256i word = _mm256_set1_epi32(static_cast<int>(wr[c / 8]));
    return _mm256_and_si256(_mm256_srlv_epi32(word, shifts), nibble);
  } else if constexpr (BITS == 8) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(wr + c / 4));
    return _mm256_cvtepu8_epi32(bytes);
  } else {
    return any(reinterpret_cast<const uint8_t*>(wr), c);
  }
}

/// Columns ahead whose weights are fetched into the cache while this one is summed.
constexpr int PREFETCH_AHEAD = 4;

/// Fetches into the cache the `column_bytes` packed weights of the column `PREFETCH_AHEAD`
/// after row `r` of `p` when there is one before `n1`: as the int8 products do (int8_body.h),
/// since the hardware's prefetcher alone leaves the weight loads waiting on memory.
__attribute__((target("avx2,fma,f16c"))) inline void
prefetch_ahead(const Problem& p, int r, int n1, int column_bytes) {
  if (r + PREFETCH_AHEAD < n1) {
    const char* ahead = reinterpret_cast<const char*>(p.w + (r + PREFETCH_AHEAD) * p.w_row);
    for (int offset = 0; offset < column_bytes; offset += 64) {
      _mm_prefetch(ahead + offset, _MM_HINT_T0);
    }
  }
}

/// The sum of `v`'s eight lanes.
__attribute__((target("avx2,fma,f16c"))) inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

/// Output columns `[n0, n1)` with AVX2 + FMA: eight weights decoded per instruction, each
/// decoded (and scaled) vector used for every row of `x`.
template <int BITS, int ROWS>
__attribute__((target("avx2,fma,f16c"))) void
block_avx2(const Problem& p, const std::vector<float>& xsums, int first_row, int n0, int n1) {
  const int groups = p.k / p.group;
  const __m256i shifts = BITS == 4 ? _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)
                                   : _mm256_setzero_si256();
  const __m256i nibble = _mm256_set1_epi32(0xF);
  const Decoder<BITS> any(p.k);
  const float* xr[ROWS];
  for (int i = 0; i < ROWS; ++i) {
    xr[i] = p.x + p.rows[first_row + i];
  }
  const int column_bytes = p.k * BITS / 8;
  for (int r = n0; r < n1; ++r) {
    const uint32_t* wr = p.w + r * p.w_row;
    prefetch_ahead(p, r, n1, column_bytes);
    __m256 acc[ROWS];
    float bias_acc[ROWS];
    for (int i = 0; i < ROWS; ++i) {
      acc[i] = _mm256_setzero_ps();
      bias_acc[i] = 0.0f;
    }
    for (int g = 0; g < groups; ++g) {
      const float s = scale_bias_f16c(p, p.scales, r * p.sb_row + g);
      const float b = scale_bias_f16c(p, p.biases, r * p.sb_row + g);
      const __m256 sv = _mm256_set1_ps(s);
      const int c0 = g * p.group;
      if constexpr (ROWS <= 4) {
        // Few rows: a group's sums go to two fresh accumulators per row, scaled once at its
        // end. One accumulator per row, scaled per vector, chained every product on the
        // last one's latency (4 cycles for 8 weights, half what the loads allow).
        __m256 part[ROWS][2];
        for (int i = 0; i < ROWS; ++i) {
          part[i][0] = _mm256_setzero_ps();
          part[i][1] = _mm256_setzero_ps();
        }
        int c = c0;
        for (; c + 16 <= c0 + p.group; c += 16) {
          const __m256 q0 = _mm256_cvtepi32_ps(decode8<BITS>(wr, c, shifts, nibble, any));
          const __m256 q1 = _mm256_cvtepi32_ps(decode8<BITS>(wr, c + 8, shifts, nibble, any));
          for (int i = 0; i < ROWS; ++i) {
            part[i][0] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(xr[i] + c), part[i][0]);
            part[i][1] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xr[i] + c + 8), part[i][1]);
          }
        }
        if (c < c0 + p.group) {
          const __m256 q0 = _mm256_cvtepi32_ps(decode8<BITS>(wr, c, shifts, nibble, any));
          for (int i = 0; i < ROWS; ++i) {
            part[i][0] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(xr[i] + c), part[i][0]);
          }
        }
        for (int i = 0; i < ROWS; ++i) {
          acc[i] = _mm256_fmadd_ps(_mm256_add_ps(part[i][0], part[i][1]), sv, acc[i]);
        }
      } else {
        for (int c = c0; c < c0 + p.group; c += 8) {
          const __m256i q = decode8<BITS>(wr, c, shifts, nibble, any);
          const __m256 qs = _mm256_mul_ps(_mm256_cvtepi32_ps(q), sv);
          for (int i = 0; i < ROWS; ++i) {
            acc[i] = _mm256_fmadd_ps(qs, _mm256_loadu_ps(xr[i] + c), acc[i]);
          }
        }
      }
      for (int i = 0; i < ROWS; ++i) {
        bias_acc[i] += b * xsums[(first_row + i) * groups + g];
      }
    }
    for (int i = 0; i < ROWS; ++i) {
      p.out[p.out_rows[first_row + i] * p.n + r] = horizontal_sum(acc[i]) + bias_acc[i];
    }
  }
}

/// 4-bit weights with few rows: sixteen bytes hold 32 weights, their low nibbles the even
/// columns and their high nibbles the odd ones, so two masks and a shift decode them all,
/// multiplied with x's even and odd columns (`pairs`: each row's blocks of 32 as 16 even then
/// 16 odd values, made once per product by `pair_columns`). Decoding eight weights from a
/// word took a variable shift, a mask and a conversion each, and those instructions, not the
/// memory, bounded the f32-x product.
template <int ROWS>
__attribute__((target("avx2,fma,f16c"))) void block4_avx2(
    const Problem& p,
    const std::vector<float>& xsums,
    const float* pairs,
    int first_row,
    int n0,
    int n1) {
  const int groups = p.k / p.group;
  const __m128i low = _mm_set1_epi8(0x0F);
  const float* xr[ROWS];
  for (int i = 0; i < ROWS; ++i) {
    xr[i] = pairs + static_cast<int64_t>(first_row + i) * p.k;
  }
  const int column_bytes = p.k / 2;
  for (int r = n0; r < n1; ++r) {
    const uint8_t* wr = reinterpret_cast<const uint8_t*>(p.w + r * p.w_row);
    prefetch_ahead(p, r, n1, column_bytes);
    __m256 acc[ROWS];
    float bias_acc[ROWS];
    for (int i = 0; i < ROWS; ++i) {
      acc[i] = _mm256_setzero_ps();
      bias_acc[i] = 0.0f;
    }
    for (int g = 0; g < groups; ++g) {
      const __m256 sv = _mm256_set1_ps(scale_bias_f16c(p, p.scales, r * p.sb_row + g));
      const float b = scale_bias_f16c(p, p.biases, r * p.sb_row + g);
      __m256 part[ROWS][2];
      for (int i = 0; i < ROWS; ++i) {
        part[i][0] = _mm256_setzero_ps();
        part[i][1] = _mm256_setzero_ps();
      }
      for (int c = g * p.group; c < (g + 1) * p.group; c += 32) {
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + c / 2));
        const __m128i even = _mm_and_si128(bytes, low);
        const __m128i odd = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);
        const __m256 e0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(even));
        const __m256 e1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(even, 8)));
        const __m256 o0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(odd));
        const __m256 o1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(odd, 8)));
        for (int i = 0; i < ROWS; ++i) {
          const float* x = xr[i] + c;
          part[i][0] = _mm256_fmadd_ps(e0, _mm256_loadu_ps(x), part[i][0]);
          part[i][1] = _mm256_fmadd_ps(e1, _mm256_loadu_ps(x + 8), part[i][1]);
          part[i][0] = _mm256_fmadd_ps(o0, _mm256_loadu_ps(x + 16), part[i][0]);
          part[i][1] = _mm256_fmadd_ps(o1, _mm256_loadu_ps(x + 24), part[i][1]);
        }
      }
      for (int i = 0; i < ROWS; ++i) {
        acc[i] = _mm256_fmadd_ps(_mm256_add_ps(part[i][0], part[i][1]), sv, acc[i]);
        bias_acc[i] += b * xsums[(first_row + i) * groups + g];
      }
    }
    for (int i = 0; i < ROWS; ++i) {
      p.out[p.out_rows[first_row + i] * p.n + r] = horizontal_sum(acc[i]) + bias_acc[i];
    }
  }
}

/// Output columns `[n0, n1)` of every row: eight rows at a time, then four, then one, 4-bit
/// weights of fewer than eight rows through [`block4_avx2`] when `pairs` is made.
template <int BITS>
void product_avx2(
    const Problem& p,
    const std::vector<float>& xsums,
    const std::vector<float>& pairs,
    int n0,
    int n1) {
  const int m = static_cast<int>(p.rows.size());
  int i = 0;
  for (; i + 8 <= m; i += 8) {
    block_avx2<BITS, 8>(p, xsums, i, n0, n1);
  }
  if (BITS == 4 && !pairs.empty()) {
    for (; i + 4 <= m; i += 4) {
      block4_avx2<4>(p, xsums, pairs.data(), i, n0, n1);
    }
    for (; i < m; ++i) {
      block4_avx2<1>(p, xsums, pairs.data(), i, n0, n1);
    }
    return;
  }
  for (; i + 4 <= m; i += 4) {
    block_avx2<BITS, 4>(p, xsums, i, n0, n1);
  }
  for (; i < m; ++i) {
    block_avx2<BITS, 1>(p, xsums, i, n0, n1);
  }
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c");
  return yes;
}

/// Calls `f` with `bits` (2, 3, 4, 5, 6 or 8; checked when the node is built) as a constant.
template <typename F>
void with_bits(int bits, F&& f) {
  switch (bits) {
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 5:
      return f(std::integral_constant<int, 5>{});
    case 6:
      return f(std::integral_constant<int, 6>{});
    default:
      return f(std::integral_constant<int, 8>{});
  }
}
#endif

/// `pairs` for `block4_avx2` and `block4_neon`: x's rows with each block of 32 columns as its
/// 16 even columns, then its 16 odd ones. Empty where that path does not serve (`k` not in
/// blocks of 32).
std::vector<float> pair_columns(const Problem& p) {
  std::vector<float> pairs;
  if (p.bits != 4 || p.group % 32 != 0) {
    return pairs;
  }
  const int m = static_cast<int>(p.rows.size());
  pairs.resize(static_cast<size_t>(m) * p.k);
  for (int i = 0; i < m; ++i) {
    const float* xr = p.x + p.rows[i];
    float* out = pairs.data() + static_cast<int64_t>(i) * p.k;
    for (int c = 0; c < p.k; c += 32) {
      for (int j = 0; j < 16; ++j) {
        out[c + j] = xr[c + 2 * j];
        out[c + 16 + j] = xr[c + 2 * j + 1];
      }
    }
  }
  return pairs;
}

#if defined(__aarch64__)
/// [`block4_avx2`] with NEON for one row: sixteen bytes give 32 weights as even and odd
/// nibbles, widened to four vectors of four floats each, multiplied with x's paired columns.
void block4_neon(const Problem& p, const std::vector<float>& xsums, const float* pairs, int row,
                 int n0, int n1) {
  const int groups = p.k / p.group;
  const uint8x16_t low = vdupq_n_u8(0x0F);
  const float* x = pairs + static_cast<int64_t>(row) * p.k;
  for (int r = n0; r < n1; ++r) {
    const uint8_t* wr = reinterpret_cast<const uint8_t*>(p.w + r * p.w_row);
    float32x4_t acc = vdupq_n_f32(0.0f);
    float bias_acc = 0.0f;
    for (int g = 0; g < groups; ++g) {
      const float s = scale_bias(p, p.scales, r * p.sb_row + g);
      const float b = scale_bias(p, p.biases, r * p.sb_row + g);
      float32x4_t part0 = vdupq_n_f32(0.0f), part1 = vdupq_n_f32(0.0f);
      for (int c = g * p.group; c < (g + 1) * p.group; c += 32) {
        const uint8x16_t bytes = vld1q_u8(wr + c / 2);
        const uint8x16_t halves[2] = {vandq_u8(bytes, low), vshrq_n_u8(bytes, 4)};
        for (int h = 0; h < 2; ++h) {
          const uint16x8_t lo = vmovl_u8(vget_low_u8(halves[h]));
          const uint16x8_t hi = vmovl_u8(vget_high_u8(halves[h]));
          const float* xh = x + c + 16 * h;
          part0 = vfmaq_f32(part0, vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), vld1q_f32(xh));
          part1 = vfmaq_f32(part1, vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo))), vld1q_f32(xh + 4));
          part0 = vfmaq_f32(part0, vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), vld1q_f32(xh + 8));
          part1 = vfmaq_f32(part1, vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi))), vld1q_f32(xh + 12));
        }
      }
      acc = vfmaq_n_f32(acc, vaddq_f32(part0, part1), s);
      bias_acc += b * xsums[row * groups + g];
    }
    p.out[p.out_rows[row] * p.n + r] = vaddvq_f32(acc) + bias_acc;
  }
}
#endif

/// How long a helper keeps checking for the next product before it sleeps, and the caller
/// for the helpers' last chunks before it does: a decode step's products come a few tens of
/// microseconds apart, and waking a sleeping thread costs about as much (a futex wake and a
/// context switch; on virtual machines an interrupt between cores too). `SHOAL_CREW_SPIN_US`
/// overrides it; 0 sleeps at once.
int64_t spin_ns() {
  static const int64_t ns = [] {
    const char* v = std::getenv("SHOAL_CREW_SPIN_US");
    const long us = v != nullptr ? std::strtol(v, nullptr, 10) : 50;
    return static_cast<int64_t>(std::clamp(us, 0L, 10000L)) * 1000;
  }();
  return ns;
}

/// Spins until `done()` or `spin_ns()` have passed; whether `done()` held.
///
/// It never calls `sched_yield`: on a busy machine that hands the core to whatever else is
/// runnable for the rest of its time slice (milliseconds), and a spinning thread that yields
/// is switched out thousands of times a second. Past the budget the caller sleeps instead.
template <typename F>
bool spin_until(F&& done) {
  const int64_t budget = spin_ns();
  if (budget == 0) {
    return done();
  }
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    if (done()) {
      return true;
    }
#if defined(__x86_64__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
    if ((i & 63) == 63 &&
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                             start)
                .count() > budget) {
      return done();
    }
  }
}

/// Helper threads that share large products with the calling thread, one per core beside
/// the caller's, started once; between products each checks for the next one for a while
/// ([`spin_ns`]), then sleeps (starting a thread costs tens of microseconds).
///
/// A product is cut into more chunks than there are threads, and each thread claims the next
/// chunk until none is left. So a helper that is asleep, slow to wake or switched out (other
/// processes want the cores) costs the product at most the chunk it holds: the caller does
/// the rest itself instead of waiting for a fixed share.
class Crew {
 public:
  static Crew& get() {
    static Crew* crew = new Crew(); // never destroyed: threads outlive static teardown
    return *crew;
  }

  /// Helpers besides the calling thread.
  int helpers() const {
    return static_cast<int>(threads_.size());
  }

  /// Which thread of a product runs this: 0 for the caller, `1..=helpers()` for the helpers
  /// (for buffers of one product, one per thread).
  static int thread_index() {
    return index_;
  }

  /// Runs `job(c)` for every chunk `c` in `0..chunks`, on the caller and the helpers; returns
  /// when all are done. Products from several threads take turns.
  void run(int chunks, const std::function<void(int)>& job) {
    if (chunks > 0xFFFF) {
      // More than a claim can count: never asked for (products cut in at most a few
      // thousand), but correct if it were.
      for (int c = 0; c < chunks; ++c) {
        job(c);
      }
      return;
    }
    std::lock_guard<std::mutex> one_at_a_time(running_);
    chunks = std::max(chunks, 0);
    job_ = &job;
    finished_.store(0, std::memory_order_relaxed);
    uint64_t generation;
    {
      // Under the lock, so that a helper about to sleep either sees the new generation or is
      // counted in `sleeping_` and woken.
      std::lock_guard<std::mutex> lock(mutex_);
      // 32 bits: it wraps after 2^32 products, still different from the last one.
      generation = ((claims_.load(std::memory_order_relaxed) >> 32) + 1) & 0xFFFFFFFFu;
      claims_.store(generation << 32 | static_cast<uint64_t>(chunks) << 16,
                    std::memory_order_release);
      if (sleeping_ > 0) {
        wake_.notify_all();
      }
    }
    work_on(generation);
    const auto all_done = [&] { return finished_.load(std::memory_order_acquire) == chunks; };
    if (!spin_until(all_done)) {
      std::unique_lock<std::mutex> lock(mutex_);
      ++waiting_;
      done_.wait(lock, all_done);
      --waiting_;
    }
    job_ = nullptr;
  }

 private:
  Crew() {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned i = 1; i < cores; ++i) {
      threads_.emplace_back([this, i] {
        index_ = static_cast<int>(i);
        work();
      });
      threads_.back().detach();
    }
  }

  /// Claims and runs chunks of product `generation` until none is left (or a newer product
  /// replaced it: then this one is finished). `claims_` holds the generation (high 32 bits),
  /// the chunk count (16) and the next chunk (low 16): a claim is one compare-and-swap that
  /// fails if the product changed, so no thread runs a chunk of a product that has returned.
  void work_on(uint64_t generation) {
    uint64_t seen = claims_.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t chunks = (seen >> 16) & 0xFFFF, next = seen & 0xFFFF;
      if ((seen >> 32) != generation || next >= chunks) {
        return;
      }
      if (!claims_.compare_exchange_weak(seen, seen + 1, std::memory_order_acq_rel,
                                         std::memory_order_acquire)) {
        continue; // `seen` now holds the current value
      }
      (*job_)(static_cast<int>(next));
      if (finished_.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<int>(chunks)) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (waiting_ > 0) {
          done_.notify_one();
        }
      }
      seen = claims_.load(std::memory_order_acquire);
    }
  }

  void work() {
    uint64_t last = 0;
    for (;;) {
      const auto fresh = [&] {
        return (claims_.load(std::memory_order_acquire) >> 32) != last;
      };
      if (!spin_until(fresh)) {
        std::unique_lock<std::mutex> lock(mutex_);
        ++sleeping_;
        wake_.wait(lock, fresh);
        --sleeping_;
      }
      last = claims_.load(std::memory_order_acquire) >> 32;
      work_on(last);
    }
  }

  std::vector<std::thread> threads_;
  std::mutex running_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  /// Generation, chunk count and next chunk of the current product (see [`work_on`]).
  std::atomic<uint64_t> claims_{0};
  /// Chunks of the current product that have run.
  std::atomic<int> finished_{0};
  int sleeping_ = 0; // helpers asleep on `wake_` (under `mutex_`)
  int waiting_ = 0;  // callers asleep on `done_` (under `mutex_`)
  static thread_local int index_;
};

thread_local int Crew::index_ = 0;

/// Weight bytes below which a product stays on one thread (sharing costs more than it saves).
constexpr int64_t SHARE_ABOVE_BYTES = 128 * 1024;

/// Chunks a shared product is cut into per thread: enough that a thread the machine switched
/// out leaves little for the others to wait on, few enough that each is still a long run.
constexpr int CHUNKS_PER_THREAD = 4;

/// Runs `part(n0, n1)` over output columns `[0, n)`, shared with the crew when the weights
/// (`bytes`) are large. Chunks start at multiples of 8 columns (the vector width).
template <typename F>
void share_columns(int n, int64_t bytes, F&& part) {
  Crew& crew = Crew::get();
  if (bytes < SHARE_ABOVE_BYTES || crew.helpers() == 0 || n < 16) {
    part(0, n);
    return;
  }
  const int chunks = std::min((crew.helpers() + 1) * CHUNKS_PER_THREAD, n / 8);
  const auto bound = [&](int c) {
    return c == chunks ? n : static_cast<int>(static_cast<int64_t>(n) * c / chunks) & ~7;
  };
  crew.run(chunks, [&](int c) {
    const int n0 = bound(c), n1 = bound(c + 1);
    if (n0 < n1) {
      part(n0, n1);
    }
  });
}

/// Rows of `x` from which a product dequantizes tiles of the weights and multiplies them with
/// the BLAS's sgemm (prefill): below, decoding each weight vector once per eight rows is
/// cheaper; above, sgemm's blocking wins (64 rows of a 2048 -> 5632 product: 38 ms on the
/// kernel, against tens of ms of f32 sgemm).
constexpr int SGEMM_FROM_ROWS = 32;

/// Most output columns dequantized at once by one thread: a tile of `TILE * k` floats (2 MiB
/// at k = 2048), and never more than 2 MiB ([`tile_columns`]).
constexpr int TILE = 256;

/// Columns of one tile for rows of `k` weights: [`TILE`], fewer where `k` is large.
int tile_columns(int k) {
  return std::clamp(((1 << 19) / std::max(k, 1)) & ~7, 8, TILE);
}

/// The row-major `cblas_sgemm` of the BLAS MLX links (OpenBLAS on Linux), found at run time so
/// that this file links without it; null where there is none (then the kernel's rows serve).
using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                       int, float, float*, int);

Sgemm find_sgemm() {
  static const Sgemm sgemm = reinterpret_cast<Sgemm>(dlsym(RTLD_DEFAULT, "cblas_sgemm"));
  return sgemm;
}

/// Puts the BLAS (OpenBLAS) on one thread in this process, once: shoal's kernels share their
/// products with the crew instead, tile by tile. OpenBLAS cuts a product into one fixed share
/// per thread and its threads wait for each other by yielding the core; where the cores are
/// busy (other processes, or ranks of a ring on one machine) a yield hands the core away for
/// a time slice, and a waiting share holds the product for as long. Three ranks of the
/// fixture on this 2-core machine beside two busy processes (tests/partition_under_load.rs):
/// with OpenBLAS's threads no step finished within 5 s; on one thread each client completed
/// 5 chats in the 20 s of the delay phase.
/// Nothing happens where the BLAS is another one (Accelerate on macOS).
void blas_on_one_thread() {
  static const bool done = [] {
    using SetThreads = void (*)(int);
    if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
      set(1);
    }
    return true;
  }();
  (void)done;
}

/// Weights of output columns `[n0, n1)` as floats, row after row of `k` (what sgemm reads).
void dequantize_tile(const Problem& p, int n0, int n1, float* out) {
  const int groups = p.k / p.group;
  for (int r = n0; r < n1; ++r) {
    const uint8_t* wr = reinterpret_cast<const uint8_t*>(p.w + r * p.w_row);
    float* o = out + static_cast<int64_t>(r - n0) * p.k;
    for (int g = 0; g < groups; ++g) {
      const float s = scale_bias(p, p.scales, r * p.sb_row + g);
      const float b = scale_bias(p, p.biases, r * p.sb_row + g);
      for (int c = g * p.group; c < (g + 1) * p.group; ++c) {
        o[c] = static_cast<float>(packed_value(wr, c, p.bits)) * s + b;
      }
    }
  }
}

#if defined(__x86_64__)
/// [`dequantize_tile`] with AVX2 + FMA: eight weights per instruction.
template <int BITS>
__attribute__((target("avx2,fma,f16c"))) void dequantize_tile_avx2(const Problem& p, int n0, int n1,
                                                               float* out) {
  const int groups = p.k / p.group;
  const __m256i shifts = BITS == 4 ? _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)
                                   : _mm256_setzero_si256();
  const __m256i nibble = _mm256_set1_epi32(0xF);
  const Decoder<BITS> any(p.k);
  for (int r = n0; r < n1; ++r) {
    const uint32_t* wr = p.w + r * p.w_row;
    float* o = out + static_cast<int64_t>(r - n0) * p.k;
    for (int g = 0; g < groups; ++g) {
      const __m256 sv = _mm256_set1_ps(scale_bias_f16c(p, p.scales, r * p.sb_row + g));
      const __m256 bv = _mm256_set1_ps(scale_bias_f16c(p, p.biases, r * p.sb_row + g));
      const int c0 = g * p.group;
      for (int c = c0; c < c0 + p.group; c += 8) {
        const __m256i q = decode8<BITS>(wr, c, shifts, nibble, any);
        _mm256_storeu_ps(o + c, _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), sv, bv));
      }
    }
  }
}
#endif

/// The fastest dequantization of a tile this CPU has.
void dequantize_tile_best(const Problem& p, int n0, int n1, float* out) {
#if defined(__x86_64__)
  if (has_avx2()) {
    with_bits(p.bits, [&](auto bits) { dequantize_tile_avx2<decltype(bits)::value>(p, n0, n1, out); });
    return;
  }
#endif
  dequantize_tile(p, n0, n1, out);
}

/// Many rows: the weights dequantized a tile of columns at a time, each tile multiplied by
/// every row with sgemm (which uses every core itself). `x`'s rows and the output rows are
/// gathered into and scattered from contiguous buffers when they are not already so.
bool run_sgemm(const Problem& p) {
  const Sgemm sgemm = find_sgemm();
  const int m = static_cast<int>(p.rows.size());
  if (sgemm == nullptr || m < SGEMM_FROM_ROWS) {
    return false;
  }
  // cblas: 101 row-major, 111 no transpose, 112 transpose.
  constexpr int ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112;
  bool x_even = true, out_even = true;
  for (int i = 1; i < m; ++i) {
    x_even = x_even && p.rows[i] - p.rows[i - 1] == p.rows[1] - p.rows[0];
    out_even = out_even && p.out_rows[i] == p.out_rows[0] + i;
  }
  const int64_t x_step = m > 1 ? p.rows[1] - p.rows[0] : p.k;
  std::vector<float> x_copy;
  const float* x = p.x + p.rows[0];
  int ldx = static_cast<int>(x_step);
  if (!x_even || x_step < p.k) {
    x_copy.resize(static_cast<size_t>(m) * p.k);
    for (int i = 0; i < m; ++i) {
      std::copy(p.x + p.rows[i], p.x + p.rows[i] + p.k, x_copy.begin() + int64_t(i) * p.k);
    }
    x = x_copy.data();
    ldx = p.k;
  }
  std::vector<float> out_copy;
  float* out = p.out + p.out_rows[0] * p.n;
  if (!out_even) {
    out_copy.resize(static_cast<size_t>(m) * p.n);
    out = out_copy.data();
  }
  blas_on_one_thread();
  Crew& crew = Crew::get();
  const int columns = tile_columns(p.k);
  const int tiles = (p.n + columns - 1) / columns;
  // A tile buffer per thread, for this product only (the weights' floats never stay).
  std::vector<std::vector<float>> buffers(crew.helpers() + 1);
  const auto tile_product = [&](int t) {
    std::vector<float>& tile = buffers[Crew::thread_index()];
    const int n0 = t * columns, n1 = std::min(p.n, n0 + columns);
    tile.resize(static_cast<size_t>(columns) * p.k);
    dequantize_tile_best(p, n0, n1, tile.data());
    sgemm(ROW_MAJOR, NO_TRANS, TRANS, m, n1 - n0, p.k, 1.0f, x, ldx, tile.data(), p.k, 0.0f,
          out + n0, p.n);
  };
  if (crew.helpers() == 0 || tiles < 2) {
    for (int t = 0; t < tiles; ++t) {
      tile_product(t);
    }
  } else {
    crew.run(tiles, tile_product);
  }
  if (!out_even) {
    for (int i = 0; i < m; ++i) {
      std::copy(out_copy.begin() + int64_t(i) * p.n, out_copy.begin() + int64_t(i + 1) * p.n,
                p.out + p.out_rows[i] * p.n);
    }
  }
  return true;
}

/// Every weight of `p` as floats, row after row of `k`, into `out`.
void dequantize(const Problem& p, float* out, Isa isa) {
  const int64_t bytes = static_cast<int64_t>(p.n) * p.k * p.bits / 8;
  share_columns(p.n, bytes, [&](int n0, int n1) {
    float* o = out + static_cast<int64_t>(n0) * p.k;
    if (isa == Isa::Auto || isa == Isa::Exact || isa == Isa::Avx2) {
      dequantize_tile_best(p, n0, n1, o);
    } else {
      dequantize_tile(p, n0, n1, o);
    }
  });
}

/// The whole product, shared with the crew when it is large.
void run(const Problem& p, Isa isa) {
  if ((isa == Isa::Auto || isa == Isa::Exact) && run_sgemm(p)) {
    return;
  }
  const int m = static_cast<int>(p.rows.size());
  const int groups = p.k / p.group;
  // Per row and group, the sum of x: what the biases multiply.
  std::vector<float> xsums(static_cast<size_t>(m) * groups);
  for (int i = 0; i < m; ++i) {
    const float* xr = p.x + p.rows[i];
    for (int g = 0; g < groups; ++g) {
      float s = 0.0f;
      for (int c = g * p.group; c < (g + 1) * p.group; ++c) {
        s += xr[c];
      }
      xsums[i * groups + g] = s;
    }
  }
  Int8Plan int8;
  const bool on_int8 = plan_int8(p, isa, int8);
#if defined(__x86_64__)
  const std::vector<float> pairs = on_int8 || m >= 8 ? std::vector<float>() : pair_columns(p);
#elif defined(__aarch64__)
  const std::vector<float> pairs = on_int8 || (isa != Isa::Auto && isa != Isa::Exact)
      ? std::vector<float>()
      : pair_columns(p);
#endif
  auto columns = [&](int n0, int n1) {
    if (on_int8) {
      int8.columns(int8.job, n0, n1);
      return;
    }
#if defined(__x86_64__)
    if ((isa == Isa::Auto || isa == Isa::Exact || isa == Isa::Avx2) && has_avx2()) {
      with_bits(p.bits, [&](auto bits) { product_avx2<decltype(bits)::value>(p, xsums, pairs, n0, n1);
      });
      return;
    }
#elif defined(__aarch64__)
    if (!pairs.empty()) {
      for (int i = 0; i < m; ++i) {
        block4_neon(p, xsums, pairs.data(), i, n0, n1);
      }
      return;
    }
#endif
    product_scalar(p, xsums, n0, n1);
  };
  share_columns(p.n, static_cast<int64_t>(p.n) * p.k * p.bits / 8, columns);
}

} // namespace shoal
