// Helpers shared by the estimator's source files (engine/estimator*.cpp); not a public API.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/estimator/estimator.h"

namespace tessera::estimator_detail {

int64_t round_bytes(double x);
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int compute_bytes(const TrainingSetup& s) { return s.precision == "fp32" ? 4 : 2; }
inline bool mixed_precision(const TrainingSetup& s) { return s.precision != "fp32"; }

// Optimizer state bytes per parameter (fp32): Adam/AdamW/LAMB keep m and v; SGD keeps a momentum
// buffer only with momentum. The 1-bit family (optim/onebit.h) adds its worker error buffer (the
// server's, 4/dp bytes a parameter, is left out): OneBitAdam m, v; ZeroOneAdam m, v and the
// accumulated local steps; OneBitLamb m, v and the fresh variance.
inline int state_bytes_per_param(const TrainingSetup& s) {
  if (s.optimizer == "SGD") return s.momentum > 0 ? 4 : 0;
  if (s.optimizer == "OneBitAdam") return 12;
  if (s.optimizer == "ZeroOneAdam" || s.optimizer == "OneBitLamb") return 16;
  return 8;
}
inline std::string state_name(const TrainingSetup& s) {
  if (s.optimizer == "SGD") return s.momentum > 0 ? "SGD momentum" : "SGD (no state)";
  if (s.optimizer == "Lamb") return "LAMB m, v";
  if (s.optimizer == "OneBitAdam") return "OneBitAdam m, v, worker error";
  if (s.optimizer == "ZeroOneAdam") return "ZeroOneAdam m, v, local-step sum, worker error";
  if (s.optimizer == "OneBitLamb") return "OneBitLamb m, v, fresh v, worker error";
  return s.optimizer + " m, v";
}
inline std::string part(int n) { return n == 1 ? "whole" : "1/" + std::to_string(n); }

// The parameters one rank of pipeline stage `stage` (tensor-parallel rank 0) holds.
struct StageModel {
  std::vector<ParamTensor> tensors;  // tensor-parallel split applied, registration order
  int64_t params = 0;
  int64_t largest = 0;               // largest module, split
  int64_t layers = 0;
  bool first = true, last = true;
};

// Model states of one rank (engine/estimator/estimator_states.cpp): exactly the engine's buffers at stages 0-2.
struct States {
  // device
  int64_t params = 0, master = 0, grads = 0, optim = 0, gathered = 0, buckets = 0, construction = 0;
  std::string params_detail, master_detail, grads_detail, optim_detail, gathered_detail, buckets_detail;
  // host (per rank)
  int64_t h_params = 0, h_master = 0, h_grads = 0, h_optim = 0, h_pinned = 0, h_construction = 0;
  std::string h_pinned_detail;
  // NVMe (per rank)
  int64_t n_params = 0, n_master = 0, n_grads = 0, n_optim = 0;
};
// `cpu_device`: ranks are CPU processes, where the engine runs optimizer offload itself (CPU:
// states stay in host memory; NVMe: the engine's swap files and tile buffers), so those rows come
// from the engine's planner; on GPUs offload is a design estimate.
States model_states(const StageModel& m, const TrainingSetup& s, int dp, bool cpu_device = false);
// Whether the engine runs this setup on these devices (the estimate is then validated against it).
bool engine_runs(const TrainingSetup& s, bool cpu_device);
std::vector<std::vector<int64_t>> group_numels(const StageModel& m, const TrainingSetup& s, std::vector<int>* keys = nullptr);

// Activations (engine/estimator/estimator_activations.cpp): Korthikanti et al. 2022.
struct Activations {
  int64_t layer_full = 0;    // one layer, no checkpointing
  int64_t layer_stored = 0;  // one layer as stored under the checkpointing mode (per micro-batch)
  int64_t checkpoint = 0;    // full checkpointing: one checkpointed input
  int64_t embedding = 0;     // per micro-batch on the first stage
  int64_t output = 0;        // the last stage: final norm, head input, fp32 logits and their gradient
  // An MoE layer (TrainingSetup::moe): what it stores beyond a dense layer (its experts' rows in
  // place of the MLP's), and its all-to-all's send and receive buffers (transient).
  int64_t moe_extra = 0, moe_all_to_all = 0;
  int64_t moe_rows = 0;  // rows this rank's experts process per MoE layer (capacity, or dropless worst case)
  // Context parallelism (TrainingSetup::cp): what a layer's attention keeps beyond SDPA's (counted in
  // layer_full) and its transient buffers.
  int64_t context_extra = 0, context_buffers = 0;
  std::string formula;
};
Activations activation_terms(const TransformerShape& sh, const TrainingSetup& s, int64_t micro_batch);
std::string fmt(const char* format, double x);  // snprintf of one number
std::string count_str(int64_t n);               // 6738415616 -> "6.74B"
void check_setup(const TrainingSetup& s, int world);  // throws std::invalid_argument
// The search's cost model (engine/estimator/estimator_cost.cpp): seconds per sample on one GPU.
OptionCost option_cost(const Hardware& hw, const std::optional<TransformerShape>& shape, int world, const TrainingSetup& s,
                       int64_t params_per_gpu);

}  // namespace tessera::estimator_detail
