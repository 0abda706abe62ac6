// Sign bits packed 8 to a byte: the wire format of 1-bit compressed communication (1-bit Adam,
// Tang et al. 2021, §3; DeepSpeed's compressed allreduce). Element i of a chunk is bit (i mod 8)
// of byte i / 8, least significant bit first; a bit is 1 for x >= 0 (a zero counts as +, as
// DeepSpeed's sign(x) + 1 > 0 does) and 0 for x < 0. Unpacking gives +scale or -scale.
//
// One kernel per ISA (sign_pack_scalar.cpp, _avx2.cpp, _avx512.cpp), each compiled with its own
// flags; the best one the CPU supports is used, or the one TESSERA_SIGN_PACK_ISA names
// ("scalar", "avx2", "avx512") when the CPU has it.
#pragma once

#include <cstdint>

#include "csrc/cpu_adam.h"  // Isa, cpu_supports, isa_name

namespace tessera {

// out: (n + 7) / 8 bytes; the bits past n in the last byte are 0.
void pack_signs(const float* x, int64_t n, uint8_t* out);
// out[i] = bit i ? scale : -scale, for i < n.
void unpack_signs(const uint8_t* bits, int64_t n, float scale, float* out);

// The same with a given ISA (tests). Throw std::invalid_argument if !cpu_supports(isa).
void pack_signs_isa(Isa isa, const float* x, int64_t n, uint8_t* out);
void unpack_signs_isa(Isa isa, const uint8_t* bits, int64_t n, float scale, float* out);

Isa sign_pack_isa();  // what pack_signs uses

namespace detail {
void pack_signs_scalar(const float* x, int64_t n, uint8_t* out);
void unpack_signs_scalar(const uint8_t* bits, int64_t n, float scale, float* out);
void pack_signs_avx2(const float* x, int64_t n, uint8_t* out);
void unpack_signs_avx2(const uint8_t* bits, int64_t n, float scale, float* out);
void pack_signs_avx512(const float* x, int64_t n, uint8_t* out);
void unpack_signs_avx512(const uint8_t* bits, int64_t n, float scale, float* out);
}  // namespace detail

}  // namespace tessera
