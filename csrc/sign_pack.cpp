// Sign packing: the run-time ISA choice (the kernels are in sign_pack_<isa>.cpp).
#include "csrc/sign_pack.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace tessera {

namespace {

Isa choose() {
  if (const char* forced = std::getenv("TESSERA_SIGN_PACK_ISA")) {
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
      if (std::string(forced) == isa_name(isa)) {
        if (!cpu_supports(isa))
          throw std::invalid_argument(std::string("TESSERA_SIGN_PACK_ISA=") + forced + ": this CPU does not support it");
        return isa;
      }
    throw std::invalid_argument(std::string("TESSERA_SIGN_PACK_ISA=") + forced + ": expected scalar, avx2 or avx512");
  }
  return cpu_supports(Isa::Avx512) ? Isa::Avx512 : cpu_supports(Isa::Avx2) ? Isa::Avx2 : Isa::Scalar;
}

void require(Isa isa) {
  if (!cpu_supports(isa)) throw std::invalid_argument(std::string("sign packing: this CPU has no ") + isa_name(isa));
}

}  // namespace

Isa sign_pack_isa() {
  static const Isa isa = choose();
  return isa;
}

void pack_signs_isa(Isa isa, const float* x, int64_t n, uint8_t* out) {
  require(isa);
  switch (isa) {
    case Isa::Scalar: return detail::pack_signs_scalar(x, n, out);
    case Isa::Avx2: return detail::pack_signs_avx2(x, n, out);
    case Isa::Avx512: return detail::pack_signs_avx512(x, n, out);
  }
}

void unpack_signs_isa(Isa isa, const uint8_t* bits, int64_t n, float scale, float* out) {
  require(isa);
  switch (isa) {
    case Isa::Scalar: return detail::unpack_signs_scalar(bits, n, scale, out);
    case Isa::Avx2: return detail::unpack_signs_avx2(bits, n, scale, out);
    case Isa::Avx512: return detail::unpack_signs_avx512(bits, n, scale, out);
  }
}

void pack_signs(const float* x, int64_t n, uint8_t* out) { pack_signs_isa(sign_pack_isa(), x, n, out); }
void unpack_signs(const uint8_t* bits, int64_t n, float scale, float* out) {
  unpack_signs_isa(sign_pack_isa(), bits, n, scale, out);
}

}  // namespace tessera
