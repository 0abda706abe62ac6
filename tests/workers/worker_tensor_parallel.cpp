// tessera_test_worker tensor-parallel --tp T: every tensor-parallel crossing and layer on T ranks
// against the single-process computation it stands for, forward and backward.
//
// Each rank builds the same whole tensors from one seed (inputs, weights, the upstream gradient),
// runs its part through the region or layer, and checks (a) its output against the whole result
// (or this rank's slice of it) and (b) the gradients autograd gives its inputs and its weight
// slices against the whole computation's gradients sliced the same way. The regions' backward
// collectives only show when the upstream gradient differs by rank, so rank-dependent upstream
// gradients are used where the region's backward reduces (f, SP's f): the sum over ranks is then
// what the whole computation's gradient is.
#include "tests/workers/worker_tensor_parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sum.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/parallel_context.h"
#include "parallel/tensor_parallel/cross_entropy.h"
#include "parallel/tensor_parallel/layers.h"
#include "parallel/tensor_parallel/regions.h"

using namespace tessera;

namespace {

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  if (got.sizes() != want.sizes())
    throw std::runtime_error(what + ": shape " + std::to_string(got.dim()) + "-d differs from the whole computation's");
  if (!at::allclose(got, want, 1e-5, 1e-5)) {
    const double diff = (got - want).abs().max().item<double>();
    throw std::runtime_error(what + ": differs from the whole computation by " + std::to_string(diff));
  }
}

at::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat));
}

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().set_requires_grad(true); }

// The gradient of sum(output * upstream) with respect to `inputs`.
std::vector<at::Tensor> grads(const at::Tensor& output, const at::Tensor& upstream, const std::vector<at::Tensor>& inputs) {
  return torch::autograd::grad({output}, inputs, {upstream});
}

// Each region: output and input gradient against the closed form, with a rank-dependent upstream
// gradient `up_r` (rank r's = up · (r + 1)), whose sum over ranks is up · T(T+1)/2.
void check_regions(Communicator& tp) {
  const int64_t r = tp.rank(), t = tp.size();
  const double sum_scale = t * (t + 1) / 2.0;
  const at::Tensor x = randn({2, 4 * t, 3}, 1), up = randn({2, 4 * t, 3}, 2);
  const at::Tensor up_r = up * static_cast<double>(r + 1);
  const int64_t dim = 1;
  {  // f: identity forward, all-reduce backward
    at::Tensor in = leaf(x);
    at::Tensor y = copy_to_tensor_region(in, tp);
    expect_close(y, x, "copy_to_tensor_region forward");
    expect_close(grads(y, up_r, {in})[0], up * sum_scale, "copy_to_tensor_region backward");
  }
  {  // g: all-reduce forward, identity backward
    at::Tensor in = leaf(x * static_cast<double>(r + 1));
    at::Tensor y = reduce_from_tensor_region(in, tp);
    expect_close(y, x * sum_scale, "reduce_from_tensor_region forward");
    expect_close(grads(y, up, {in})[0], up, "reduce_from_tensor_region backward");
  }
  const at::Tensor mine = tensor_parallel_slice(x, r, t, dim), up_mine = tensor_parallel_slice(up, r, t, dim);
  {  // SP's f: all-gather forward, reduce-scatter backward
    at::Tensor in = leaf(mine);
    at::Tensor y = gather_from_sequence_region(in, tp, dim);
    expect_close(y, x, "gather_from_sequence_region forward");
    expect_close(grads(y, up_r, {in})[0], up_mine * sum_scale, "gather_from_sequence_region backward");
  }
  {  // SP's g: reduce-scatter forward, all-gather backward
    at::Tensor in = leaf(x * static_cast<double>(r + 1));
    at::Tensor y = reduce_scatter_to_sequence_region(in, tp, dim);
    expect_close(y, mine * sum_scale, "reduce_scatter_to_sequence_region forward");
    expect_close(grads(y, up_mine, {in})[0], up, "reduce_scatter_to_sequence_region backward");
  }
  {  // into the SP region: keep own slice forward, all-gather backward
    at::Tensor in = leaf(x);
    at::Tensor y = scatter_to_sequence_region(in, tp, dim);
    expect_close(y, mine, "scatter_to_sequence_region forward");
    expect_close(grads(y, up_mine, {in})[0], up, "scatter_to_sequence_region backward");
  }
  {  // out of a split region: all-gather forward, keep own slice backward
    at::Tensor in = leaf(mine);
    at::Tensor y = gather_from_tensor_region(in, tp, dim);
    expect_close(y, x, "gather_from_tensor_region forward");
    expect_close(grads(y, up, {in})[0], up_mine, "gather_from_tensor_region backward");
  }
  expect_close(tensor_parallel_whole(mine, tp, dim), x, "tensor_parallel_whole");
}

// Megatron's MLP, Y = GeLU(X·Aᵀ + a)·Bᵀ + b with A split by rows of the weight (output features)
// and B by columns (input features), with and without sequence parallelism, against the whole MLP.
void check_mlp(Communicator& tp, bool sequence_parallel) {
  const int64_t r = tp.rank(), t = tp.size(), seq = 2 * t, hidden = 3, ffn = 4 * t;
  const std::string tag = sequence_parallel ? " (sequence parallel)" : "";
  const at::Tensor x = randn({2, seq, hidden}, 3), A = randn({ffn, hidden}, 4), a = randn({ffn}, 5),
                   B = randn({hidden, ffn}, 6), b = randn({hidden}, 7), up = randn({2, seq, hidden}, 8);
  at::Tensor wx = leaf(x), wA = leaf(A), wa = leaf(a), wB = leaf(B), wb = leaf(b);
  at::Tensor whole = at::linear(at::gelu(at::linear(wx, wA, wa)), wB, wb);
  const std::vector<at::Tensor> g = grads(whole, up, {wx, wA, wa, wB, wb});

  TensorParallelStyle style;
  style.sequence_parallel = sequence_parallel;
  style.seq_dim = 1;
  at::Tensor px = leaf(sequence_parallel ? tensor_parallel_slice(x, r, t, 1) : x);
  at::Tensor pA = leaf(tensor_parallel_slice(A, r, t, 0)), pa = leaf(tensor_parallel_slice(a, r, t, 0));
  at::Tensor pB = leaf(tensor_parallel_slice(B, r, t, 1)), pb = leaf(b);
  at::Tensor y = row_parallel_linear(at::gelu(column_parallel_linear(px, pA, pa, tp, style)), pB, pb, tp, style);
  const at::Tensor want = sequence_parallel ? tensor_parallel_slice(whole.detach(), r, t, 1) : whole.detach();
  expect_close(y, want, "column + row parallel MLP forward" + tag);
  const at::Tensor up_mine = sequence_parallel ? tensor_parallel_slice(up, r, t, 1) : up;
  const std::vector<at::Tensor> pg = grads(y, up_mine, {px, pA, pa, pB, pb});
  expect_close(pg[0], sequence_parallel ? tensor_parallel_slice(g[0], r, t, 1) : g[0], "MLP input gradient" + tag);
  expect_close(pg[1], tensor_parallel_slice(g[1], r, t, 0), "column-parallel weight gradient" + tag);
  expect_close(pg[2], tensor_parallel_slice(g[2], r, t, 0), "column-parallel bias gradient" + tag);
  expect_close(pg[3], tensor_parallel_slice(g[3], r, t, 1), "row-parallel weight gradient" + tag);
  // The replicated bias: whole on every rank (under SP it meets 1/T of the sequence, and the layer
  // sums its gradient over the group), so the copies stay equal.
  expect_close(pg[4], g[4], "row-parallel bias gradient" + tag);
}

// The vocabulary split over ranks: the embedding's lookup and the cross entropy over split logits.
void check_vocab(Communicator& tp) {
  const int64_t r = tp.rank(), t = tp.size(), vocab = 5 * t, dim = 3;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor ids = at::randint(vocab, {2, 6}, gen, at::TensorOptions().dtype(at::kLong));
  const at::Tensor E = randn({vocab, dim}, 10), up = randn({2, 6, dim}, 11);
  at::Tensor wE = leaf(E);
  at::Tensor whole = at::embedding(wE, ids);
  const at::Tensor gE = grads(whole, up, {wE})[0];
  at::Tensor pE = leaf(tensor_parallel_slice(E, r, t, 0));
  at::Tensor y = vocab_parallel_embedding(ids, pE, r * (vocab / t), tp);
  expect_close(y, whole.detach(), "vocab_parallel_embedding forward");
  expect_close(grads(y, up, {pE})[0], tensor_parallel_slice(gE, r, t, 0), "vocab_parallel_embedding weight gradient");

  const at::Tensor logits = randn({12, vocab}, 12);
  at::Tensor targets = ids.reshape({-1}).clone();
  targets[3] = -100;  // an ignored position
  at::Tensor wl = leaf(logits);
  at::Tensor loss = at::cross_entropy_loss(wl, targets, {}, at::Reduction::Mean, -100);
  const at::Tensor gl = grads(loss, at::ones_like(loss), {wl})[0];
  at::Tensor pl = leaf(tensor_parallel_slice(logits, r, t, 1));
  at::Tensor ploss = vocab_parallel_cross_entropy(pl, targets, tp);
  expect_close(ploss, loss.detach(), "vocab_parallel_cross_entropy forward");
  expect_close(grads(ploss, at::ones_like(ploss), {pl})[0], tensor_parallel_slice(gl, r, t, 1),
               "vocab_parallel_cross_entropy gradient");
}

}  // namespace

void check_tensor_parallel(ParallelContext& ctx) {
  Communicator& tp = ctx.tensor();
  check_regions(tp);
  check_mlp(tp, false);
  check_mlp(tp, true);
  check_vocab(tp);
  std::printf("tensor parallel ok on rank %d of %d\n", tp.rank(), tp.size());
}
