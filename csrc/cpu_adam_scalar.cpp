// Portable CPU Adam kernel: one element at a time, for x86-64 CPUs without AVX2+FMA (and as the
// plainest statement of the arithmetic the SIMD kernels vectorize). Compiled for baseline x86-64
// with -ffp-contract=off, so every operation rounds exactly as written (no fused multiply-add), and
// -fno-math-errno, so std::sqrt is the SQRTSS instruction rather than a libm call.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "csrc/cpu_adam.h"

namespace tessera::detail {
namespace {

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// bf16 -> fp32 is exact: bf16 is the top half of an fp32.
inline float bf16_to_float(uint16_t h) { return float_of(uint32_t(h) << 16); }

// fp32 -> bf16, round to nearest, ties to even: add 0x7FFF plus the lowest kept bit, truncate.
// Overflow rounds to infinity by carrying into the exponent; NaN becomes the quiet NaN 0x7FC0
// (c10::BFloat16's choice, so copies match torch's .to(torch.bfloat16) bit for bit).
inline uint16_t float_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  const uint32_t u = bits_of(f);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// fp32 -> IEEE fp16, round to nearest, ties to even, overflow to infinity, subnormals kept, NaN ->
// sign | 0x7E00. Marat Dukhan's branch-free method (the FP16 library, also c10::Half): the two
// multiplications let the FPU do the rounding at fp16's precision, including into subnormals.
// Needs IEEE float arithmetic without flush-to-zero, which is the default.
inline uint16_t float_to_fp16(float f) {
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = bits_of(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = float_of((bias >> 1) + 0x07800000u) + base;
  const uint32_t b = bits_of(base);
  const uint32_t exp_bits = (b >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = b & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return uint16_t((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

enum class HalfMode { None, BFloat16, Float16 };

template <GradType kGrad, HalfMode kHalf>
void run(const AdamKernelArgs& a, int64_t begin, int64_t end) {
  float* __restrict p = a.params;
  float* __restrict m = a.exp_avg;
  float* __restrict v = a.exp_avg_sq;
  for (int64_t i = begin; i < end; ++i) {
    float g = kGrad == GradType::Float32 ? static_cast<const float*>(a.grads)[i]
                                         : bf16_to_float(static_cast<const uint16_t*>(a.grads)[i]);
    float param = p[i];
    if (a.has_grad_scale) g = g * a.grad_scale;
    if (a.has_l2) g = g + a.l2_decay * param;                   // Adam: L2 term joins the gradient
    if (a.has_decoupled) param = param * a.decoupled_keep;      // AdamW: decay the weight directly
    const float mi = a.beta1 * m[i] + a.one_minus_beta1 * g;
    const float vi = a.beta2 * v[i] + a.one_minus_beta2 * (g * g);
    const float denom = std::sqrt(vi) * a.inv_sqrt_bc2 + a.eps;
    param = param - a.step_size * (mi / denom);
    p[i] = param;
    m[i] = mi;
    v[i] = vi;
    if (kHalf == HalfMode::BFloat16) static_cast<uint16_t*>(a.half_copy)[i] = float_to_bf16(param);
    if (kHalf == HalfMode::Float16) static_cast<uint16_t*>(a.half_copy)[i] = float_to_fp16(param);
  }
}

template <GradType kGrad>
void run_grad(const AdamKernelArgs& a, int64_t begin, int64_t end) {
  if (!a.half_copy) return run<kGrad, HalfMode::None>(a, begin, end);
  if (a.half_type == HalfType::BFloat16) return run<kGrad, HalfMode::BFloat16>(a, begin, end);
  return run<kGrad, HalfMode::Float16>(a, begin, end);
}

}  // namespace

void adam_kernel_scalar(const AdamKernelArgs& a, int64_t begin, int64_t end) {
  if (a.grad_type == GradType::Float32) return run_grad<GradType::Float32>(a, begin, end);
  return run_grad<GradType::BFloat16>(a, begin, end);
}

}  // namespace tessera::detail
