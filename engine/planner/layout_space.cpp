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

std::vector<Layout> enumerate_layouts(int world, int gpus_per_node, int64_t global_batch,
                                      const std::optional<TransformerShape>& shape, const SpaceLimits& lim,
                                      std::vector<Rejection>* rejected) {
  std::vector<Layout> out;
  auto reject = [&](Layout l, std::string reason, const char* kind) {
    if (rejected) rejected->push_back({std::move(l), std::move(reason), kind});
  };
  const int max_tp = lim.max_tp > 0 ? lim.max_tp : gpus_per_node;
  auto allowed = [](const std::optional<int>& fixed, int v) { return !fixed || *fixed == v; };
  // ZeRO stage × offload: what the engine runs (offload_param needs stage 3, offload_optimizer a stage > 0).
  std::vector<std::pair<std::string, std::string>> offloads = {{"none", "none"}};
  if (lim.offload) {
    offloads.push_back({"cpu", "none"});
    offloads.push_back({"cpu", "cpu"});
    if (lim.nvme) offloads.insert(offloads.end(), {{"nvme", "none"}, {"nvme", "nvme"}});
  }
  const std::vector<std::string> checkpointing = {"none", "full"};
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
        const int64_t per_rank = global_batch / grid.dp;
        for (int micro : divisors(per_rank)) {
          if (lim.micro_batch && *lim.micro_batch != micro) continue;
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
              for (const auto& ckpt : checkpointing) {
                if (lim.activation_checkpointing ? *lim.activation_checkpointing != ckpt : (!shape && ckpt != "none"))
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
    }
  }
  return out;
}

}  // namespace tessera::planner
