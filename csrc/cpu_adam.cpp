// CPU Adam: per-step constants, run-time ISA choice, tiling and threading. The arithmetic lives in
// one kernel per ISA (cpu_adam_scalar.cpp, cpu_adam_avx2.cpp, cpu_adam_avx512.cpp).
#include "csrc/cpu_adam.h"

#include <ATen/Parallel.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace tessera {
namespace {

// __builtin_cpu_supports reads CPUID once (libgcc's constructor) and, for AVX and AVX-512, also
// checks with XGETBV that the OS saves the wider registers, so a "yes" here is safe to execute.
bool detect(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return true;
    case Isa::Avx2:
      // F16C for the fp16 copy; every AVX2 CPU has it, but it is a separate CPUID bit.
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::Avx512:
      // The kernel uses AVX-512F only (FMA, 16<->32-bit lane conversions, VCVTPS2PH).
      return __builtin_cpu_supports("avx512f");
  }
  return false;
}

using Kernel = void (*)(const detail::AdamKernelArgs&, int64_t, int64_t);

Kernel kernel_for(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return detail::adam_kernel_scalar;
    case Isa::Avx2: return detail::adam_kernel_avx2;
    case Isa::Avx512: return detail::adam_kernel_avx512;
  }
  return detail::adam_kernel_scalar;
}

// The constants of step t, computed in double so that 1 - beta^t keeps its digits for large t
// (beta2^t close to 1 early on), then rounded once to float.
detail::AdamKernelArgs make_args(const AdamParams& p) {
  if (p.step < 1) throw std::invalid_argument("cpu_adam_step: step must be >= 1, got " + std::to_string(p.step));
  detail::AdamKernelArgs a{};
  const double t = double(p.step);
  if (p.bias_correction) {
    const double bc1 = 1.0 - std::pow(double(p.beta1), t);
    const double bc2 = 1.0 - std::pow(double(p.beta2), t);
    a.step_size = float(double(p.lr) / bc1);
    a.inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  } else {
    a.step_size = p.lr;
    a.inv_sqrt_bc2 = 1.0f;
  }
  a.beta1 = p.beta1;
  a.one_minus_beta1 = float(1.0 - double(p.beta1));
  a.beta2 = p.beta2;
  a.one_minus_beta2 = float(1.0 - double(p.beta2));
  a.eps = p.eps;
  a.has_l2 = !p.adamw_mode && p.weight_decay != 0.0f;
  a.l2_decay = a.has_l2 ? p.weight_decay : 0.0f;
  a.has_decoupled = p.adamw_mode && p.weight_decay != 0.0f;
  a.decoupled_keep = a.has_decoupled ? float(1.0 - double(p.lr) * double(p.weight_decay)) : 1.0f;
  a.grad_scale = p.grad_scale;
  a.has_grad_scale = p.grad_scale != 1.0f;
  return a;
}

}  // namespace

bool cpu_supports(Isa isa) {
  static const bool avx2 = detect(Isa::Avx2), avx512 = detect(Isa::Avx512);
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return avx2;
    case Isa::Avx512: return avx512;
  }
  return false;
}

Isa cpu_adam_best_isa() {
  if (cpu_supports(Isa::Avx512)) return Isa::Avx512;
  if (cpu_supports(Isa::Avx2)) return Isa::Avx2;
  return Isa::Scalar;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "unknown";
}

const char* cpu_adam_isa() { return isa_name(cpu_adam_best_isa()); }

void cpu_adam_step_isa(Isa isa, const AdamParams& p, float* params, const void* grads,
                       GradType grad_type, float* exp_avg, float* exp_avg_sq, int64_t n,
                       void* half_copy, HalfType half_type) {
  if (!cpu_supports(isa))
    throw std::invalid_argument(std::string("cpu_adam_step: this CPU does not support ") + isa_name(isa));
  if (n < 0) throw std::invalid_argument("cpu_adam_step: negative element count");
  detail::AdamKernelArgs a = make_args(p);
  if (n == 0) return;
  a.params = params;
  a.grads = grads;
  a.grad_type = grad_type;
  a.exp_avg = exp_avg;
  a.exp_avg_sq = exp_avg_sq;
  a.half_copy = half_copy;
  a.half_type = half_type;
  const Kernel kernel = kernel_for(isa);

  // Threads take contiguous runs of whole tiles (ATen's OpenMP backend gives thread i the i-th
  // chunk of the tile range), so each thread streams through memory sequentially, which the
  // hardware prefetchers follow, and every tile but the array's last starts and ends on a SIMD
  // vector boundary: each element goes through the same instructions whatever the thread count,
  // so results are bit-identical for any number of threads. Arrays under kMinTilesPerThread tiles
  // stay on the calling thread, where waking the pool would cost more than it saves.
  constexpr int64_t kMinTilesPerThread = 4;
  const int64_t tiles = (n + kCpuAdamTile - 1) / kCpuAdamTile;
  at::parallel_for(0, tiles, kMinTilesPerThread, [&](int64_t first, int64_t last) {
    const int64_t begin = first * kCpuAdamTile;
    const int64_t end = last * kCpuAdamTile < n ? last * kCpuAdamTile : n;
    kernel(a, begin, end);
  });
}

int use_share_of_threads_here(double share) {
  // ATen gives each new thread the process's count at its first parallel call (lazy_init_num_threads):
  // take that first, then narrow this thread's own OpenMP setting, which its regions follow.
  const int all = at::get_num_threads();
  const int mine = std::max(1, static_cast<int>(std::lround(share * all)));
#ifdef _OPENMP
  omp_set_num_threads(mine);
#endif
  return mine;
}

void cpu_adam_step(const AdamParams& p, float* params, const void* grads, GradType grad_type,
                   float* exp_avg, float* exp_avg_sq, int64_t n, void* half_copy, HalfType half_type) {
  static const Isa best = cpu_adam_best_isa();
  cpu_adam_step_isa(best, p, params, grads, grad_type, exp_avg, exp_avg_sq, n, half_copy, half_type);
}

}  // namespace tessera
