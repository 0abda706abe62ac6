#include "csrc/cpu_features.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>

namespace tessera {

namespace {

bool detect_fast_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  // AVX-512 registers must be usable at all (checked by libgcc with XGETBV).
  const bool avx512 = __builtin_cpu_supports("avx512f");
  bool avx512_bf16 = false, amx_bf16 = false;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) avx512_bf16 = avx512 && (eax & (1u << 5));  // CPUID.(7,1):EAX[5]
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) amx_bf16 = edx & (1u << 22);               // CPUID.(7,0):EDX[22]
  return avx512_bf16 || amx_bf16;
}

}  // namespace

bool cpu_has_fast_bf16() {
  if (const char* forced = std::getenv("TESSERA_CPU_BF16")) {
    if (std::strcmp(forced, "0") == 0) return false;
    if (std::strcmp(forced, "1") == 0) return true;
  }
  static const bool fast = detect_fast_bf16();
  return fast;
}

std::string cpu_bf16_missing() { return "no AVX512_BF16 or AMX-BF16 instructions"; }

}  // namespace tessera
