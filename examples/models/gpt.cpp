#include "examples/models/gpt.h"
#include "examples/models/param_groups.h"

#include <ATen/CPUGeneratorImpl.h>
#include <optional>
#include <ATen/ops/arange.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/full.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/normal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>

#include "parallel/activation_checkpointing.h"
#include "parallel/communicator.h"
#include "parallel/moe/dispatch.h"
#include "parallel/moe/gating.h"
#include "parallel/context_parallel/layout.h"
#include "parallel/context_parallel/ring_attention.h"
#include "parallel/context_parallel/ulysses.h"
#include "parallel/tensor_parallel/cross_entropy.h"
#include "parallel/tensor_parallel/layers.h"
#include "parallel/tensor_parallel/regions.h"
#include <stdexcept>

namespace tessera::examples {

namespace {

// Offsets of a block's parameters from its first one.
enum BlockParam : int64_t {
  kLn1W, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB, kLn2W, kLn2B, kFcW, kFcB, kMlpProjW, kMlpProjB, kPerBlock
};

constexpr double kLayerNormEps = 1e-5;

}  // namespace

int64_t Gpt::add(const std::string& name, at::Tensor value, TensorSplit split) {
  if (tp_ranks() == 1) split = {};  // whole
  // This rank's slice of the whole draw (the draws stay in the single-device order).
  if (split.dim >= 0) value = tensor_parallel_slice(value, tp_.tensor->rank(), tp_ranks(), split.dim, split.fused, name);
  value.set_requires_grad(true);
  params_.push_back(std::move(value));
  names_.push_back(name);
  splits_.push_back(split);
  expert_.push_back(false);
  return static_cast<int64_t>(params_.size()) - 1;
}

int64_t Gpt::tp_ranks() const { return tp_.tensor ? tp_.tensor->size() : 1; }
int64_t Gpt::cp_ranks() const { return cp_.context ? cp_.context->size() : 1; }

at::Tensor Gpt::replicated(const at::Tensor& w) const {
  return tp_.sequence_parallel && tp_ranks() > 1 ? copy_to_tensor_region(w, *tp_.tensor) : w;
}

Gpt::Gpt(GptConfig config, uint64_t seed, PartitionedInit* init, GptTensorParallel tp, GptMoe moe,
         GptContextParallel cp)
    : config_(config), tp_(tp), cp_(cp), moe_(moe) {
  const GptConfig& c = config_;
  if (c.vocab < 1 || c.block_size < 1 || c.n_layer < 1 || c.n_head < 1 || c.n_embd < 1)
    throw std::invalid_argument("GptConfig: every size must be >= 1");
  if (c.n_embd % c.n_head != 0)
    throw std::invalid_argument("GptConfig: n_embd (" + std::to_string(c.n_embd) + ") must be a multiple of n_head (" +
                                std::to_string(c.n_head) + ")");

  if (moe_.config) {
    const MoeConfig& m = *moe_.config;
    const int64_t ep = moe_.expert_parallel ? moe_.expert_parallel->size() : 1;
    if (ep != m.ep_size || m.num_experts % ep != 0 || m.every < 1 || m.k < 1 || m.k > m.num_experts)
      throw std::invalid_argument("GptMoe: num_experts " + std::to_string(m.num_experts) + " over an expert-parallel group of " +
                                  std::to_string(ep) + " ranks (ep_size " + std::to_string(m.ep_size) + "), k " +
                                  std::to_string(m.k) + ", every " + std::to_string(m.every) +
                                  ": ep_size must be the group's size and divide num_experts, 1 <= k <= num_experts");
    gate_.k = m.k;
    gate_.capacity_factor = m.capacity_factor;
    gate_.min_capacity = m.min_capacity;
    gate_.drop_tokens = m.drop_tokens;
    gate_.use_rts = m.use_rts;
    gate_.second_expert_sampling = false;  // deterministic routing: the one-rank run routes alike
    gate_.z_loss_coef = m.router_z_loss_coef;
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const double std_dev = 0.02;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  auto normal = [&](std::vector<int64_t> shape, double s) { return at::normal(0.0, s, shape, gen, at::kFloat); };
  auto zeros = [](std::vector<int64_t> shape) { return at::zeros(shape, at::kFloat); };
  auto ones = [](std::vector<int64_t> shape) { return at::ones(shape, at::kFloat); };

  const int64_t C = c.n_embd, t = tp_ranks();
  if (t > 1 && (c.n_head % t != 0 || c.vocab % t != 0))
    throw std::invalid_argument("GptConfig: tensor parallelism over " + std::to_string(t) + " ranks needs n_head (" +
                                std::to_string(c.n_head) + ") and vocab (" + std::to_string(c.vocab) +
                                ") to be multiples of tensor_parallel.tp_size");
  context_layout(cp_.method, cp_ranks(), 0);  // the method's name checked
  if (cp_.method == "ulysses") check_ulysses_heads(c.n_head / t, cp_ranks());
  wte_ = add("transformer.wte.weight", normal({c.vocab, C}, std_dev), {0});
  wpe_ = add("transformer.wpe.weight", normal({c.block_size, C}, std_dev));
  // Under PartitionedInit each piece is partitioned once drawn (the draws stay in the same order).
  size_t built = 0;
  auto partition_new = [&] {  // experts are partitioned over their expert-data group by the engine
    std::vector<at::Tensor> fresh;
    for (size_t i = built; i < params_.size(); ++i)
      if (!expert_[i]) fresh.push_back(params_[i]);
    if (init) init->partition(fresh);
    built = params_.size();
  };
  partition_new();
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    block_.push_back(add(p + "ln_1.weight", ones({C})));
    add(p + "ln_1.bias", zeros({C}));
    add(p + "attn.c_attn.weight", normal({3 * C, C}, std_dev), {0, 3});
    add(p + "attn.c_attn.bias", zeros({3 * C}), {0, 3});
    add(p + "attn.c_proj.weight", normal({C, C}, residual_std), {1});
    add(p + "attn.c_proj.bias", zeros({C}));
    add(p + "ln_2.weight", ones({C}));
    add(p + "ln_2.bias", zeros({C}));
    if (is_moe_block(l)) {
      add_moe_parameters(p, normal, residual_std);
    } else {
      add(p + "mlp.c_fc.weight", normal({4 * C, C}, std_dev), {0});
      add(p + "mlp.c_fc.bias", zeros({4 * C}), {0});
      add(p + "mlp.c_proj.weight", normal({C, 4 * C}, residual_std), {1});
      add(p + "mlp.c_proj.bias", zeros({C}));
    }
    partition_new();
  }
  ln_f_ = add("transformer.ln_f.weight", ones({C}));
  add("transformer.ln_f.bias", zeros({C}));
  partition_new();
}

void Gpt::add_moe_parameters(const std::string& prefix,
                             const std::function<at::Tensor(std::vector<int64_t>, double)>& normal, double residual_std) {
  const int64_t C = config_.n_embd, E = moe_.config->num_experts;
  const int64_t local = E / moe_.config->ep_size;
  const int64_t first = (moe_.expert_parallel ? moe_.expert_parallel->rank() : 0) * local;
  add(prefix + "mlp.router.weight", normal({E, C}, 0.02));
  for (int64_t e = 0; e < E; ++e) {  // every expert drawn, in order; this rank keeps its own
    const std::string name = prefix + "mlp.experts." + std::to_string(e) + ".";
    at::Tensor fc = normal({4 * C, C}, 0.02), proj = normal({C, 4 * C}, residual_std);
    if (e < first || e >= first + local) continue;
    for (auto& [what, value] : std::vector<std::pair<std::string, at::Tensor>>{
             {"c_fc.weight", fc}, {"c_fc.bias", at::zeros({4 * C})}, {"c_proj.weight", proj}, {"c_proj.bias", at::zeros({C})}}) {
      add(name + what, value);
      expert_.back() = true;
    }
  }
}

std::vector<at::Tensor> Gpt::full_parameters() const {
  std::vector<at::Tensor> whole;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (expert_[i]) {
      // A block's experts: every rank's gathered over the expert-parallel group, in global order.
      if (expert_[i - 1]) continue;  // emitted with the block's first expert parameter
      const int64_t experts = moe_.config->num_experts, ep = moe_.config->ep_size, local = experts / ep;
      if (params_[i].is_meta()) {  // another pipeline stage's block: the shapes, for that stage to fill in
        for (int64_t e = 0; e < experts; ++e)
          for (int64_t j = 0; j < 4; ++j) whole.push_back(at::empty(params_[i + j].sizes(), params_[i + j].options().device(at::kCPU)));
        continue;
      }
      std::vector<at::Tensor> all;  // [local expert e][its 4] -> [ep, ...] each
      for (int64_t j = 0; j < 4 * local; ++j) {
        at::Tensor mine = params_[i + j].detach().contiguous();
        if (ep == 1) {
          all.push_back(mine.unsqueeze(0));
          continue;
        }
        at::Tensor gathered = at::empty({ep * mine.numel()}, mine.options());
        moe_.expert_parallel->all_gather(mine.view(-1), gathered);
        std::vector<int64_t> shape{ep};
        for (int64_t d : mine.sizes()) shape.push_back(d);
        all.push_back(gathered.view(shape));
      }
      for (int64_t e = 0; e < experts; ++e)
        for (int64_t j = 0; j < 4; ++j) whole.push_back(all[(e % local) * 4 + j][e / local]);
      continue;
    }
    if (params_[i].is_meta())  // another pipeline stage's: its shape, for that stage to fill in
      whole.push_back(at::empty(whole_shape(i), params_[i].options().device(at::kCPU)));
    else if (splits_[i].dim >= 0)
      whole.push_back(tensor_parallel_whole(params_[i], *tp_.tensor, splits_[i].dim, splits_[i].fused));
    else
      whole.push_back(params_[i].detach());
  }
  return whole;
}

int64_t Gpt::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.numel();
  return n;
}

at::Tensor Gpt::forward(const at::Tensor& idx) { return forward_layers(idx, 0, num_layers()); }

at::Tensor Gpt::forward_layers(const at::Tensor& input, int64_t begin, int64_t end) {
  const GptConfig& c = config_;
  // A new forward (or a stage's): the MoE blocks' losses and counts start afresh.
  aux_ = l_aux_ = at::Tensor();
  routed_ = dropped_ = 0;
  const std::vector<at::Tensor>& p = params_;  // read at every call: the engine may have replaced them
  if (begin < 0 || end > num_layers() || begin >= end)
    throw std::invalid_argument("Gpt::forward_layers: layers [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") of " + std::to_string(num_layers()));
  const int64_t C = c.n_embd;

  // Each unit's forward inside its scope when an engine listens (Engine::unit); unit u's output
  // is marked so the engine hears when its backward begins.
  auto enter = [&](int64_t u) {
    return engine_ ? std::optional<UnitScope>(engine_->unit(static_cast<int>(u))) : std::nullopt;
  };
  auto mark = [](std::optional<UnitScope>& scope, const at::Tensor& t) { return scope ? scope->output(t) : t; };

  const int64_t t = tp_ranks();
  Communicator* tensor = tp_.tensor;
  const TensorParallelStyle style{tp_.sequence_parallel && t > 1, /*seq_dim=*/1};
  at::Tensor x = input;
  if (begin == 0) {
    if (input.dim() != 2) throw std::invalid_argument("Gpt::forward: idx must be [batch, seq_len]");
    const int64_t T = input.size(1) * cp_ranks();  // the whole sequence's length
    if (T > c.block_size)
      throw std::invalid_argument("Gpt::forward: sequence of " + std::to_string(T) + " tokens exceeds block_size " +
                                  std::to_string(c.block_size));
    const at::Tensor idx = input.to(p[wte_].device(), at::kLong);
    // This rank's tokens' global positions (under context parallelism a part of the sequence).
    at::Tensor pos = cp_ranks() > 1 ? context_positions(T, context_layout(cp_.method, cp_ranks(), cp_.context->rank()),
                                                        idx.device())
                                    : at::arange(T, idx.options());
    auto scope = enter(0);
    at::Tensor tokens = t > 1 ? vocab_parallel_embedding(idx, p[wte_], tensor->rank() * p[wte_].size(0), *tensor)
                              : at::embedding(p[wte_], idx);
    x = tokens.add(at::embedding(p[wpe_], pos));  // [B, T, C], parameter dtype
    if (style.sequence_parallel) x = scatter_to_sequence_region(x, *tensor, 1);  // [B, T/t, C]
    x = mark(scope, x);
  }
  for (int64_t l = std::max<int64_t>(begin, 1) - 1; l < std::min<int64_t>(end - 1, c.n_layer); ++l) {
    auto scope = enter(1 + l);
    if (checkpointing_) {  // only the block's input is kept; backward runs the block again
      x = checkpoint([this, l](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{block(l, in[0])}; },
                     {x}, *checkpointing_)[0];
    } else {
      x = block(l, x);
    }
    x = mark(scope, x);
  }
  if (end < num_layers()) return x;
  auto scope = enter(1 + c.n_layer);
  x = at::layer_norm(x, {C}, replicated(p[ln_f_]), replicated(p[ln_f_ + 1]), kLayerNormEps);
  if (style.sequence_parallel) x = gather_from_tensor_region(x, *tensor, 1);  // the whole sequence again
  // Tied LM head: with tensor parallelism the logits of this rank's part of the vocabulary.
  return mark(scope, t > 1 ? column_parallel_linear(x, p[wte_], {}, *tensor) : at::linear(x, p[wte_]));
}

at::Tensor Gpt::block(int64_t l, const at::Tensor& x) const {
  const GptConfig& c = config_;
  const int64_t C = c.n_embd, H = c.n_head, D = C / H, t = tp_ranks();
  const TensorParallelStyle style{tp_.sequence_parallel && t > 1, /*seq_dim=*/1};
  // Without tensor parallelism these are plain linear layers (the region crossings are identities).
  auto column = [&](const at::Tensor& in, const at::Tensor& w, const at::Tensor& b) {
    return t > 1 ? column_parallel_linear(in, w, b, *tp_.tensor, style) : at::linear(in, w, b);
  };
  auto row = [&](const at::Tensor& in, const at::Tensor& w, const at::Tensor& b) {
    return t > 1 ? row_parallel_linear(in, w, b, *tp_.tensor, style) : at::linear(in, w, b);
  };
  const at::Tensor* w = &params_[block_[l]];  // read now: the engine may have replaced them
  at::Tensor h = at::layer_norm(x, {C}, replicated(w[kLn1W]), replicated(w[kLn1B]), kLayerNormEps);
  at::Tensor qkv = column(h, w[kAttnW], w[kAttnB]);  // [B, T, 3C/t]: this rank's heads, the whole sequence
  const int64_t B = qkv.size(0), T = qkv.size(1);
  std::vector<at::Tensor> parts = qkv.chunk(3, 2);
  auto heads = [&](const at::Tensor& u) { return u.view({B, T, H / t, D}).transpose(1, 2); };  // [B, H/t, T, D]
  at::Tensor y = attention(heads(parts[0]), heads(parts[1]), heads(parts[2]));
  y = y.transpose(1, 2).reshape({B, T, C / t});
  at::Tensor out = x.add(row(y, w[kAttnProjW], w[kAttnProjB]));
  h = at::layer_norm(out, {C}, replicated(w[kLn2W]), replicated(w[kLn2B]), kLayerNormEps);
  if (is_moe_block(l)) return out.add(moe_mlp(l, h));
  h = at::gelu(column(h, w[kFcW], w[kFcB]), "tanh");
  return out.add(row(h, w[kMlpProjW], w[kMlpProjB]));
}

at::Tensor Gpt::attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
  if (cp_ranks() == 1)
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
  Communicator& context = *cp_.context;
  if (cp_.method == "ring") return ring_attention(q, k, v, context);
  // Ulysses: the whole sequence for this rank's share of the heads, then back.
  at::Tensor y = at::scaled_dot_product_attention(
      sequence_to_heads(q, context, 2, 1), sequence_to_heads(k, context, 2, 1), sequence_to_heads(v, context, 2, 1),
      /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
  return heads_to_sequence(y, context, 2, 1);
}

at::Tensor Gpt::moe_mlp(int64_t l, const at::Tensor& h) const {
  const int64_t C = config_.n_embd;
  const at::Tensor* w = &params_[block_[l] + kFcW];  // the router, then each local expert's 4
  at::Tensor tokens = h.reshape({-1, C});
  // The router in fp32 whatever the compute dtype (as DeepSpeed's TopKGate).
  at::Tensor logits = at::linear(tokens.to(at::kFloat), replicated(w[0]).to(at::kFloat));
  const Routing routing = route(logits, gate_, /*training=*/true);
  const Dispatch dispatch(tokens, routing, moe_.expert_parallel);
  std::vector<at::Tensor> outputs;
  for (int64_t e = 0; e < dispatch.local_experts(); ++e) {
    const at::Tensor* x = w + 1 + 4 * e;
    at::Tensor hidden = at::gelu(at::linear(dispatch.expert_inputs()[e], replicated(x[0]), replicated(x[1])), "tanh");
    outputs.push_back(at::linear(hidden, replicated(x[2]), replicated(x[3])));
  }
  at::Tensor aux = routing.l_aux.mul(moe_.config->aux_loss_coef);
  aux_ = aux_.defined() ? aux_.add(aux) : aux;
  l_aux_ = l_aux_.defined() ? l_aux_.add(routing.l_aux.detach()) : routing.l_aux.detach();
  routed_ += routing.tokens * routing.k;
  dropped_ += routing.dropped;
  return dispatch.combine(outputs).view(h.sizes());
}

at::Tensor Gpt::loss(const at::Tensor& idx, const at::Tensor& targets) {
  at::Tensor loss = loss_of_logits(forward(idx), targets);
  return aux_.defined() ? loss.add(aux_) : loss;  // the MoE blocks' load-balancing losses
}

at::Tensor Gpt::loss_of_logits(const at::Tensor& logits, const at::Tensor& targets) const {
  at::Tensor mean;
  if (tp_ranks() > 1) {
    mean = vocab_parallel_cross_entropy(logits, targets, *tp_.tensor);
  } else {
    at::Tensor t = targets.to(logits.device(), at::kLong).reshape({-1});
    mean = at::cross_entropy_loss(logits.to(at::kFloat).reshape({-1, logits.size(-1)}), t);
  }
  if (cp_ranks() == 1) return mean;
  // The whole sequences' mean: this rank's sum over its tokens, summed over the context group.
  const double tokens = static_cast<double>(targets.numel());
  return context_mean(mean.mul(tokens), at::full({}, tokens, at::kDouble), *cp_.context);
}

std::vector<int64_t> Gpt::layer_parameters(int64_t layer) const {
  if (layer == 0) return {wte_, wpe_};
  if (layer == num_layers() - 1) return {ln_f_, ln_f_ + 1, wte_};
  std::vector<int64_t> out;
  const int64_t end = layer < config_.n_layer ? block_[layer] : ln_f_;  // the next block's first
  for (int64_t i = block_[layer - 1]; i < end; ++i) out.push_back(i);
  return out;
}

std::vector<pipeline::LayerInfo> Gpt::layer_infos() const {
  std::vector<pipeline::LayerInfo> infos;
  for (int64_t layer = 0; layer < num_layers(); ++layer) {
    int64_t n = 0;
    for (int64_t i : layer_parameters(layer)) n += params_[i].numel();
    infos.push_back({layer == 0 ? "Embedding" : layer == num_layers() - 1 ? "Head" : "Block", n});
  }
  return infos;
}

ModelDescription Gpt::groups_of(const std::vector<int64_t>& indices, double weight_decay) const {
  std::vector<at::Tensor> params, experts;
  std::vector<std::string> names, expert_names;
  for (int64_t i : indices) {
    (expert_[i] ? experts : params).push_back(params_[i]);
    (expert_[i] ? expert_names : names).push_back(names_[i]);
  }
  ModelDescription model = decay_groups(params, weight_decay, names);
  // Which ones are tensor-parallel slices (their norm is summed over the group), in each group's
  // order: decay_groups keeps the order within "decay" (dim >= 2) and "no_decay".
  for (int64_t i : indices)
    if (!expert_[i]) model.groups[params_[i].dim() >= 2 ? 0 : 1].tensor_splits.push_back(splits_[i]);
  if (!experts.empty()) {
    // The experts: reduced and partitioned over their expert-data group, their averaged gradients
    // scaled by 1/ep_size (zero/model.h, ParamGroup::gradient_scale).
    ModelDescription e = decay_groups(experts, weight_decay, expert_names);
    for (ParamGroup& g : e.groups) {
      g.name = "experts." + g.name;
      g.communicator = moe_.expert_data;
      g.gradient_scale = 1.0 / static_cast<double>(moe_.config->ep_size);
      model.groups.push_back(std::move(g));
    }
  }
  return model;
}

std::vector<int64_t> Gpt::parameters_of_layers(const LayerRanges& ranges) const {
  std::vector<int64_t> indices;
  for (const auto& [begin, end] : ranges)
    for (int64_t layer = begin; layer < end; ++layer)
      for (int64_t i : layer_parameters(layer))
        if (std::find(indices.begin(), indices.end(), i) == indices.end()) indices.push_back(i);
  return indices;
}

std::vector<int64_t> Gpt::full_parameters_of_layers(const LayerRanges& ranges) const {
  // Where each parameter starts in full_parameters(): a block's experts take 4·E places at its
  // first expert parameter (the others none).
  std::vector<int64_t> first(params_.size());
  int64_t at = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    first[i] = at;
    if (!expert_[i]) ++at;
    else if (!expert_[i - 1]) at += 4 * moe_.config->num_experts;
  }
  std::vector<int64_t> out;
  for (int64_t i : parameters_of_layers(ranges)) {
    if (!expert_[i]) out.push_back(first[i]);
    else if (!expert_[i - 1])
      for (int64_t k = 0; k < 4 * moe_.config->num_experts; ++k) out.push_back(first[i] + k);
  }
  return out;
}

void Gpt::keep_only_layers(const LayerRanges& ranges) {
  const std::vector<int64_t> kept = parameters_of_layers(ranges);
  for (size_t i = 0; i < params_.size(); ++i)
    if (std::find(kept.begin(), kept.end(), static_cast<int64_t>(i)) == kept.end())
      params_[i] = at::empty(params_[i].sizes(), params_[i].options().device(at::kMeta));
}

std::vector<int64_t> Gpt::whole_shape(int64_t i) const {
  std::vector<int64_t> shape = params_[i].sizes().vec();
  if (splits_[i].dim >= 0) shape[splits_[i].dim] *= tp_ranks();
  return shape;
}

ModelDescription Gpt::stage_param_groups(double weight_decay, const LayerRanges& ranges, bool separate_wte) const {
  std::vector<int64_t> indices = parameters_of_layers(ranges);
  if (separate_wte) indices.erase(std::remove(indices.begin(), indices.end(), wte_), indices.end());
  ModelDescription model = groups_of(indices, weight_decay);
  if (separate_wte) {
    ModelDescription tied = groups_of({wte_}, weight_decay);  // one matrix: the "decay" group
    tied.groups[0].name = "tied";
    model.groups.push_back(std::move(tied.groups[0]));
  }
  return model;
}

ModelDescription Gpt::param_groups(double weight_decay) const {
  std::vector<int64_t> all;
  for (size_t i = 0; i < params_.size(); ++i) all.push_back(static_cast<int64_t>(i));
  ModelDescription model = groups_of(all, weight_decay);
  model.units.push_back({"embedding", {params_[wte_], params_[wpe_]}});
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    ModelUnit block{"h." + std::to_string(l), {}};
    for (int64_t i : layer_parameters(l + 1)) block.params.push_back(params_[i]);
    model.units.push_back(std::move(block));
  }
  model.units.push_back({"head", {params_[ln_f_], params_[ln_f_ + 1], params_[wte_]}});
  return model;
}

}  // namespace tessera::examples
