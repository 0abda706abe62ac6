// Sign packing with AVX2: a compare gives 8 lanes of all-ones or zeros, movemask packs their top
// bits into a byte in lane order (lane 0 = bit 0: the scalar kernel's order). Compiled with -mavx2.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "csrc/sign_pack.h"

namespace tessera::detail {

void pack_signs_avx2(const float* x, int64_t n, uint8_t* out) {
  const __m256 zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    out[i / 8] = static_cast<uint8_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), zero, _CMP_GE_OQ)));
  if (i < n) pack_signs_scalar(x + i, n - i, out + i / 8);
}

void unpack_signs_avx2(const uint8_t* bits, int64_t n, float scale, float* out) {
  // Lane k tests bit k of the byte broadcast to every lane.
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 plus = _mm256_set1_ps(scale), minus = _mm256_set1_ps(-scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i byte = _mm256_set1_epi32(bits[i / 8]);
    const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(byte, lane_bit), lane_bit);
    _mm256_storeu_ps(out + i, _mm256_blendv_ps(minus, plus, _mm256_castsi256_ps(set)));
  }
  if (i < n) unpack_signs_scalar(bits + i / 8, n - i, scale, out + i);
}

}  // namespace tessera::detail
