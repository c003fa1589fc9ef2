// shoal: the int8 few-rows product with VNNI (see int8_body.h): `vpdpbusd` sums four
// unsigned-weight x signed-x byte products into each 32-bit lane, without int16 saturation.
// build.rs compiles this file twice: for AVX-VNNI (the VEX form, Alder Lake and later) and,
// with `SHOAL_EVEX_VNNI` defined, for AVX-512 VNNI on 256-bit registers (the EVEX form, for
// CPUs that have it without AVX-VNNI: Ice Lake, Zen 4).

#if defined(__x86_64__)
#include <immintrin.h>

#include "int8_dot.h"

namespace shoal {
namespace {

struct Dot {
  static constexpr bool CENTERED_8BIT = false;

  template <int BITS>
  static inline __m256i add(__m256i acc, __m256i q, __m256i x) {
#if defined(SHOAL_EVEX_VNNI)
    return _mm256_dpbusd_epi32(acc, q, x);
#else
    return _mm256_dpbusd_avx_epi32(acc, q, x);
#endif
  }
};

#include "int8_body.h"

} // namespace

#if defined(SHOAL_EVEX_VNNI)
void int8_columns_avx512vnni(const Int8Job& job, int n0, int n1) {
#else
void int8_columns_avxvnni(const Int8Job& job, int n0, int n1) {
#endif
  int8_columns(job, n0, n1);
}

} // namespace shoal
#endif
