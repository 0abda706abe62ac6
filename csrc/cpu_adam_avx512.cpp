// AVX-512 CPU Adam kernel: 16 fp32 lanes per vector. Only AVX-512F instructions are used (its FMA,
// 16<->32-bit widening/narrowing and VCVTPS2PH cover everything), so this file alone is compiled
// with -mavx512f and runs only after cpu_adam.cpp has checked that the CPU and OS support it.
// The arithmetic is cpu_adam_scalar.cpp's, with fused multiply-adds.
// GCC 12 reports its own _mm*_undefined_* helpers as "may be used uninitialized" (GCC PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "csrc/cpu_adam.h"

namespace tessera::detail {
namespace {

constexpr int kWidth = 16;

enum class HalfMode { None, BFloat16, Float16 };

// The step's scalars, broadcast once per call rather than once per vector.
struct Constants {
  __m512 step_size, inv_sqrt_bc2, beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  __m512 l2_decay, decoupled_keep, grad_scale;
  bool has_l2, has_decoupled, has_grad_scale;

  explicit Constants(const AdamKernelArgs& a)
      : step_size(_mm512_set1_ps(a.step_size)), inv_sqrt_bc2(_mm512_set1_ps(a.inv_sqrt_bc2)),
        beta1(_mm512_set1_ps(a.beta1)), one_minus_beta1(_mm512_set1_ps(a.one_minus_beta1)),
        beta2(_mm512_set1_ps(a.beta2)), one_minus_beta2(_mm512_set1_ps(a.one_minus_beta2)),
        eps(_mm512_set1_ps(a.eps)), l2_decay(_mm512_set1_ps(a.l2_decay)),
        decoupled_keep(_mm512_set1_ps(a.decoupled_keep)), grad_scale(_mm512_set1_ps(a.grad_scale)),
        has_l2(a.has_l2), has_decoupled(a.has_decoupled), has_grad_scale(a.has_grad_scale) {}
};

// bf16 -> fp32 is exact: widen each 16-bit lane to 32 bits and shift it into the top half.
inline __m512 load_bf16(const uint16_t* src) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// fp32 -> bf16, round to nearest even: add 0x7FFF plus the lowest kept bit, keep the top 16 bits;
// NaN lanes become 0x7FC0 (as c10::BFloat16, so copies match torch's conversion bit for bit).
inline void store_bf16(uint16_t* dst, __m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  rounded = _mm512_mask_blend_epi32(nan, rounded, _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(rounded));
}

// fp32 -> IEEE fp16 in hardware (VCVTPS2PH), round to nearest even.
inline void store_fp16(uint16_t* dst, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                      _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// Prefetches the element kCpuAdamPrefetchElements ahead of x into L1 (see cpu_adam.h). Prefetches
// never fault, so reaching past the array's end is harmless; the address is computed as an
// integer so that no pointer is formed past the array.
template <class T>
inline void prefetch_ahead(const T* x) {
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(x) + kCpuAdamPrefetchElements * sizeof(T);
  _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
}

// One vector of the update (equations in cpu_adam.h). Pointers address the vector's first element.
template <GradType kGrad, HalfMode kHalf>
inline void step_vector(const Constants& c, float* p, const void* grad, float* m, float* v, uint16_t* half) {
  __m512 g = kGrad == GradType::Float32 ? _mm512_loadu_ps(static_cast<const float*>(grad))
                                        : load_bf16(static_cast<const uint16_t*>(grad));
  __m512 param = _mm512_loadu_ps(p);
  if (c.has_grad_scale) g = _mm512_mul_ps(g, c.grad_scale);
  if (c.has_l2) g = _mm512_fmadd_ps(c.l2_decay, param, g);
  if (c.has_decoupled) param = _mm512_mul_ps(param, c.decoupled_keep);
  const __m512 mi = _mm512_fmadd_ps(c.beta1, _mm512_loadu_ps(m), _mm512_mul_ps(c.one_minus_beta1, g));
  const __m512 vi = _mm512_fmadd_ps(c.beta2, _mm512_loadu_ps(v), _mm512_mul_ps(c.one_minus_beta2, _mm512_mul_ps(g, g)));
  const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vi), c.inv_sqrt_bc2, c.eps);
  param = _mm512_fnmadd_ps(c.step_size, _mm512_div_ps(mi, denom), param);  // p - step_size * m/denom
  _mm512_storeu_ps(p, param);
  _mm512_storeu_ps(m, mi);
  _mm512_storeu_ps(v, vi);
  if (kHalf == HalfMode::BFloat16) store_bf16(half, param);
  if (kHalf == HalfMode::Float16) store_fp16(half, param);
}

template <GradType kGrad, HalfMode kHalf>
void run(const AdamKernelArgs& a, int64_t begin, int64_t end) {
  using GradElem = std::conditional_t<kGrad == GradType::Float32, float, uint16_t>;
  const Constants c(a);
  // Local copies: the vector stores may alias anything (__m512 is may_alias), which would make the
  // compiler reload a's pointers every iteration.
  float* const params = a.params;
  float* const exp_avg = a.exp_avg;
  float* const exp_avg_sq = a.exp_avg_sq;
  const GradElem* const grads = static_cast<const GradElem*>(a.grads);
  uint16_t* const half = static_cast<uint16_t*>(a.half_copy);
  int64_t i = begin;
  for (; i + kWidth <= end; i += kWidth) {
    // One 64-byte line of each fp32 stream per vector: one prefetch each.
    prefetch_ahead(params + i);
    prefetch_ahead(grads + i);
    prefetch_ahead(exp_avg + i);
    prefetch_ahead(exp_avg_sq + i);
    step_vector<kGrad, kHalf>(c, params + i, grads + i, exp_avg + i, exp_avg_sq + i,
                              kHalf == HalfMode::None ? nullptr : half + i);
  }
  // The array's last, partial vector: run the same instructions on a zero-padded copy, so a tail
  // element is computed exactly as it would be in a full vector (zeros give m = v = 0, no update).
  const int64_t r = end - i;
  if (r == 0) return;
  alignas(64) float p[kWidth] = {}, m[kWidth] = {}, v[kWidth] = {};
  alignas(64) GradElem g[kWidth] = {};
  alignas(64) uint16_t h[kWidth];
  std::memcpy(p, params + i, r * sizeof(float));
  std::memcpy(m, exp_avg + i, r * sizeof(float));
  std::memcpy(v, exp_avg_sq + i, r * sizeof(float));
  std::memcpy(g, grads + i, r * sizeof(GradElem));
  step_vector<kGrad, kHalf>(c, p, g, m, v, h);
  std::memcpy(params + i, p, r * sizeof(float));
  std::memcpy(exp_avg + i, m, r * sizeof(float));
  std::memcpy(exp_avg_sq + i, v, r * sizeof(float));
  if (kHalf != HalfMode::None) std::memcpy(half + i, h, r * sizeof(uint16_t));
}

template <GradType kGrad>
void run_grad(const AdamKernelArgs& a, int64_t begin, int64_t end) {
  if (!a.half_copy) return run<kGrad, HalfMode::None>(a, begin, end);
  if (a.half_type == HalfType::BFloat16) return run<kGrad, HalfMode::BFloat16>(a, begin, end);
  return run<kGrad, HalfMode::Float16>(a, begin, end);
}

}  // namespace

void adam_kernel_avx512(const AdamKernelArgs& a, int64_t begin, int64_t end) {
  if (a.grad_type == GradType::Float32) return run_grad<GradType::Float32>(a, begin, end);
  return run_grad<GradType::BFloat16>(a, begin, end);
}

}  // namespace tessera::detail
