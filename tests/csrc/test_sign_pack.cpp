// Sign packing (csrc/sign_pack.h): every kernel this CPU has against the scalar one and against the
// definition (bit i of byte i/8 is x[i] >= 0; unpacking gives ±scale), on lengths around the
// vector widths; kernels the CPU lacks are skipped with a message.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "csrc/sign_pack.h"

using namespace tessera;

TEST_CASE("sign packing: every kernel this CPU has equals the definition", "[sign_pack]") {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (!cpu_supports(isa)) {
      WARN("sign packing: this CPU has no " << isa_name(isa) << "; its kernel is not tested here");
      continue;
    }
    for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 1003}) {
      INFO(isa_name(isa) << " n " << n);
      std::vector<float> x(n);
      for (auto& v : x) v = normal(rng);
      if (n > 3) x[1] = 0.0f, x[2] = -0.0f;  // both zeros count as +
      std::vector<uint8_t> bits((n + 7) / 8, 0xAA);
      pack_signs_isa(isa, x.data(), n, bits.data());
      for (int64_t i = 0; i < n; ++i) CHECK(((bits[i / 8] >> (i % 8)) & 1) == (x[i] >= 0.0f ? 1 : 0));
      if (n % 8) CHECK((bits.back() >> (n % 8)) == 0);  // the bits past n are 0
      std::vector<float> back(n, 0.0f);
      unpack_signs_isa(isa, bits.data(), n, 0.25f, back.data());
      for (int64_t i = 0; i < n; ++i) CHECK(back[i] == (x[i] >= 0.0f ? 0.25f : -0.25f));
    }
  }
  CHECK(cpu_supports(sign_pack_isa()));
}
