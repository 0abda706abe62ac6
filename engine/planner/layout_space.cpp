#include "engine/planner/layout_space.h"

#include <utility>

namespace tessera::planner {

std::vector<int> divisors(int64_t n) {
  std::vector<int> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(static_cast<int>(d));
  return out;
}

std::string grid_rule(int tp, int pp, int cp, const std::string& method, const TransformerShape& sh) {
  const auto n = [](int64_t x) { return std::to_string(x); };
  const int64_t kv = sh.kv_heads > 0 ? sh.kv_heads : sh.heads;
  if (tp > 1 && sh.heads % tp != 0) return "tp " + n(tp) + " does not divide the " + n(sh.heads) + " heads";
  if (tp > 1 && kv % tp != 0) return "tp " + n(tp) + " does not divide the " + n(kv) + " key/value heads";
  if (tp > 1 && sh.vocab % tp != 0) return "tp " + n(tp) + " does not divide the vocabulary of " + n(sh.vocab);
  if (tp > 1 && sh.ffn_dim() % tp != 0) return "tp " + n(tp) + " does not divide the MLP's " + n(sh.ffn_dim());
  if (pp > sh.layers) return "pp " + n(pp) + " is more stages than the " + n(sh.layers) + " layers";
  if (cp > 1) {
    const int64_t chunks = method == "ring" ? 2 * cp : cp;  // ring attention holds two chunks a rank
    if (sh.seq_len % chunks != 0)
      return "cp " + n(cp) + " (" + method + ") does not divide the sequence of " + n(sh.seq_len);
    if (method == "ulysses" && (sh.heads / tp) % cp != 0)
      return "cp " + n(cp) + " (ulysses) does not divide the " + n(sh.heads / tp) + " heads of a tensor-parallel rank";
  }
  return "";
}

namespace {

bool allowed(const std::optional<int>& fixed, int v) { return !fixed || *fixed == v; }

// ZeRO stage × offload: what the engine runs (offload_param needs stage 3, offload_optimizer a stage > 0).
std::vector<std::pair<std::string, std::string>> offload_choices(const SpaceLimits& lim) {
  std::vector<std::pair<std::string, std::string>> offloads = {{"none", "none"}};
  if (lim.offload) {
    offloads.push_back({"cpu", "none"});
    offloads.push_back({"cpu", "cpu"});
    if (lim.nvme) offloads.insert(offloads.end(), {{"nvme", "none"}, {"nvme", "nvme"}});
  }
  return offloads;
}

// The pipeline schedules searched on `pp` stages (one without a pipeline): 1F1B, ZB-H1 (Qi et al.
// 2023), interleaved 1F1B (Narayanan et al. 2021) and ZB-V (two chunks a stage in a V); GPipe only
// when asked (1F1B's bubble, more activations held).
std::vector<std::pair<std::string, int>> schedule_choices(int pp, const SpaceLimits& lim) {
  if (pp == 1) return {{"1f1b", 1}};
  std::vector<std::pair<std::string, int>> all = {{"1f1b", 1}, {"zb_h1", 1}, {"interleaved_1f1b", lim.virtual_stages}, {"zb_v", 2}};
  if (lim.schedule && *lim.schedule == "gpipe") all.push_back({"gpipe", 1});
  std::vector<std::pair<std::string, int>> out;
  for (const auto& choice : all)
    if (!lim.schedule || *lim.schedule == choice.first) out.push_back(choice);
  return out;
}

// Every micro-batch, ZeRO stage, offload and checkpointing choice on `grid` (its degrees and
// schedule set), `per_rank` samples a data-parallel rank.
void add_choices(const Layout& grid, int64_t per_rank, bool has_shape, const SpaceLimits& lim, std::vector<Layout>& out,
                 std::vector<Rejection>* rejected) {
  const auto offloads = offload_choices(lim);
  for (int micro : divisors(per_rank)) {
    if (lim.micro_batch && *lim.micro_batch != micro) continue;
    if (grid.schedule == "interleaved_1f1b" && grid.virtual_stages > 1 && (per_rank / micro) % grid.pp != 0) {
      if (rejected) {
        Layout l = grid;
        l.micro_batch = micro, l.gradient_accumulation = per_rank / micro;
        rejected->push_back({l, "interleaved 1F1B needs the micro-batches (" + std::to_string(per_rank / micro) +
                                    ") a multiple of the " + std::to_string(grid.pp) + " stages", "batch"});
      }
      continue;
    }
    for (int stage = 0; stage <= 3; ++stage) {
      if (!allowed(lim.zero_stage, stage)) continue;
      for (const auto& [opt, param] : offloads) {
        if ((opt != "none" && stage == 0) || (param != "none" && stage != 3)) continue;
        // With one rank per replica group (dp · cp = 1) nothing is partitioned: stages 1-3
        // are stage 0, kept only where offload needs them (1: the optimizer, 3: parameters).
        if (grid.dp * grid.cp == 1 && !lim.zero_stage &&
            ((stage == 1 && opt == "none") || stage == 2 || (stage == 3 && param == "none")))
          continue;
        if (lim.offload_optimizer && *lim.offload_optimizer != opt) continue;
        if (lim.offload_param && *lim.offload_param != param) continue;
        for (const char* ckpt : {"none", "full"}) {
          if (lim.activation_checkpointing ? *lim.activation_checkpointing != ckpt
                                           : (!has_shape && std::string(ckpt) != "none"))
            continue;
          Layout l = grid;
          l.micro_batch = micro;
          l.gradient_accumulation = per_rank / micro;
          l.zero_stage = stage;
          l.offload_optimizer = opt;
          l.offload_param = param;
          l.activation_checkpointing = ckpt;
          out.push_back(l);
        }
      }
    }
  }
}

}  // namespace

std::vector<Layout> enumerate_layouts(int world, int gpus_per_node, int64_t global_batch,
                                      const std::optional<TransformerShape>& shape, const SpaceLimits& lim,
                                      std::vector<Rejection>* rejected) {
  std::vector<Layout> out;
  auto reject = [&](Layout l, std::string reason, const char* kind) {
    if (rejected) rejected->push_back({std::move(l), std::move(reason), kind});
  };
  const int max_tp = lim.max_tp > 0 ? lim.max_tp : gpus_per_node;
  for (int tp : divisors(world)) {
    if (!allowed(lim.tp, tp) || tp > max_tp) continue;
    for (int pp : divisors(world / tp)) {
      if (!allowed(lim.pp, pp)) continue;
      for (int cp : divisors(world / (tp * pp))) {
        if (!allowed(lim.cp, cp) || (cp > 1 && !lim.context_parallel && !lim.cp)) continue;
        Layout grid;
        grid.tp = tp, grid.pp = pp, grid.cp = cp, grid.dp = world / (tp * pp * cp);
        if (shape) {
          const std::string why = grid_rule(tp, pp, cp, lim.context_method, *shape);
          if (!why.empty()) {
            reject(grid, why, "shape");
            continue;
          }
        } else if (cp > 1) {
          continue;  // no sequence to split
        }
        if (global_batch % grid.dp != 0) {
          reject(grid, "the global batch " + std::to_string(global_batch) + " does not divide over dp " +
                           std::to_string(grid.dp), "batch");
          continue;
        }
        // An MoE layer's experts spread over ep of the data-parallel ranks (docs/moe.md).
        for (int ep : lim.num_experts > 0 ? divisors(grid.dp) : std::vector<int>{1}) {
          if (!allowed(lim.ep, ep)) continue;
          grid.ep = ep;
          if (lim.num_experts % ep != 0) {
            reject(grid, "ep " + std::to_string(ep) + " does not divide the " + std::to_string(lim.num_experts) +
                             " experts", "shape");
            continue;
          }
          for (const auto& [schedule, chunks] : schedule_choices(pp, lim)) {
            grid.schedule = schedule, grid.virtual_stages = chunks;
            if (shape && chunks > 1 && shape->layers < int64_t(pp) * chunks) {
              reject(grid, schedule + " with " + std::to_string(chunks) + " chunks a stage needs " +
                               std::to_string(pp * chunks) + " layers, the model has " + std::to_string(shape->layers),
                     "shape");
              continue;
            }
            add_choices(grid, global_batch / grid.dp, shape.has_value(), lim, out, rejected);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace tessera::planner
