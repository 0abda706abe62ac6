#include "engine/estimator/model_presets.h"

#include "engine/config/config.h"

#include <algorithm>
#include <map>
#include <stdexcept>

namespace tessera {

void TransformerShape::validate() const {
  auto bad = [](const std::string& what) { throw std::invalid_argument("model shape: " + what); };
  if (layers < 1) bad("layers must be >= 1");
  if (hidden < 1) bad("hidden must be >= 1");
  if (heads < 1) bad("heads must be >= 1");
  if (hidden % heads != 0)
    bad("hidden (" + std::to_string(hidden) + ") must be a multiple of heads (" + std::to_string(heads) + ")");
  if (kv_heads < 0 || kv_heads > heads || (kv_heads > 0 && heads % kv_heads != 0))
    bad("kv_heads (" + std::to_string(kv_heads) + ") must divide heads (" + std::to_string(heads) + ")");
  if (ffn < 0) bad("ffn must be >= 0 (0: 4 x hidden)");
  if (vocab < 1) bad("vocab must be >= 1");
  if (seq_len < 1) bad("seq_len must be >= 1");
  if (max_positions < 0) bad("max_positions must be >= 0");
  if (mlp != "gelu" && mlp != "swiglu") bad("mlp must be \"gelu\" or \"swiglu\", not \"" + mlp + "\"");
  if (norm != "layernorm" && norm != "rmsnorm") bad("norm must be \"layernorm\" or \"rmsnorm\", not \"" + norm + "\"");
}

std::vector<ParamTensor> transformer_tensors(const TransformerShape& s, const MoeConfig* moe) {
  s.validate();
  const int64_t h = s.hidden, kv = s.kv_dim(), f = s.ffn_dim();
  std::vector<ParamTensor> out;
  int module = 0;
  // Matrices (dim >= 2) go to group 0, vectors to group 1.
  auto add = [&](std::string name, int64_t numel, bool matrix, int layer, int mod, bool split) {
    ParamTensor t;
    t.name = std::move(name);
    t.numel = numel;
    t.group = matrix ? 0 : 1;
    t.layer = layer;
    t.module = mod;
    t.tp_split = split;
    out.push_back(std::move(t));
  };
  auto norm = [&](const std::string& name, int layer) {
    const int mod = module++;
    add(name + ".weight", h, false, layer, mod, false);
    if (s.norm == "layernorm") add(name + ".bias", h, false, layer, mod, false);
  };
  // A column-parallel linear (output split): weight and bias split. Row-parallel (input split):
  // weight split, bias replicated (added after the all-reduce).
  auto linear = [&](const std::string& name, int64_t in, int64_t outd, int layer, bool column) {
    const int mod = module++;
    add(name + ".weight", in * outd, true, layer, mod, true);
    if (s.biases) add(name + ".bias", outd, false, layer, mod, column);
  };

  add("wte.weight", s.vocab * h, true, -1, module++, true);  // vocab-parallel
  if (s.max_positions > 0) add("wpe.weight", s.max_positions * h, true, -1, module++, false);
  for (int64_t l = 0; l < s.layers; ++l) {
    const int L = static_cast<int>(l);
    const std::string p = "h." + std::to_string(l) + ".";
    norm(p + "ln_1", L);
    if (s.mlp == "gelu") {
      linear(p + "attn.c_attn", h, h + 2 * kv, L, true);
      linear(p + "attn.c_proj", h, h, L, false);
    } else {
      linear(p + "attn.q_proj", h, h, L, true);
      linear(p + "attn.k_proj", h, kv, L, true);
      linear(p + "attn.v_proj", h, kv, L, true);
      linear(p + "attn.o_proj", h, h, L, false);
    }
    norm(p + "ln_2", L);
    if (moe && (l + 1) % moe->every == 0) {
      add(p + "mlp.router.weight", moe->num_experts * h, true, L, module++, false);
      for (int64_t e = 0; e < moe->num_experts; ++e) {
        const size_t first = out.size();
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        if (s.mlp == "gelu") {
          linear(x + "c_fc", h, f, L, true);
          linear(x + "c_proj", f, h, L, false);
        } else {
          linear(x + "gate_proj", h, f, L, true);
          linear(x + "up_proj", h, f, L, true);
          linear(x + "down_proj", f, h, L, false);
        }
        for (size_t i = first; i < out.size(); ++i) {
          out[i].expert = static_cast<int>(e);
          out[i].group += 2;
          out[i].tp_split = false;  // experts are replicated over the tensor group
        }
      }
    } else if (s.mlp == "gelu") {
      linear(p + "mlp.c_fc", h, f, L, true);
      linear(p + "mlp.c_proj", f, h, L, false);
    } else {
      linear(p + "mlp.gate_proj", h, f, L, true);
      linear(p + "mlp.up_proj", h, f, L, true);
      linear(p + "mlp.down_proj", f, h, L, false);
    }
  }
  norm("ln_f", -2);
  if (s.tied_embeddings) {
    add("lm_head.weight (tied to wte)", s.vocab * h, true, -2, module++, true);
    out.back().tied_copy = true;
  } else {
    add("lm_head.weight", s.vocab * h, true, -2, module++, true);
  }
  return out;
}

int64_t param_count(const std::vector<ParamTensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors)
    if (!t.tied_copy) n += t.numel;
  return n;
}

int64_t largest_module_params(const std::vector<ParamTensor>& tensors) {
  std::map<int, int64_t> modules;
  int64_t largest = 0, anonymous = 0;
  for (const auto& t : tensors) {
    if (t.module < 0) anonymous = std::max(anonymous, t.numel);
    else largest = std::max(largest, modules[t.module] += t.numel);
  }
  return std::max(largest, anonymous);
}

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = [] {
    auto gpt2 = [](int64_t layers, int64_t hidden, int64_t heads) {
      TransformerShape s;
      s.layers = layers, s.hidden = hidden, s.heads = heads, s.vocab = 50257, s.seq_len = 1024, s.max_positions = 1024;
      return s;  // GELU MLP 4h, LayerNorm, biases, tied head, dropout (attention: the setup's, SDPA by default)
    };
    auto llama = [](int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t ffn) {
      TransformerShape s;
      s.layers = layers, s.hidden = hidden, s.heads = heads, s.kv_heads = kv_heads, s.ffn = ffn;
      s.vocab = 32000, s.seq_len = 4096, s.max_positions = 0;
      s.mlp = "swiglu", s.norm = "rmsnorm", s.biases = false, s.tied_embeddings = false, s.dropout = false;
      return s;
    };
    TransformerShape tessera_gpt;  // examples/models/gpt.h's GptConfig defaults
    tessera_gpt.layers = 4, tessera_gpt.hidden = 128, tessera_gpt.heads = 4, tessera_gpt.vocab = 256;
    tessera_gpt.seq_len = 128, tessera_gpt.max_positions = 128, tessera_gpt.dropout = false;
    tessera_gpt.flash_attention = true;  // scaled_dot_product_attention (TrainingSetup::attention decides; sdpa by default)
    return std::vector<ModelPreset>{
        {"gpt2-small", "GPT-2 124M: 12 layers, hidden 768, 12 heads, vocab 50257, seq 1024", gpt2(12, 768, 12)},
        {"gpt2-medium", "GPT-2 355M: 24 layers, hidden 1024, 16 heads, vocab 50257, seq 1024", gpt2(24, 1024, 16)},
        {"gpt2-large", "GPT-2 774M: 36 layers, hidden 1280, 20 heads, vocab 50257, seq 1024", gpt2(36, 1280, 20)},
        {"gpt2-xl", "GPT-2 1.5B: 48 layers, hidden 1600, 25 heads, vocab 50257, seq 1024", gpt2(48, 1600, 25)},
        {"llama-7b", "Llama-2 7B: 32 layers, hidden 4096, 32 heads, SwiGLU 11008, vocab 32000, seq 4096",
         llama(32, 4096, 32, 0, 11008)},
        {"llama-13b", "Llama-2 13B: 40 layers, hidden 5120, 40 heads, SwiGLU 13824, vocab 32000, seq 4096",
         llama(40, 5120, 40, 0, 13824)},
        {"llama-70b", "Llama-2 70B: 80 layers, hidden 8192, 64 heads (8 KV heads), SwiGLU 28672, vocab 32000, seq 4096",
         llama(80, 8192, 64, 8, 28672)},
        {"tessera-gpt", "examples/models/gpt.h's default GPT: 4 layers, hidden 128, 4 heads, vocab 256, seq 128",
         tessera_gpt},
    };
  }();
  return presets;
}

std::optional<ModelPreset> find_preset(const std::string& name) {
  for (const auto& p : model_presets())
    if (p.name == name) return p;
  return std::nullopt;
}

}  // namespace tessera
