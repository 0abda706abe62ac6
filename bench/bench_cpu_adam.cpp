// CPU Adam throughput (parameters per second) against two baselines measured in the same run:
//   torch-fused   at::_fused_adam_, what torch.optim.Adam(fused=True) runs on CPU, on the same arrays
//                 (torch's fastest CPU Adam: ratio_vs_torch is against it);
//   torch-default torch.optim.Adam's default CPU path (one op per line of the algorithm), for scale;
//   stream-limit  this machine's memory bandwidth for Adam's traffic: an in-place read-modify-write
//                 stream over the same arrays with the same threads and tiles, reading p, g, m, v
//                 (fp32) and writing p, m, v back = 28 bytes per parameter, nothing else.
// The "+bf16copy" cases also write the updated parameters as bf16 (2 more bytes per parameter):
// tessera fuses the write into the step, torch needs a second pass (param_bf16.copy_(param)), and
// the stream writes the top half of each updated p.
//
//   bench_cpu_adam [MAX_N [ISA]]   sizes 1M, 10M, 100M up to MAX_N (default 100M); threads 1 and 2;
//                                  ISA: scalar|avx2|avx512|all (default: the one cpu_adam_step uses)
//
// Every timing is the best of several repetitions, the implementations interleaved repetition by
// repetition so that a background load slows all of them alike. One JSON object per line and case.
#include <ATen/Parallel.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "csrc/cpu_adam.h"

using namespace tessera;

namespace {

// GCC vector types: the stream is written once and compiled for each ISA by target_clones (the
// best clone is picked at load time), so the limit is measured with the widest loads the CPU has,
// like the kernel it bounds. aligned(4): the arrays need only float alignment.
typedef float f32x16 __attribute__((vector_size(64), aligned(4)));
typedef uint32_t u32x16 __attribute__((vector_size(64), aligned(4)));
typedef uint16_t u16x16 __attribute__((vector_size(32), aligned(2)));

// The same software prefetch as the SIMD kernels (kCpuAdamPrefetchElements ahead, one line of each
// stream per 16 elements): it lifts a plain stream too, and the limit must be the best this
// machine can do, not a handicapped one.
inline void prefetch_ahead(const float* p, const float* g, const float* m, const float* v) {
  for (const float* x : {p, g, m, v})
    __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(x) + kCpuAdamPrefetchElements * 4));
}

// The bandwidth limit's kernel over [begin, end): p += s*g, m = b*m + g, v = b*v + g*g, and with a
// copy h = top 16 bits of the new p. s and b come from the caller at run time so that nothing is
// folded away; one multiply-add per stream keeps it memory-bound. begin is a multiple of 16.
__attribute__((target_clones("avx512f", "avx2", "default"))) void stream_rmw(
    float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
    uint16_t* __restrict h, int64_t begin, int64_t end, float s, float b) {
  int64_t i = begin;
  auto vec = [](auto* x) { return reinterpret_cast<f32x16*>(x); };
  if (!h) {
    for (; i + 16 <= end; i += 16) {
      prefetch_ahead(p + i, g + i, m + i, v + i);
      const f32x16 gi = *reinterpret_cast<const f32x16*>(g + i);
      *vec(p + i) = *vec(p + i) + s * gi;
      *vec(m + i) = b * *vec(m + i) + gi;
      *vec(v + i) = b * *vec(v + i) + gi * gi;
    }
  } else {
    for (; i + 16 <= end; i += 16) {
      prefetch_ahead(p + i, g + i, m + i, v + i);
      const f32x16 gi = *reinterpret_cast<const f32x16*>(g + i);
      const f32x16 pi = *vec(p + i) + s * gi;
      *vec(p + i) = pi;
      *vec(m + i) = b * *vec(m + i) + gi;
      *vec(v + i) = b * *vec(v + i) + gi * gi;
      *reinterpret_cast<u16x16*>(h + i) = __builtin_convertvector((u32x16)pi >> 16, u16x16);
    }
  }
  for (; i < end; ++i) {
    p[i] += s * g[i];
    m[i] = b * m[i] + g[i];
    v[i] = b * v[i] + g[i] * g[i];
    if (h) {
      uint32_t bits;
      std::memcpy(&bits, &p[i], 4);
      h[i] = uint16_t(bits >> 16);
    }
  }
}

// Same tiles and threads as cpu_adam_step.
void stream_limit(float* p, const float* g, float* m, float* v, uint16_t* h, int64_t n, float s, float b) {
  const int64_t tiles = (n + kCpuAdamTile - 1) / kCpuAdamTile;
  at::parallel_for(0, tiles, 4, [&](int64_t first, int64_t last) {
    stream_rmw(p, g, m, v, h, first * kCpuAdamTile, std::min(last * kCpuAdamTile, n), s, b);
  });
}

// torch.optim.Adam's default on CPU (neither fused nor foreach: _single_tensor_adam), op for op.
// It makes several passes over memory; DeepSpeed's "5-7x faster than torch.optim.Adam" is against it.
void torch_default_adam(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, const AdamParams& h) {
  const at::Tensor grad = h.weight_decay != 0 ? g.add(p, h.weight_decay) : g;
  m.lerp_(grad, 1 - h.beta1);
  v.mul_(h.beta2).addcmul_(grad, grad, 1 - h.beta2);
  const double bias_correction1 = 1 - std::pow(double(h.beta1), double(h.step));
  const double bias_correction2 = 1 - std::pow(double(h.beta2), double(h.step));
  const at::Tensor denom = v.sqrt().div_(std::sqrt(bias_correction2)).add_(h.eps);
  p.addcdiv_(m, denom, -h.lr / bias_correction1);
}

struct Case {
  std::string impl;
  double bytes_per_param;
  std::function<void()> run;
  double best = 1e30;  // seconds
};

// Best time of each case over `reps` rounds (after one warm-up round), cases interleaved.
void time_cases(std::vector<Case>& cases, int reps) {
  for (int r = 0; r <= reps; ++r)
    for (Case& c : cases) {
      const auto start = std::chrono::steady_clock::now();
      c.run();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (r > 0) c.best = std::min(c.best, s);
    }
}

void print(const Case& c, int64_t n, int threads, const Case* limit, const Case* torch,
           const Case* torch_default = nullptr) {
  const double pps = n / c.best;
  std::printf("{\"impl\": \"%s\", \"n\": %lld, \"threads\": %d, \"bytes_per_param\": %.0f, \"seconds\": %.6f, "
              "\"params_per_s\": %.4e, \"gb_per_s\": %.2f",
              c.impl.c_str(), (long long)n, threads, c.bytes_per_param, c.best, pps, pps * c.bytes_per_param / 1e9);
  if (limit) {
    const double limit_pps = n / limit->best;
    std::printf(", \"limit_params_per_s\": %.4e, \"pct_of_limit\": %.1f", limit_pps, 100.0 * pps / limit_pps);
  }
  if (torch) std::printf(", \"ratio_vs_torch\": %.3f", torch->best / c.best);
  if (torch_default) std::printf(", \"ratio_vs_torch_default\": %.3f", torch_default->best / c.best);
  std::printf("}\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t max_n = argc > 1 ? std::atoll(argv[1]) : 100000000;
  const std::string isa_arg = argc > 2 ? argv[2] : "";
  std::vector<Isa> isas;
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
    if (cpu_supports(isa) && (isa_arg == "all" || isa_arg == isa_name(isa))) isas.push_back(isa);
  if (isa_arg.empty()) isas.push_back(cpu_adam_best_isa());
  if (isas.empty()) {
    std::fprintf(stderr, "bench_cpu_adam: unknown or unsupported ISA '%s'\n", isa_arg.c_str());
    return 2;
  }

  for (int64_t n : {int64_t(1000000), int64_t(10000000), int64_t(100000000)}) {
    if (n > max_n) break;
    // One set of arrays for every implementation; each step keeps the values finite and normal.
    at::Tensor p = at::randn({n}), g = at::randn({n}), m = at::zeros({n}), v = at::rand({n});
    at::Tensor p_bf16 = at::empty({n}, at::kBFloat16);
    at::Tensor step = at::full({}, float(10));  // torch's state_steps; tessera's step is 10 too
    float *pp = p.data_ptr<float>(), *gp = g.data_ptr<float>(), *mp = m.data_ptr<float>(), *vp = v.data_ptr<float>();
    auto* hp = static_cast<uint16_t*>(p_bf16.data_ptr());
    AdamParams hyper;
    hyper.step = 10;
    hyper.weight_decay = 0.01f;
    hyper.adamw_mode = false;
    const float s = 1e-3f, b = 0.5f;

    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      std::vector<Case> cases;
      cases.push_back({"stream-limit", 28, [&] { stream_limit(pp, gp, mp, vp, nullptr, n, s, b); }});
      cases.push_back({"torch-fused", 28, [&] {
                         at::_fused_adam_({p}, {g}, {m}, {v}, {}, {step}, hyper.lr, hyper.beta1, hyper.beta2,
                                          hyper.weight_decay, hyper.eps, false, false);
                       }});
      for (Isa isa : isas)
        cases.push_back({std::string("tessera-") + isa_name(isa), 28, [&, isa] {
                           cpu_adam_step_isa(isa, hyper, pp, gp, GradType::Float32, mp, vp, n);
                         }});
      cases.push_back({"stream-limit+bf16copy", 30, [&] { stream_limit(pp, gp, mp, vp, hp, n, s, b); }});
      cases.push_back({"torch-fused+bf16copy", 30, [&] {
                         at::_fused_adam_({p}, {g}, {m}, {v}, {}, {step}, hyper.lr, hyper.beta1, hyper.beta2,
                                          hyper.weight_decay, hyper.eps, false, false);
                         p_bf16.copy_(p);
                       }});
      for (Isa isa : isas)
        cases.push_back({std::string("tessera-") + isa_name(isa) + "+bf16copy", 30, [&, isa] {
                           cpu_adam_step_isa(isa, hyper, pp, gp, GradType::Float32, mp, vp, n, hp, HalfType::BFloat16);
                         }});
      // About 1 GB of traffic per case, at least 5 repetitions.
      const int reps = int(std::clamp<int64_t>(1000000000 / (28 * n), 5, 50));
      time_cases(cases, reps);
      // Timed on its own: its temporaries would evict the arrays from the last-level cache and slow
      // whichever case ran next (at 1M the arrays live in L3).
      std::vector<Case> default_case = {{"torch-default", 28, [&] { torch_default_adam(p, g, m, v, hyper); }}};
      time_cases(default_case, reps);

      // Cases: [limit, torch-fused, tessera per ISA] x {fp32, +bf16copy}; torch-default.
      const size_t per_variant = 2 + isas.size();
      const Case& torch_default = default_case[0];
      for (size_t variant = 0; variant < 2; ++variant) {
        const Case& limit = cases[variant * per_variant];
        const Case& torch = cases[variant * per_variant + 1];
        const Case* fp32_default = variant == 0 ? &torch_default : nullptr;
        print(limit, n, threads, nullptr, nullptr);
        print(torch, n, threads, &limit, nullptr);
        if (fp32_default) print(torch_default, n, threads, &limit, nullptr);
        for (size_t k = 2; k < per_variant; ++k)
          print(cases[variant * per_variant + k], n, threads, &limit, &torch, fp32_default);
      }
    }
  }
  return 0;
}
