// Sign packing, one element at a time (the reference the SIMD kernels must equal).
#include "csrc/sign_pack.h"

namespace tessera::detail {

void pack_signs_scalar(const float* x, int64_t n, uint8_t* out) {
  for (int64_t byte = 0; byte < (n + 7) / 8; ++byte) {
    uint8_t bits = 0;
    for (int64_t i = byte * 8, k = 0; k < 8 && i < n; ++i, ++k)
      if (x[i] >= 0.0f) bits |= static_cast<uint8_t>(1u << k);
    out[byte] = bits;
  }
}

void unpack_signs_scalar(const uint8_t* bits, int64_t n, float scale, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = (bits[i >> 3] >> (i & 7)) & 1 ? scale : -scale;
}

}  // namespace tessera::detail
