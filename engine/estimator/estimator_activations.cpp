// Activation memory per layer and stage (Korthikanti et al. 2022), as docs/estimator.md states it.
#include "engine/estimator/estimator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>

#include "engine/estimator/estimator_detail.h"
#include "zero/flat_layout.h"

namespace tessera {

using namespace estimator_detail;

namespace estimator_detail {

// ---- activations ---------------------------------------------------------------------------


// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4,
// generalized to any ffn size, grouped-query attention, SwiGLU, no dropout and SDPA; for a GPT
// shape (ffn 4h, MHA, dropout, 16-bit) with eager attention it is exactly sbh(34 + 5as/h) per
// layer, or sbh(10 + 24/t + 5as/(ht)) with tensor parallelism t, sbh(34/t + 5as/(ht)) with
// sequence parallelism.
//
// The attention core (what softmax(QKᵀ/√d)·V keeps beyond Q, K, V and its output, which are
// counted with the layer's other tensors), per layer and micro-batch, divided by t:
//   eager (Korthikanti's 5as/h term, in sbh units): the softmax output e·a·s²·b; with dropout
//     also its 1-byte mask a·s²·b and its output e·a·s²·b.
//   sdpa (the default; FlashAttention, memory-efficient and cuDNN kernels): only the fp32
//     log-sum-exp of every row and head, 4·a·s·b bytes. The kernels save q, k, v, the output, the
//     log-sum-exp and the RNG seed/offset, and recompute the scores (and the dropout mask) in the
//     backward, so no s² term remains. The output is the projection's input (same storage: the
//     kernels write it in (b, s, a, d) layout, so transpose(1, 2).contiguous() copies nothing).
Activations activation_terms(const TransformerShape& sh, const TrainingSetup& s, int64_t micro_batch) {
  Activations a;
  // Context parallelism: every per-token term is this rank's part of the sequence.
  const double cp = std::max(1, s.cp);
  const double S = std::ceil(static_cast<double>(sh.seq_len) / cp), b = micro_batch, h = sh.hidden, heads = sh.heads, kv = sh.kv_dim(), f = sh.ffn_dim();
  const double t = s.tp, e = s.precision == "fp32" ? 4 : 2, sbh = S * b * h;
  const bool sp = s.sequence_parallel && s.tp > 1;
  const bool flash = s.flash_attention.value_or(s.attention == "sdpa");
  const double mask = sh.dropout ? 1 : 0;
  // Replicated across tensor-parallel ranks unless sequence parallelism splits them: the two
  // norms' inputs, the QKV and MLP inputs, and the two dropout masks after attention and MLP.
  const double replicated = (4 * e + 2 * mask) * sbh / (sp ? t : 1);
  // Split by t: Q, K, V, the attention output projection's input, the MLP's inner activations.
  const double mlp = (sh.mlp == "swiglu" ? 3 : 2) * e * S * b * f;
  const double split = (2 * e * sbh + 2 * e * S * b * kv + mlp) / t;
  // The attention core: eager: softmax output (and with dropout its mask and output), a·s²·b
  // each; sdpa: only the fp32 log-sum-exp (4·a·s·b).
  const double core = flash ? 4 * heads * S * b / t : (e + mask * (1 + e)) * heads * S * S * b / t;
  // Context parallelism (parallel/context_parallel/), per layer of this rank's S = seq_len/cp tokens:
  //   ulysses  the attention's output is kept in both layouts (SDPA's head-split one for its
  //            backward, the projection's sequence-split input): + e·S·b·h/t. Transient: the
  //            all-to-alls' send and receive buffers of q, k and v: 2·e·S·b·(h + 2kv)/t.
  //   ring     the fp32 merged output kept for the backward beside the output in the compute
  //            dtype: + 4·S·b·h/t. Transient: the key/value block attended and the one arriving
  //            (2 · e·S·b·2kv/t), in the backward also three fp32 gradient accumulators (the block's
  //            part, the one arriving, the one sent: 3 · 4·S·b·2kv/t).
  double context_extra = 0;
  if (cp > 1) {
    if (s.context_method == "ring") {
      context_extra = 4 * S * b * h / t;
      a.context_buffers = round_bytes(2 * e * S * b * 2 * kv / t + 3 * 4 * S * b * 2 * kv / t);
    } else {
      context_extra = e * S * b * h / t;
      a.context_buffers = round_bytes(2 * e * S * b * (h + 2 * kv) / t);
    }
    a.context_extra = round_bytes(context_extra);
  }
  a.layer_full = round_bytes(replicated + split + core + context_extra);
  a.checkpoint = round_bytes(e * sbh / ((sp || s.partition_activations) ? t : 1));
  if (s.activation_checkpointing == "full") a.layer_stored = a.checkpoint;
  else if (s.activation_checkpointing == "selective") a.layer_stored = round_bytes(replicated + split);
  else a.layer_stored = a.layer_full;
  a.embedding = round_bytes(mask * sbh / (sp ? t : 1));
  if (s.moe) {
    // An MoE layer's MLP (parallel/moe/): T tokens (this tensor rank's under sequence
    // parallelism), k choices each. Its experts process R rows: with a capacity C, E·C (each of
    // the ep ranks sends every local expert C rows, zeros included); dropless at the worst case,
    // every choice of the ep ranks routed here, ep·k·T. Stored: the experts' inputs, their two inner
    // activations (f wide) and their outputs (read by the weighted sum), the k·T rows brought back,
    // and the router's fp32 logits and probabilities; in place of the dense MLP's inner
    // activations. The all-to-all's send and receive buffers are transient: the larger way twice.
    const MoeConfig& m = *s.moe;
    const double T = S * b / (sp ? t : 1), E = static_cast<double>(m.num_experts), k = static_cast<double>(m.k);
    const double capacity = std::max<double>(static_cast<double>(m.min_capacity), std::ceil(T / E * m.capacity_factor * k));
    const double rows = m.drop_tokens ? E * capacity : static_cast<double>(m.ep_size) * k * T;
    const double inner = (sh.mlp == "swiglu" ? 3 : 2) * e * rows * f;
    const double moe = e * rows * h * 2 + inner + e * k * T * h + 2 * 4 * T * E;
    a.moe_rows = round_bytes(rows);
    a.moe_extra = round_bytes(moe - mlp / t);
    const double sent = m.drop_tokens ? E * capacity : k * T;
    a.moe_all_to_all = round_bytes(e * h * (sent + rows));
  }
  a.output = round_bytes(2 * e * sbh / (sp ? t : 1) + 8.0 * S * b * sh.vocab / t);

  // The formula in words, in sbh units (Korthikanti's).
  const double rep_c = 4 * e + 2 * mask;
  const double split_c = 2 * e + 2 * e * kv / h + (sh.mlp == "swiglu" ? 3 : 2) * e * f / h;
  std::string terms;
  if (t > 1) terms = fmt("%.4g", rep_c) + (sp ? "/t" : "") + " + " + fmt("%.4g", split_c) + "/t";
  else terms = fmt("%.4g", rep_c + split_c);
  if (flash) terms += " + 4a/h" + (t > 1 ? std::string("t") : "") + " (SDPA: fp32 log-sum-exp, no s^2 scores)";
  else terms += " + " + fmt("%g", e + mask * (1 + e)) + (t > 1 ? "as/(ht)" : "as/h") + " (eager attention: s^2 scores)";
  a.formula = "sbh(" + terms + ")";
  if (cp > 1)
    a.formula += ", s = seq_len/" + fmt("%g", cp) + " per context rank" +
                 (s.context_method == "ring" ? " + 4sbh/t (ring: the fp32 merged output)"
                                             : " + " + fmt("%g", e) + "sbh/t (Ulysses: the output in both layouts)");
  if (s.activation_checkpointing == "selective" && !flash) a.formula += "; selective recomputation drops the s^2 term";
  if (sh.mlp == "gelu" && sh.ffn_dim() == 4 * sh.hidden && kv == h && sh.dropout && e == 2 && !flash)
    a.formula += " (Korthikanti et al.'s formula)";
  return a;
}

}  // namespace estimator_detail
}  // namespace tessera
