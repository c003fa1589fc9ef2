// shoal: the int8 few-rows product with AVX2 (see int8_body.h). Byte products go through
// `vpmaddubsw` (unsigned x signed bytes, pairs summed into saturating int16) and `vpmaddwd`.
// 4-bit weights (at most 15) times |x| <= 127 cannot saturate; 8-bit weights are taken as
// signed `q - 128` with the sign moved onto x (|q - 128| <= 128, so a pair stays under 32767),
// which is already the centred sum the body wants.

#if defined(__x86_64__)
#include <immintrin.h>

#include "int8_dot.h"

namespace shoal {
namespace {

struct Dot {
  static constexpr bool CENTERED_8BIT = true;

  template <int BITS>
  static inline __m256i add(__m256i acc, __m256i q, __m256i x) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (BITS == 4) {
      return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), ones));
    }
    const __m256i w = _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80)));
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
  }
};

#include "int8_body.h"

} // namespace

void int8_columns_avx2(const Int8Job& job, int n0, int n1) {
  int8_columns(job, n0, n1);
}

} // namespace shoal
#endif
