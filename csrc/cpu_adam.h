// CPU Adam / AdamW over flat fp32 buffers: the optimizer step of ZeRO-Offload, where parameters,
// gradients and both moments live in host memory and the step is bound by memory bandwidth.
//
// One call updates n elements in place:
//
//   g  = grad * grad_scale                         grad_scale = 1/loss_scale fuses unscaling; 1 = none
//   g += weight_decay * p                          Adam (L2), adamw_mode == false: torch.optim.Adam
//   p *= 1 - lr * weight_decay                     AdamW, adamw_mode == true: torch.optim.AdamW
//                                                  (decoupled decay, Loshchilov & Hutter 2019, Alg. 2)
//   m  = beta1 * m + (1 - beta1) * g               first moment   (Kingma & Ba 2015, Algorithm 1)
//   v  = beta2 * v + (1 - beta2) * g^2             second moment
//   with bias correction (t = step, 1-based):
//     step_size = lr / (1 - beta1^t)
//     denom     = sqrt(v) / sqrt(1 - beta2^t) + eps
//   without bias correction:
//     step_size = lr,  denom = sqrt(v) + eps
//   p -= step_size * m / denom
//   half_copy = round_to_nearest_even(p)           optional bf16/fp16 compute copy of the new p
//
// With bias correction this is torch.optim.Adam/AdamW's update (the bias-corrected m̂/(sqrt(v̂)+eps)
// of Kingma & Ba written with eps moved outside the correction, as torch does); without it, the
// update of DeepSpeed's DeepSpeedCPUAdam(bias_correction=False). Results equal the formulas in fp32
// arithmetic up to float rounding (the SIMD paths use fused multiply-add); for a given ISA the
// result does not depend on the thread count or on where an element lies in the array.
//
// Gradients are fp32 or bf16 (read only). The optional half copy is written, never read, so the
// mixed-precision compute copy is refreshed in the same pass over memory as the update.
#pragma once

#include <cstdint>

namespace tessera {

enum class GradType { Float32, BFloat16 };
enum class HalfType { BFloat16, Float16 };

// Instruction sets the kernel is built for. Each has its own translation unit compiled with its own
// flags, so the rest of the binary stays baseline x86-64; the best one the CPU (and OS) supports is
// chosen at run time.
enum class Isa { Scalar, Avx2, Avx512 };

struct AdamParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adamw_mode = false;      // false: L2 into the gradient (Adam); true: decoupled decay (AdamW)
  bool bias_correction = true;
  int64_t step = 1;             // t, 1 for the first step (torch's state["step"] after its increment)
  float grad_scale = 1.0f;      // gradients are multiplied by this before use, e.g. 1/loss_scale
};

// One Adam step over n elements with the best ISA of this CPU, on at::get_num_threads() threads.
// params, exp_avg, exp_avg_sq: fp32, updated in place. grads: n elements of grad_type.
// half_copy: nullptr, or n elements of half_type receiving the updated parameters.
// Buffers must not overlap (except that nothing is required of their alignment).
void cpu_adam_step(const AdamParams& p, float* params, const void* grads, GradType grad_type,
                   float* exp_avg, float* exp_avg_sq, int64_t n, void* half_copy = nullptr,
                   HalfType half_type = HalfType::BFloat16);

// The same with a given ISA (tests, benchmarks). Throws std::invalid_argument if !cpu_supports(isa).
void cpu_adam_step_isa(Isa isa, const AdamParams& p, float* params, const void* grads,
                       GradType grad_type, float* exp_avg, float* exp_avg_sq, int64_t n,
                       void* half_copy = nullptr, HalfType half_type = HalfType::BFloat16);

// The calling thread's own parallel regions (this kernel's at::parallel_for) run on `share` of the
// threads the process gives its regions (at::get_num_threads(), from OMP_NUM_THREADS or
// at::set_num_threads), at least one; other threads keep theirs. Returns the count. For a helper
// thread that steps while the main thread drives the GPU (offload_optimizer.cpuadam_cores_perc).
int use_share_of_threads_here(double share);

bool cpu_supports(Isa isa);       // the CPU and the OS support it (checked once, at first use)
Isa cpu_adam_best_isa();          // what cpu_adam_step uses: Avx512 > Avx2 > Scalar
const char* isa_name(Isa isa);    // "scalar", "avx2", "avx512"
const char* cpu_adam_isa();       // isa_name(cpu_adam_best_isa())

// Elements per tile: the unit of work handed to threads (a multiple of every SIMD width, so only
// the array's last vector is ever partial). 16K elements = 64 KiB per fp32 stream.
constexpr int64_t kCpuAdamTile = 16384;

// How far ahead the SIMD kernels prefetch each input stream, in elements (2 KiB of fp32). A
// vector's divide and square root take long enough that the hardware prefetchers alone leave the
// memory bus idle between requests; prefetching this far ahead measured +12-15% from DRAM on one
// core (Xeon, AVX-512) and changes nothing in cache.
constexpr int64_t kCpuAdamPrefetchElements = 512;

namespace detail {

// What every ISA kernel receives: the step's constants, computed once per call in double and
// rounded to float, and the buffers. Kernels process elements [begin, end) of them.
struct AdamKernelArgs {
  float step_size;       // lr / (1 - beta1^t), or lr
  float inv_sqrt_bc2;    // 1 / sqrt(1 - beta2^t), or 1
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float l2_decay;        // weight_decay in Adam mode with decay, else 0 (and then unused)
  float decoupled_keep;  // 1 - lr * weight_decay in AdamW mode with decay, else 1 (and then unused)
  bool has_l2, has_decoupled;
  float grad_scale;
  bool has_grad_scale;   // grad_scale != 1

  float* params;
  const void* grads;
  GradType grad_type;
  float* exp_avg;
  float* exp_avg_sq;
  void* half_copy;       // nullable
  HalfType half_type;
};

void adam_kernel_scalar(const AdamKernelArgs& a, int64_t begin, int64_t end);
void adam_kernel_avx2(const AdamKernelArgs& a, int64_t begin, int64_t end);
void adam_kernel_avx512(const AdamKernelArgs& a, int64_t begin, int64_t end);

}  // namespace detail
}  // namespace tessera
