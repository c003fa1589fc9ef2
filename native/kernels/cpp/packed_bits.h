// shoal: reading MLX's packed quantized values, for any width MLX packs (2, 3, 4, 5, 6 and 8
// bits), one at a time (the plain C++ path) or eight at a time (AVX2).
//
// MLX's layout (`get_pack_factor` / `get_bytes_per_pack` in mlx/backend/common/quantized.h,
// and the Metal kernels that read it): a row of `k` values is a little-endian bit stream,
// value `c` in bits `bits * c .. bits * (c + 1)`. For 2, 4 and 8 bits that is "element `j` of
// each u32 word in bits `bits * j`"; 3- and 5-bit values come eight to 3 or 5 bytes, 6-bit
// values four to 3 bytes, and no value is split across a pack. So eight consecutive values
// starting at a multiple of 8 always fill exactly `bits` whole bytes.

#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace shoal {

/// Value `c` of a row whose packed bytes start at `row` (`bits` in 2..=8).
inline uint32_t packed_value(const uint8_t* row, int64_t c, int bits) {
  const int64_t bit = c * bits;
  const uint8_t* p = row + (bit >> 3);
  const int shift = static_cast<int>(bit & 7);
  uint32_t v = p[0];
  if (shift + bits > 8) {
    v |= static_cast<uint32_t>(p[1]) << 8; // only read the next byte when the value needs it
  }
  return (v >> shift) & ((1u << bits) - 1);
}

#if defined(__x86_64__)
/// Eight values at a time with AVX2, for any width: the `bits` bytes that hold values
/// `c..c + 8` are broadcast, a byte shuffle puts the two bytes each value touches into its
/// 32-bit lane, and a per-lane shift and mask leave the value.
template <int BITS>
struct Decoder {
  __m256i shuffle, shifts, mask;
  int64_t row_bytes; // bytes of one row: a load never reads past them

  __attribute__((target("avx2,fma"))) explicit Decoder(int64_t k) : row_bytes(k * BITS / 8) {
    alignas(32) int8_t control[32];
    alignas(32) int32_t shift[8];
    // Lanes 0..3 live in the low 128 bits, 4..7 in the high; both halves hold the same 8
    // bytes (the shuffle indexes within a half), so each lane's control reads them alike.
    for (int j = 0; j < 8; ++j) {
      const int bit = BITS * j;
      int8_t* lane = control + 16 * (j / 4) + 4 * (j % 4);
      lane[0] = static_cast<int8_t>(bit / 8);
      lane[1] = static_cast<int8_t>(bit / 8 + 1);
      lane[2] = lane[3] = static_cast<int8_t>(0x80); // zero
      shift[j] = bit % 8;
    }
    shuffle = _mm256_load_si256(reinterpret_cast<const __m256i*>(control));
    shifts = _mm256_load_si256(reinterpret_cast<const __m256i*>(shift));
    mask = _mm256_set1_epi32((1 << BITS) - 1);
  }

  /// Values `c..c + 8` (`c` a multiple of 8) of the row at `row`, as 32-bit integers.
  __attribute__((target("avx2,fma"))) inline __m256i operator()(const uint8_t* row,
                                                                int64_t c) const {
    const int64_t at = c / 8 * BITS;
    uint64_t chunk = 0;
    if (at + 8 <= row_bytes) {
      std::memcpy(&chunk, row + at, 8);
    } else {
      std::memcpy(&chunk, row + at, BITS); // the row's end: read only its own bytes
    }
    const __m256i bytes = _mm256_set1_epi64x(static_cast<long long>(chunk));
    const __m256i spread = _mm256_shuffle_epi8(bytes, shuffle);
    return _mm256_and_si256(_mm256_srlv_epi32(spread, shifts), mask);
  }
};
#endif

} // namespace shoal
