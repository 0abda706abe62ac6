// CPU Adam (csrc/cpu_adam.h) against a plain double-precision reference of torch's formulas, for
// every ISA this CPU has, every option and dtype, and sizes that exercise every vector tail; also
// against torch's own fused CPU Adam, the fp16/bf16 copies against torch's conversions bit for bit,
// and 1 vs 2 threads bit for bit.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "csrc/cpu_adam.h"


using namespace tessera;

namespace {

constexpr Isa kAllIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512};

// The ISAs this CPU runs; the others are reported once, not silently skipped.
std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  for (Isa isa : kAllIsas) {
    if (cpu_supports(isa))
      out.push_back(isa);
    else
      WARN("this CPU lacks " << isa_name(isa) << ": its CPU Adam kernel is not tested here");
  }
  return out;
}

// One optimizer state in fp32, as the kernel sees it.
struct State {
  at::Tensor p, m, v;
  State clone() const { return {p.clone(), m.clone(), v.clone()}; }
};

// What the kernel must produce and how far from it float rounding may take it.
struct Expected {
  at::Tensor p, m, v;              // exact (double) results of one step from the given fp32 state
  at::Tensor p_tol, m_tol, v_tol;  // per element (double)
};

// One step of torch.optim.Adam/AdamW's formulas (with tessera's grad_scale and bias-correction
// switch) in double precision, element by element: the plainest statement of the update, and far
// cheaper than a chain of whole-array ops on a busy 2-core machine. The tolerance of each result
// is kUlps float roundings of the sum of the magnitudes of the terms that produce it, the usual
// forward error bound: a handful of fp32 operations (and fp32 constants) separate the kernel from
// this reference, so a few ulps of the largest term is what rounding can explain.
Expected reference_step(const AdamParams& hp, const State& s, const at::Tensor& grads) {
  constexpr double kUlps = 8, kFloatEps = 0x1.0p-24;
  // Keeps tolerances positive where everything is zero (the kernel must then give exactly 0).
  constexpr double kFloor = std::numeric_limits<float>::denorm_min();
  const double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps, wd = hp.weight_decay;
  double step_size = lr, bc2_sqrt = 1;
  if (hp.bias_correction) {
    const double t = double(hp.step);
    step_size = lr / (1 - std::pow(b1, t));
    bc2_sqrt = std::sqrt(1 - std::pow(b2, t));
  }
  const int64_t n = s.p.numel();
  const at::Tensor g32 = grads.to(at::kFloat).contiguous();  // bf16 -> fp32 is exact
  const float *P = s.p.data_ptr<float>(), *M = s.m.data_ptr<float>(), *V = s.v.data_ptr<float>();
  const float* G = g32.data_ptr<float>();
  Expected e;
  for (at::Tensor* t : {&e.p, &e.m, &e.v, &e.p_tol, &e.m_tol, &e.v_tol}) *t = at::empty({n}, at::kDouble);
  double *ep = e.p.data_ptr<double>(), *em = e.m.data_ptr<double>(), *ev = e.v.data_ptr<double>();
  double *tp = e.p_tol.data_ptr<double>(), *tm = e.m_tol.data_ptr<double>(), *tv = e.v_tol.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) {
    double p = P[i], g = double(G[i]) * double(hp.grad_scale), g_mag = std::abs(g);
    if (!hp.adamw_mode && wd != 0) {  // Adam: L2 penalty through the gradient
      g += wd * p;
      g_mag += wd * std::abs(p);
    }
    if (hp.adamw_mode && wd != 0) p *= 1 - lr * wd;  // AdamW: decoupled decay
    const double m = b1 * M[i] + (1 - b1) * g;
    const double v = b2 * V[i] + (1 - b2) * g * g;
    const double denom = std::sqrt(v) / bc2_sqrt + eps;
    ep[i] = p - step_size * m / denom;
    em[i] = m;
    ev[i] = v;
    const double m_mag = b1 * std::abs(M[i]) + (1 - b1) * g_mag;
    const double v_mag = b2 * V[i] + (1 - b2) * g_mag * g_mag;
    const double p_mag = std::abs(p) + step_size * m_mag / denom;
    tp[i] = std::max(kUlps * kFloatEps * p_mag, kFloor);
    tm[i] = std::max(kUlps * kFloatEps * m_mag, kFloor);
    tv[i] = std::max(kUlps * kFloatEps * v_mag, kFloor);
  }
  return e;
}

// Checks |actual - expected| <= tol_scale * tol everywhere (actual: fp32) and reports the worst element.
void check_close(const char* what, const at::Tensor& actual, const at::Tensor& expected, const at::Tensor& tol,
                 double tol_scale = 1) {
  const at::Tensor a = actual.contiguous(), x = expected.to(at::kDouble).contiguous();
  const float* A = a.data_ptr<float>();
  const double *X = x.data_ptr<double>(), *T = tol.data_ptr<double>();
  double worst = 0;
  int64_t at_index = -1;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double r = std::abs(A[i] - X[i]) / (tol_scale * T[i]);
    if (!(r <= worst)) {  // NaN counts as worst
      worst = std::isnan(r) ? std::numeric_limits<double>::infinity() : r;
      at_index = i;
    }
  }
  INFO(what << ": worst element " << at_index << " is " << worst << " tolerances away"
            << (at_index >= 0 ? " (got " + std::to_string(A[at_index]) + ", expected " + std::to_string(X[at_index]) + ")"
                              : std::string()));
  CHECK(worst <= 1.0);
}

// Bit-for-bit equality of two tensors of the same 16- or 32-bit dtype.
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  const auto view = a.element_size() == 2 ? at::kShort : at::kInt;
  return at::equal(a.contiguous().view(view), b.contiguous().view(view));
}

at::ScalarType half_dtype(HalfType h) { return h == HalfType::BFloat16 ? at::kBFloat16 : at::kHalf; }

void run_kernel(Isa isa, const AdamParams& hp, State& s, const at::Tensor& grads, at::Tensor* half,
                HalfType half_type) {
  const GradType gt = grads.scalar_type() == at::kBFloat16 ? GradType::BFloat16 : GradType::Float32;
  cpu_adam_step_isa(isa, hp, s.p.data_ptr<float>(), grads.data_ptr(), gt, s.m.data_ptr<float>(),
                    s.v.data_ptr<float>(), s.p.numel(), half ? half->data_ptr() : nullptr, half_type);
}

struct Options {
  bool adamw, bias_correction;
  float weight_decay, grad_scale;
  at::ScalarType grad_dtype;
  int half;  // 0: none, 1: bf16, 2: fp16
};

std::string describe(const Options& o, int64_t n) {
  return std::string(o.adamw ? "adamw" : "adam") + " bias_correction=" + (o.bias_correction ? "on" : "off") +
         " weight_decay=" + std::to_string(o.weight_decay) + " grad_scale=" + std::to_string(o.grad_scale) +
         " grads=" + (o.grad_dtype == at::kBFloat16 ? "bf16" : "fp32") +
         " half_copy=" + (o.half == 0 ? "none" : o.half == 1 ? "bf16" : "fp16") + " n=" + std::to_string(n);
}

// Three steps from zero moments (t = 1, 2, 1000). Each step: one reference from the shared state, every ISA from a
// copy of it, then the reference (rounded to fp32) becomes the next shared state, so every step is
// checked on its own and ISAs never drift apart.
void check_options(const std::vector<Isa>& isas, const Options& o, int64_t n, at::Generator& gen) {
  INFO(describe(o, n));
  AdamParams hp;
  hp.lr = 1e-2f;  // large enough that a wrong update is far outside the tolerances
  hp.beta1 = 0.9f;
  hp.beta2 = 0.999f;
  hp.eps = 1e-8f;
  hp.weight_decay = o.weight_decay;
  hp.adamw_mode = o.adamw;
  hp.bias_correction = o.bias_correction;
  hp.grad_scale = o.grad_scale;
  const HalfType half_type = o.half == 2 ? HalfType::Float16 : HalfType::BFloat16;
  State shared{at::randn({n}, gen), at::zeros({n}), at::zeros({n})};
  for (int64_t step : {1, 2, 1000}) {  // 1000: late in training, 1 - beta1^t rounds to 1 in fp32
    hp.step = step;
    INFO("step " << step);
    // Gradients as the loss scale would leave them, so that grad_scale brings them back to O(1).
    const at::Tensor grads = (at::randn({n}, gen) / o.grad_scale).to(o.grad_dtype);
    const Expected e = reference_step(hp, shared, grads);
    for (Isa isa : isas) {
      INFO("isa " << isa_name(isa));
      State s = shared.clone();
      at::Tensor half = at::empty({n}, at::TensorOptions().dtype(half_dtype(half_type)));
      run_kernel(isa, hp, s, grads, o.half ? &half : nullptr, half_type);
      check_close("params", s.p, e.p, e.p_tol);
      check_close("exp_avg", s.m, e.m, e.m_tol);
      check_close("exp_avg_sq", s.v, e.v, e.v_tol);
      if (o.half) CHECK(same_bits(half, s.p.to(half_dtype(half_type))));
    }
    shared = State{e.p.to(at::kFloat), e.m.to(at::kFloat), e.v.to(at::kFloat)};
  }
}

std::vector<Options> all_options() {
  std::vector<Options> out;
  for (bool adamw : {false, true})
    for (bool bc : {true, false})
      for (float wd : {0.0f, 0.1f})
        for (float scale : {1.0f, 1.0f / 1024})
          for (auto gd : {at::kFloat, at::kBFloat16})
            for (int half : {0, 1, 2}) out.push_back({adamw, bc, wd, scale, gd, half});
  return out;
}

}  // namespace

TEST_CASE("cpu adam matches the reference for every option on short arrays") {
  // Every combination of options on every short size: each tail length of both SIMD widths.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  const auto isas = available_isas();
  for (int64_t n : {0, 1, 7, 15, 16, 17})
    for (const Options& o : all_options()) check_options(isas, o, n, gen);
}

TEST_CASE("cpu adam matches the reference on a long array") {
  // 1000003 = 16 * 62500 + 3: many tiles, threads and a tail. Each option value appears, over
  // combinations chosen to pair them differently (the full product runs on the short sizes).
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(99);
  const auto isas = available_isas();
  const Options cases[] = {
      {false, true, 0.0f, 1.0f, at::kFloat, 0},
      {false, true, 0.1f, 1.0f / 1024, at::kBFloat16, 1},
      {true, false, 0.1f, 1.0f, at::kFloat, 2},
      {true, true, 0.0f, 1.0f / 1024, at::kBFloat16, 1},
  };
  for (const Options& o : cases) check_options(isas, o, 1000003, gen);
}

TEST_CASE("cpu adam agrees with torch fused adam and adamw") {
  // torch.optim.Adam/AdamW(fused=True) run at::_fused_adam(w)_ on CPU; three steps.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const int64_t n = 100003;
  for (bool adamw : {false, true}) {
    INFO((adamw ? "adamw" : "adam"));
    AdamParams hp;
    hp.lr = 1e-2f;
    hp.weight_decay = 0.1f;
    hp.adamw_mode = adamw;
    hp.grad_scale = 1.0f / 1024;
    State ours{at::randn({n}, gen), at::zeros({n}), at::zeros({n})};
    State torch = ours.clone();
    at::Tensor step = at::zeros({}, at::kFloat), loss_scale = at::full({}, 1024.0f);
    for (int64_t t = 1; t <= 3; ++t) {
      hp.step = t;
      const at::Tensor grads = at::randn({n}, gen) * 1024.0;
      const Expected e = reference_step(hp, ours, grads);  // only for its tolerances
      run_kernel(cpu_adam_best_isa(), hp, ours, grads, nullptr, HalfType::BFloat16);
      step.add_(1);
      at::Tensor tg = grads.clone();  // torch unscales the gradient in place
      if (adamw)
        at::_fused_adamw_({torch.p}, {tg}, {torch.m}, {torch.v}, {}, {step}, hp.lr, hp.beta1, hp.beta2,
                          hp.weight_decay, hp.eps, false, false, loss_scale, std::nullopt);
      else
        at::_fused_adam_({torch.p}, {tg}, {torch.m}, {torch.v}, {}, {step}, hp.lr, hp.beta1, hp.beta2,
                         hp.weight_decay, hp.eps, false, false, loss_scale, std::nullopt);
      // Two fp32 implementations, each within the tolerance of the exact result.
      check_close("params vs torch", ours.p, torch.p, e.p_tol, 2);
      check_close("exp_avg vs torch", ours.m, torch.m, e.m_tol, 2);
      check_close("exp_avg_sq vs torch", ours.v, torch.v, e.v_tol, 2);
      torch = ours.clone();  // the next step from the same state
    }
  }
}

TEST_CASE("cpu adam half copies round like torch for special and random values") {
  // lr = 0 with zero gradients leaves every parameter as it is (0/(0+eps) = 0), so the copy is the
  // conversion of chosen fp32 values: ties, subnormals, overflow, infinities, NaN, and random bit
  // patterns over fp16's range and over all of fp32.
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, -65520.0f, 1e10f,
                               0x1.0p-24f, 0x1.0p-25f, 0x1.8p-25f, 0x1.0p-14f, 0x1.ff8p-15f, 1e-30f,
                               std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()};
  for (uint32_t bits : {0x3F808000u, 0x3F818000u, 0x3F808001u, 0xBF808000u, 0x7F7F8000u, 0x7F7FFFFFu,
                        0x3F801000u, 0x3F803000u, 0x3F802FFFu, 0x7FA00000u /* signalling NaN */}) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    values.push_back(f);
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const int64_t random_count = 20000;
  const at::Tensor any_bits = at::randint(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                                          {random_count}, gen, at::kInt);
  // fp16's range: exponents 2^-26 .. 2^16, random sign and mantissa.
  const at::Tensor exponent = at::randint(127 - 26, 127 + 17, {random_count}, gen, at::kInt);
  const at::Tensor mantissa = at::randint(0, 1 << 23, {random_count}, gen, at::kInt);
  const at::Tensor sign = at::randint(0, 2, {random_count}, gen, at::kInt);
  const at::Tensor fp16_range = ((exponent * (1 << 23) + mantissa).view(at::kFloat) * (1 - 2 * sign)).to(at::kFloat);
  const at::Tensor chosen = at::from_blob(values.data(), {int64_t(values.size())}, at::kFloat).clone();
  const at::Tensor p0 = at::cat({chosen, any_bits.view(at::kFloat), fp16_range});
  const int64_t n = p0.numel();
  for (Isa isa : available_isas()) {
    for (HalfType ht : {HalfType::BFloat16, HalfType::Float16}) {
      INFO("isa " << isa_name(isa) << (ht == HalfType::BFloat16 ? " bf16" : " fp16"));
      AdamParams hp;
      hp.lr = 0.0f;
      State s{p0.clone(), at::zeros({n}), at::zeros({n})};
      const at::Tensor grads = at::zeros({n});
      at::Tensor half = at::empty({n}, at::TensorOptions().dtype(half_dtype(ht)));
      run_kernel(isa, hp, s, grads, &half, ht);
      // The parameters are untouched (a signalling NaN comes back quiet: it went through arithmetic).
      const at::Tensor nan = p0.isnan(), keep = nan.logical_not();
      CHECK(at::equal(s.p.isnan(), nan));
      CHECK(same_bits(s.p.masked_select(keep), p0.masked_select(keep)));
      // The copy is torch's conversion of them, bit for bit; NaN stays NaN.
      const at::Tensor expected = p0.to(half_dtype(ht));
      CHECK(at::equal(half.isnan(), nan));
      CHECK(same_bits(half.masked_select(keep), expected.masked_select(keep)));
    }
  }
}

TEST_CASE("cpu adam gives bit-identical results on 1 and 2 threads") {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const int64_t n = 1000003;
  const int saved_threads = at::get_num_threads();
  AdamParams hp;
  hp.weight_decay = 0.01f;
  hp.adamw_mode = true;
  hp.step = 5;
  const State start{at::randn({n}, gen), at::randn({n}, gen) * 0.1, at::rand({n}, gen) * 0.01};
  const at::Tensor grads = at::randn({n}, gen).to(at::kBFloat16);
  for (Isa isa : available_isas()) {
    INFO("isa " << isa_name(isa));
    State one = start.clone(), two = start.clone();
    at::Tensor half_one = at::empty({n}, at::kBFloat16), half_two = at::empty({n}, at::kBFloat16);
    at::set_num_threads(1);
    run_kernel(isa, hp, one, grads, &half_one, HalfType::BFloat16);
    at::set_num_threads(2);
    run_kernel(isa, hp, two, grads, &half_two, HalfType::BFloat16);
    CHECK(same_bits(one.p, two.p));
    CHECK(same_bits(one.m, two.m));
    CHECK(same_bits(one.v, two.v));
    CHECK(same_bits(half_one, half_two));
  }
  at::set_num_threads(saved_threads);
}

TEST_CASE("cpu adam rejects a step below 1 and an ISA the CPU lacks") {
  float p = 1, m = 0, v = 0, g = 1;
  AdamParams hp;
  hp.step = 0;
  CHECK_THROWS_AS(cpu_adam_step(hp, &p, &g, GradType::Float32, &m, &v, 1), std::invalid_argument);
  for (Isa isa : kAllIsas)
    if (!cpu_supports(isa)) {
      hp.step = 1;
      CHECK_THROWS_AS(cpu_adam_step_isa(isa, hp, &p, &g, GradType::Float32, &m, &v, 1), std::invalid_argument);
    }
}

TEST_CASE("use_share_of_threads_here narrows the calling thread's parallel regions only") {
  const int all = at::get_num_threads();
  int mine = 0, seen = 0, none = 0;
  std::thread helper([&] {
    mine = tessera::use_share_of_threads_here(0.5);
    seen = at::get_num_threads();
  });
  helper.join();
  std::thread least([&] { none = tessera::use_share_of_threads_here(0.0); });
  least.join();
  CHECK(mine == std::max(1, static_cast<int>(std::lround(0.5 * all))));
  CHECK(seen == mine);
  CHECK(none == 1);
  CHECK(at::get_num_threads() == all);  // this thread keeps its own
}
