// The example models and data loaders on their own, without the Engine: shapes, determinism,
// the loaders' slicing, and that a few optimizer steps of plain ATen Adam on a fixed batch lower
// each model's loss clearly (the models learn). Needs the Debian packages `fortunes` and
// `dataset-fashion-mnist` (scripts/setup.sh installs them).
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/allclose.h>
#include <ATen/Context.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros_like.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "examples/data/fashion_mnist.h"
#include "examples/data/fortunes_corpus.h"
#include "examples/models/cnn.h"
#include "examples/models/gpt.h"

using namespace tessera::examples;
using tessera::ModelDescription;

namespace {

// The corpora are read once for the whole test run.
const FortunesCorpus& corpus() {
  static const FortunesCorpus c;
  return c;
}
const FashionMnist& fashion() {
  static const FashionMnist f;
  return f;
}

// Plain Adam over a parameter list, in ATen ops (no Engine).
struct Adam {
  explicit Adam(const std::vector<at::Tensor>& params, double lr) : lr(lr) {
    for (const auto& p : params) {
      m.push_back(at::zeros_like(p));
      v.push_back(at::zeros_like(p));
    }
  }
  void step(std::vector<at::Tensor>& params) {
    at::NoGradGuard no_grad;
    ++t;
    const double c1 = 1.0 - std::pow(b1, t), c2 = 1.0 - std::pow(b2, t);
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor g = params[i].grad();
      if (!g.defined()) continue;
      m[i].mul_(b1).add_(g, 1.0 - b1);
      v[i].mul_(b2).addcmul_(g, g, 1.0 - b2);
      params[i].addcdiv_(m[i], v[i].div(c2).sqrt_().add_(eps), -lr / c1);
      params[i].mutable_grad() = at::Tensor();
    }
  }
  std::vector<at::Tensor> m, v;
  double lr, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  int t = 0;
};

int64_t count(const ModelDescription& d) {
  int64_t n = 0;
  for (const auto& g : d.groups)
    for (const auto& p : g.params) n += p.numel();
  return n;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Data

TEST_CASE("fortunes corpus: size files and the validation split", "[examples][data]") {
  const FortunesCorpus& c = corpus();
  CHECK(c.size() > 1000000);
  CHECK(c.files() > 20);
  CHECK(c.fortunes() > 5000);
  CHECK(c.vocab_size() == 256);
  CHECK(c.train_size() + c.validation_size() == c.size());
  const double fraction = static_cast<double>(c.validation_size()) / static_cast<double>(c.size());
  CHECK(fraction > 0.04);
  CHECK(fraction < 0.06);
  // The split falls on a fortune boundary.
  CHECK(c.text().substr(static_cast<size_t>(c.train_size()) - 3, 3) == "\n%\n");
}

TEST_CASE("fortunes corpus: a missing corpus says how to install it", "[examples][data]") {
  try {
    FortunesCorpus missing("/nonexistent/fortunes");
    FAIL("no error");
  } catch (const std::runtime_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("apt-get install fortunes"));
  }
}

TEST_CASE("fortunes corpus: batches have the right shape and targets are inputs shifted by one", "[examples][data]") {
  Batch b = corpus().sample(6, 32, 0, 1234);
  REQUIRE(b.inputs.sizes() == at::IntArrayRef({6, 32}));
  REQUIRE(b.targets.sizes() == at::IntArrayRef({6, 32}));
  CHECK(b.inputs.scalar_type() == at::kLong);
  CHECK(b.targets.scalar_type() == at::kLong);
  CHECK(at::equal(b.inputs.narrow(1, 1, 31), b.targets.narrow(1, 0, 31)));
  CHECK(b.inputs.min().item<int64_t>() >= 0);
  CHECK(b.inputs.max().item<int64_t>() < 256);
  // Every row is a window of the train text.
  const std::string train = corpus().text().substr(0, static_cast<size_t>(corpus().train_size()));
  for (int64_t r = 0; r < 6; ++r) {
    std::string window = FortunesCorpus::decode(b.inputs[r]) + FortunesCorpus::decode(b.targets[r].narrow(0, 31, 1));
    CHECK(train.find(window) != std::string::npos);
  }
}

TEST_CASE("fortunes corpus: validation batches come from the held-out text", "[examples][data]") {
  Batch b = corpus().sample(4, 64, 3, 7, FortunesCorpus::Split::Validation);
  const std::string held_out = corpus().text().substr(static_cast<size_t>(corpus().train_size()));
  for (int64_t r = 0; r < 4; ++r) CHECK(held_out.find(FortunesCorpus::decode(b.inputs[r])) != std::string::npos);
  CHECK_FALSE(at::equal(b.inputs, corpus().sample(4, 64, 3, 7).inputs));
}

TEST_CASE("fortunes corpus: deterministic in seed and step", "[examples][data]") {
  const FortunesCorpus& c = corpus();
  CHECK(at::equal(c.sample(8, 64, 5, 42).inputs, c.sample(8, 64, 5, 42).inputs));
  CHECK_FALSE(at::equal(c.sample(8, 64, 5, 42).inputs, c.sample(8, 64, 6, 42).inputs));
  CHECK_FALSE(at::equal(c.sample(8, 64, 5, 42).inputs, c.sample(8, 64, 5, 43).inputs));
  // A larger batch for the same step starts with the same rows: ranks agree on the global batch.
  CHECK(at::equal(c.sample(4, 64, 5, 42).inputs, c.sample(8, 64, 5, 42).inputs.narrow(0, 0, 4)));
}

TEST_CASE("rows(): each data-parallel rank's slice of the global batch", "[examples][data]") {
  Batch global = corpus().sample(8, 16, 0, 1);
  std::vector<at::Tensor> parts;
  for (int rank = 0; rank < 4; ++rank) {
    Batch mine = rows(global, rank * 2, 2);
    REQUIRE(mine.size() == 2);
    CHECK(at::equal(mine.targets, global.targets.narrow(0, rank * 2, 2)));
    parts.push_back(mine.inputs);
  }
  CHECK(at::equal(at::cat(parts, 0), global.inputs));
  CHECK_THROWS_AS(rows(global, 7, 2), std::out_of_range);
  CHECK_THROWS_AS(rows(global, -1, 1), std::out_of_range);
}

TEST_CASE("fashion-mnist: sizes shapes normalization", "[examples][data]") {
  const FashionMnist& f = fashion();
  CHECK(f.size(FashionMnist::Split::Train) == 60000);
  CHECK(f.size(FashionMnist::Split::Test) == 10000);
  ImageBatch b = f.sample(16, 0, 1234);
  REQUIRE(b.images.sizes() == at::IntArrayRef({16, 1, 28, 28}));
  REQUIRE(b.labels.sizes() == at::IntArrayRef({16}));
  CHECK(b.images.scalar_type() == at::kFloat);
  CHECK(b.labels.scalar_type() == at::kLong);
  CHECK(b.labels.min().item<int64_t>() >= 0);
  CHECK(b.labels.max().item<int64_t>() <= 9);
  // Normalized with the train set's statistics: mean ~0, std ~1 (on a third of it).
  ImageBatch some = f.range(0, 20000, FashionMnist::Split::Train);
  CHECK(std::abs(some.images.mean().item<double>()) < 0.02);
  CHECK(std::abs(some.images.std().item<double>() - 1.0) < 0.02);
  CHECK(std::string(FashionMnist::class_name(9)) == "Ankle boot");
}

TEST_CASE("fashion-mnist: deterministic in seed and step epochs without repeats rows()", "[examples][data]") {
  const FashionMnist& f = fashion();
  ImageBatch a = f.sample(32, 3, 9), b = f.sample(32, 3, 9);
  CHECK(at::equal(a.images, b.images));
  CHECK(at::equal(a.labels, b.labels));
  CHECK_FALSE(at::equal(a.images, f.sample(32, 4, 9).images));
  CHECK_FALSE(at::equal(a.images, f.sample(32, 3, 10).images));
  ImageBatch mine = rows(a, 8, 8);
  CHECK(at::equal(mine.images, a.images.narrow(0, 8, 8)));
  CHECK(at::equal(mine.labels, a.labels.narrow(0, 8, 8)));
  CHECK_THROWS_AS(rows(a, 30, 8), std::out_of_range);
  // The permutation behind an epoch is a bijection.
  for (int64_t n : {1, 2, 10, 60000}) {
    std::set<int64_t> seen;
    for (int64_t i = 0; i < n; ++i) seen.insert(permute_index(i, n, 77));
    CHECK(static_cast<int64_t>(seen.size()) == n);
    CHECK(*seen.begin() == 0);
    CHECK(*seen.rbegin() == n - 1);
  }
}

TEST_CASE("fashion-mnist: a missing data set says how to install it", "[examples][data]") {
  try {
    FashionMnist missing("/nonexistent/fashion-mnist");
    FAIL("no error");
  } catch (const std::runtime_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("apt-get install dataset-fashion-mnist"));
  }
}

// ---------------------------------------------------------------------------------------------
// GPT

TEST_CASE("gpt: shapes parameter count names and groups", "[examples][gpt]") {
  GptConfig cfg;
  Gpt model(cfg, 1234);
  const int64_t C = cfg.n_embd;
  const int64_t per_block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
  const int64_t expected = cfg.vocab * C + cfg.block_size * C + cfg.n_layer * per_block + 2 * C;
  CHECK(model.num_parameters() == expected);
  CHECK(model.num_parameters() == 842496);
  REQUIRE(model.parameter_names().size() == model.parameters().size());
  CHECK(model.parameter_names().front() == "transformer.wte.weight");
  CHECK(model.parameter_names().back() == "transformer.ln_f.bias");
  for (const auto& p : model.parameters()) {
    CHECK(p.is_leaf());
    CHECK(p.requires_grad());
  }

  ModelDescription groups = model.param_groups(0.1);
  REQUIRE(groups.groups.size() == 2);
  CHECK(count(groups) == expected);
  CHECK(groups.groups[0].weight_decay == 0.1);
  CHECK(groups.groups[1].weight_decay == 0.0);
  for (const auto& p : groups.groups[0].params) CHECK(p.dim() >= 2);
  for (const auto& p : groups.groups[1].params) CHECK(p.dim() == 1);
  CHECK(static_cast<int64_t>(groups.groups[0].params.size()) == 2 + 4 * cfg.n_layer);  // embeddings + 4 matrices per block
  ModelDescription decay_only;
  decay_only.groups = {groups.groups[0]};
  CHECK(count(decay_only) == 835584);  // the numbers examples/README.md gives
  // The groups hold the model's own tensors, not copies.
  CHECK(groups.groups[0].params[0].is_same(model.parameters()[0]));

  Batch b = corpus().sample(2, 16, 0, 1);
  at::Tensor logits = model.forward(b.inputs);
  CHECK(logits.sizes() == at::IntArrayRef({2, 16, 256}));
  // At initialization the prediction is close to uniform over 256 bytes.
  CHECK(model.loss(b.inputs, b.targets).item<double>() == Approx(std::log(256.0)).margin(0.3));
  CHECK_THROWS_AS(model.forward(corpus().sample(1, cfg.block_size + 1, 0, 1).inputs), std::invalid_argument);
}

TEST_CASE("gpt: initialization is deterministic in the seed", "[examples][gpt]") {
  Gpt a(GptConfig{}, 5), b(GptConfig{}, 5), c(GptConfig{}, 6);
  for (size_t i = 0; i < a.parameters().size(); ++i) CHECK(at::equal(a.parameters()[i], b.parameters()[i]));
  CHECK_FALSE(at::equal(a.parameters()[0], c.parameters()[0]));
}

TEST_CASE("gpt: attention is causal", "[examples][gpt]") {
  Gpt model(GptConfig{}, 3);
  at::NoGradGuard no_grad;
  Batch b = corpus().sample(1, 32, 0, 1);
  at::Tensor changed = b.inputs.clone();
  changed[0][20] = (changed[0][20].item<int64_t>() + 1) % 256;
  at::Tensor x = model.forward(b.inputs), y = model.forward(changed);
  CHECK(at::allclose(x.narrow(1, 0, 20), y.narrow(1, 0, 20)));
  CHECK_FALSE(at::allclose(x.narrow(1, 20, 12), y.narrow(1, 20, 12)));
}

TEST_CASE("gpt: checkpointed blocks give the same loss and gradients and recompute each block once", "[examples][gpt]") {
  Gpt plain(GptConfig{}, 5), ckpt(GptConfig{}, 5);
  ckpt.set_activation_checkpointing(tessera::CheckpointOptions{});
  Batch b = corpus().sample(4, 64, 0, 1);
  at::Tensor loss_plain = plain.loss(b.inputs, b.targets), loss_ckpt = ckpt.loss(b.inputs, b.targets);
  CHECK(loss_plain.item<double>() == loss_ckpt.item<double>());
  loss_plain.backward();
  const int64_t before = tessera::checkpoint_recomputations();
  loss_ckpt.backward();
  CHECK(tessera::checkpoint_recomputations() - before == GptConfig{}.n_layer);
  for (size_t i = 0; i < plain.parameters().size(); ++i) {
    INFO(plain.parameter_names()[i]);
    CHECK(at::equal(plain.parameters()[i].grad(), ckpt.parameters()[i].grad()));
  }
}

TEST_CASE("activation checkpointing: dropout inside is recomputed with the same mask and the caller's generator is left as it was",
          "[examples][checkpoint]") {
  at::Tensor w = at::randn({16, 16}).set_requires_grad(true);
  at::Tensor x = at::randn({8, 16});
  auto f = [&w](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{at::dropout(at::linear(in[0], w), 0.5, /*train=*/true).sum()};
  };
  at::manual_seed(7);
  f({x})[0].backward();
  at::Tensor plain = w.grad().clone();
  at::Tensor next_plain = at::rand({1});
  w.mutable_grad() = at::Tensor();
  at::manual_seed(7);
  tessera::checkpoint(f, {x})[0].backward();  // x needs no gradient: the parameters still get theirs
  CHECK(at::equal(w.grad(), plain));
  CHECK(at::equal(at::rand({1}), next_plain));
}

TEST_CASE("gpt: 30 Adam steps on a fixed fortunes batch lower the loss clearly", "[examples][gpt]") {
  Gpt model(GptConfig{}, 1234);
  Batch b = corpus().sample(8, 64, 0, 1234);
  Adam adam(model.parameters(), 3e-3);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    at::Tensor loss = model.loss(b.inputs, b.targets);
    loss.backward();
    adam.step(model.parameters());
    (step == 0 ? first : last) = loss.item<double>();
  }
  INFO("loss " << first << " -> " << last);
  CHECK(first > 5.0);
  CHECK(last < first - 1.5);  // 5.56 -> ~3.3: the byte unigram statistics at least
}

TEST_CASE("gpt: parameters re-pointed into one flat buffer (set_) are used", "[examples][gpt]") {
  Gpt model(GptConfig{}, 11);
  Batch b = corpus().sample(2, 32, 0, 1);
  at::Tensor before = model.loss(b.inputs, b.targets);
  before.backward();
  std::vector<at::Tensor> grads_before;
  for (auto& p : model.parameters()) {
    grads_before.push_back(p.grad().clone());
    p.mutable_grad() = at::Tensor();
  }

  at::Tensor flat = at::empty({model.num_parameters()}, at::kFloat);
  {
    at::NoGradGuard no_grad;
    int64_t offset = 0;
    for (auto& p : model.parameters()) {
      at::Tensor view = flat.narrow(0, offset, p.numel()).view(p.sizes());
      view.copy_(p);
      p.set_(flat.storage(), offset, p.sizes(), p.strides());
      offset += p.numel();
    }
  }
  at::Tensor after = model.loss(b.inputs, b.targets);
  CHECK(after.item<double>() == Approx(before.item<double>()).epsilon(1e-6));
  after.backward();
  for (size_t i = 0; i < grads_before.size(); ++i) CHECK(at::allclose(model.parameters()[i].grad(), grads_before[i], 1e-4, 1e-6));

  // A change written into the flat buffer shows in the next forward.
  { at::NoGradGuard no_grad; flat.zero_(); }
  at::Tensor zeroed = model.loss(b.inputs, b.targets);
  CHECK(zeroed.item<double>() == Approx(std::log(256.0)).margin(1e-4));  // all-zero weights: uniform logits
}

TEST_CASE("gpt: bf16 parameters swapped into parameters() compute in bf16 loss in fp32", "[examples][gpt]") {
  Gpt model(GptConfig{}, 1234);
  Batch b = corpus().sample(4, 64, 0, 1234);
  const double fp32_loss = model.loss(b.inputs, b.targets).item<double>();
  for (auto& p : model.parameters()) {
    at::Tensor half = p.detach().to(at::kBFloat16);
    half.set_requires_grad(true);
    p = half;
  }
  CHECK(model.forward(b.inputs).scalar_type() == at::kBFloat16);
  at::Tensor loss = model.loss(b.inputs, b.targets);
  CHECK(loss.scalar_type() == at::kFloat);
  CHECK(loss.item<double>() == Approx(fp32_loss).margin(0.05));
  loss.backward();
  for (const auto& p : model.parameters()) {
    REQUIRE(p.grad().defined());
    CHECK(p.grad().scalar_type() == at::kBFloat16);
  }
}

TEST_CASE("gpt: the engine's re-pointing (set_data into one bf16 flat buffer) is seen through param_groups", "[examples][gpt]") {
  Gpt model(GptConfig{}, 1234);
  Batch b = corpus().sample(4, 64, 0, 1234);
  const double fp32_loss = model.loss(b.inputs, b.targets).item<double>();
  // What the engine does: the tensors of the model description become views of its buffer.
  ModelDescription groups = model.param_groups(0.1);
  at::Tensor flat = at::empty({model.num_parameters()}, at::kBFloat16);
  int64_t offset = 0;
  for (auto& g : groups.groups)
    for (auto& p : g.params) {
      at::Tensor view = flat.narrow(0, offset, p.numel()).view(p.sizes());
      view.copy_(p.detach());
      p.set_data(view);
      offset += p.numel();
    }
  for (const auto& p : model.parameters()) CHECK(p.scalar_type() == at::kBFloat16);
  at::Tensor loss = model.loss(b.inputs, b.targets);
  CHECK(loss.scalar_type() == at::kFloat);
  CHECK(loss.item<double>() == Approx(fp32_loss).margin(0.05));
  loss.backward();
  for (const auto& p : model.parameters()) REQUIRE(p.grad().defined());
}

// ---------------------------------------------------------------------------------------------
// CNN

TEST_CASE("cnn: shapes parameter count groups", "[examples][cnn]") {
  Cnn model(CnnConfig{}, 1234);
  CHECK(model.num_parameters() == 320 + 18496 + 401536 + 1290);
  REQUIRE(model.parameter_names().size() == model.parameters().size());
  ModelDescription groups = model.param_groups(0.05);
  REQUIRE(groups.groups.size() == 2);
  CHECK(count(groups) == model.num_parameters());
  CHECK(groups.groups[0].params.size() == 4);
  CHECK(groups.groups[1].params.size() == 4);
  ImageBatch b = fashion().sample(4, 0, 1);
  CHECK(model.forward(b.images).sizes() == at::IntArrayRef({4, 10}));
  CHECK(model.loss(b.images, b.labels).item<double>() == Approx(std::log(10.0)).margin(0.3));
  CHECK_THROWS_AS(model.forward(at::empty({2, 3, 28, 28})), std::invalid_argument);
}

TEST_CASE("cnn: 30 Adam steps on a fixed Fashion-MNIST batch lower the loss clearly", "[examples][cnn]") {
  Cnn model(CnnConfig{}, 1234);
  ImageBatch b = fashion().sample(64, 0, 1234);
  Adam adam(model.parameters(), 1e-3);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    at::Tensor loss = model.loss(b.images, b.labels);
    loss.backward();
    adam.step(model.parameters());
    (step == 0 ? first : last) = loss.item<double>();
  }
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.3 * first);
  at::NoGradGuard no_grad;
  CHECK(Cnn::correct(model.forward(b.images), b.labels) >= 56);  // >= 7/8 of the batch
}

TEST_CASE("cnn: bf16 parameters", "[examples][cnn]") {
  Cnn model(CnnConfig{}, 1234);
  for (auto& p : model.parameters()) {
    at::Tensor half = p.detach().to(at::kBFloat16);
    half.set_requires_grad(true);
    p = half;
  }
  ImageBatch b = fashion().sample(8, 0, 1);
  CHECK(model.forward(b.images).scalar_type() == at::kBFloat16);
  at::Tensor loss = model.loss(b.images, b.labels);
  CHECK(loss.scalar_type() == at::kFloat);
  loss.backward();
  CHECK(model.parameters()[0].grad().scalar_type() == at::kBFloat16);
}
