// Sign packing with AVX-512F: a compare writes a 16-bit mask in lane order, two bytes of the wire
// format at once; unpacking is a masked blend by the same mask. Compiled with -mavx512f.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>

#include "csrc/sign_pack.h"

namespace tessera::detail {

void pack_signs_avx512(const float* x, int64_t n, uint8_t* out) {
  const __m512 zero = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const uint16_t mask = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), zero, _CMP_GE_OQ);
    std::memcpy(out + i / 8, &mask, 2);  // little-endian: lanes 0-7 in the first byte
  }
  if (i < n) pack_signs_scalar(x + i, n - i, out + i / 8);
}

void unpack_signs_avx512(const uint8_t* bits, int64_t n, float scale, float* out) {
  const __m512 plus = _mm512_set1_ps(scale), minus = _mm512_set1_ps(-scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint16_t mask;
    std::memcpy(&mask, bits + i / 8, 2);
    _mm512_storeu_ps(out + i, _mm512_mask_blend_ps(mask, minus, plus));
  }
  if (i < n) unpack_signs_scalar(bits + i / 8, n - i, scale, out + i);
}

}  // namespace tessera::detail
