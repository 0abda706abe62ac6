// What the CPU can do fast, for advice the engine gives at start (not for kernel dispatch, which
// csrc/cpu_adam.h decides for itself).
#pragma once

#include <string>

namespace tessera {

// Whether this CPU has bf16 arithmetic (AVX512_BF16 or AMX-BF16). Without it PyTorch runs bf16
// matmuls by converting to fp32 and back, measured ~11x slower than fp32 on an AVX2-only machine.
// TESSERA_CPU_BF16=0 or =1 overrides the answer (tests, and users who know better).
bool cpu_has_fast_bf16();

// What is missing, for the message: "no AVX512_BF16 or AMX-BF16 instructions".
std::string cpu_bf16_missing();

}  // namespace tessera
