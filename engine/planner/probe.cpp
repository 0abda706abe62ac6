#include "engine/planner/probe.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <optional>
#include <memory>
#include <functional>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/split.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "parallel/c10d_compat.h"
#include "parallel/communicator.h"

namespace tessera::planner {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs `body` once cold, then `reps` times; the fastest, on one thread.
template <class F>
double best_of(int reps, F body) {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  body();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    best = std::min(best, seconds_since(t0));
  }
  at::set_num_threads(threads);
  return best;
}

// A weight for timing: its values do not matter to the time, so a constant (cheap to fill: the
// probe builds each layer anew every round).
at::Tensor weight(int64_t rows, int64_t cols, at::ScalarType dtype) {
  return at::full({rows, cols}, 0.02, at::TensorOptions().dtype(dtype)).requires_grad_(true);
}

}  // namespace

std::string LayerShape::key() const {
  return std::to_string(micro) + "x" + std::to_string(tokens) + "/" + std::to_string(seq_len) + " h" +
         std::to_string(hidden) + " heads" + std::to_string(heads) + "/" + std::to_string(kv_heads) + " ffn" +
         std::to_string(ffn) + " in" + std::to_string(linear_in) + " out" + std::to_string(linear_out) +
         (swiglu ? " swiglu" : "") + (rmsnorm ? " rms" : "");
}

namespace {

// One forward and backward of the layer at `s`; the returned function holds its tensors.
std::function<void()> layer_body(const LayerShape& s, at::ScalarType dtype) {
  struct Tensors {
    at::Tensor w_qkv, w_o, w_in, w_out, gamma, beta, x;
  };
  const auto options = at::TensorOptions().dtype(dtype);
  const int64_t h = s.hidden;
  auto t = std::make_shared<Tensors>();
  t->w_qkv = weight(h, s.linear_in, dtype), t->w_o = weight(s.linear_out, h, dtype);
  t->w_in = weight(h, (s.swiglu ? 2 : 1) * s.ffn, dtype), t->w_out = weight(s.ffn, h, dtype);
  t->gamma = at::ones({h}, options).requires_grad_(true);
  t->beta = at::zeros({h}, options).requires_grad_(true);
  t->x = at::randn({s.micro, s.tokens, h}, options).requires_grad_(true);
  return [s, t] {
    const int64_t h = s.hidden, head_dim = s.linear_out / std::max<int64_t>(1, s.heads * (s.seq_len / s.tokens));
    auto norm = [&](const at::Tensor& u) {
      return s.rmsnorm ? at::rms_norm(u, {h}, t->gamma) : at::layer_norm(u, {h}, t->gamma, t->beta);
    };
    const int64_t q_cols = s.linear_out, kv_cols = (s.linear_in - s.linear_out) / 2;
    const at::Tensor qkv = at::matmul(norm(t->x), t->w_qkv);
    auto parts = qkv.split_with_sizes({q_cols, kv_cols, kv_cols}, -1);
    // After Ulysses's all-to-all a rank holds heads / cp heads of the whole sequence: the same
    // elements, regrouped (what the probe times is the attention over seq_len keys).
    auto heads_of = [&](const at::Tensor& u, int64_t n) { return u.reshape({s.micro, n, s.seq_len, head_dim}); };
    at::Tensor q = heads_of(parts[0], s.heads), k = heads_of(parts[1], s.kv_heads), v = heads_of(parts[2], s.kv_heads);
    if (s.kv_heads != s.heads) {
      k = k.repeat_interleave(s.heads / s.kv_heads, 1);
      v = v.repeat_interleave(s.heads / s.kv_heads, 1);
    }
    const at::Tensor attention = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    const at::Tensor y = t->x + at::matmul(attention.reshape({s.micro, s.tokens, q_cols}), t->w_o);
    at::Tensor inner = at::matmul(norm(y), t->w_in);
    if (s.swiglu) {
      auto gate_up = inner.chunk(2, -1);
      inner = at::silu(gate_up[0]) * gate_up[1];
    } else {
      inner = at::gelu(inner);
    }
    const at::Tensor out = y + at::matmul(inner, t->w_out);
    out.backward(at::ones_like(out));
    for (const at::Tensor& u : {t->x, t->w_qkv, t->w_o, t->w_in, t->w_out, t->gamma, t->beta}) u.mutable_grad().reset();
  };
}

// The first `cores` of this machine's cores, or none when it has no more than that.
std::optional<cpu_set_t> node_cores(int cores) {
  if (cores <= 0 || cores >= int(std::thread::hardware_concurrency())) return std::nullopt;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c = 0; c < cores; ++c) CPU_SET(c, &set);
  return set;
}

}  // namespace

namespace {

// One round: `together` threads each run the layer once, released together; seconds from the
// release to the last one done (a thread timed alone after the others finished would flatter).
double round_of(const LayerShape& shape, at::ScalarType dtype, int together, const std::optional<cpu_set_t>& pin) {
  std::vector<std::function<void()>> bodies;
  for (int t = 0; t < together; ++t) bodies.push_back(layer_body(shape, dtype));
  using Clock = std::chrono::steady_clock;
  std::atomic<int> ready{0};
  std::vector<Clock::time_point> start(together), end(together);
  std::vector<std::exception_ptr> errors(together);
  std::vector<std::thread> threads;
  for (int t = 0; t < together; ++t)
    threads.emplace_back([&, t] {
      if (pin) pthread_setaffinity_np(pthread_self(), sizeof *pin, &*pin);
      ready.fetch_add(1);
      while (ready.load() < together) std::this_thread::yield();
      start[t] = Clock::now();
      try {
        bodies[t]();
      } catch (...) {
        errors[t] = std::current_exception();
      }
      end[t] = Clock::now();
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return std::chrono::duration<double>(*std::max_element(end.begin(), end.end()) -
                                       *std::min_element(start.begin(), start.end())).count();
}

}  // namespace

std::vector<double> time_layers(const std::vector<LayerShape>& shapes, at::ScalarType dtype, int together, int cores) {
  together = std::max(1, together);
  const std::optional<cpu_set_t> pin = node_cores(cores);
  const int threads_before = at::get_num_threads();
  at::set_num_threads(1);
  // Five passes over every shape, each shape one round a pass, then the median of its five: a
  // machine whose speed drifts (a VM's neighbours) moves every shape alike, and ranks sharing
  // cores are timed as they run for a whole step, not at their luckiest round.
  constexpr int kPasses = 5;
  std::vector<std::vector<double>> rounds(shapes.size());
  for (int pass = 0; pass < kPasses; ++pass)
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (pass == 0) round_of(shapes[i], dtype, together, pin);  // cold
      rounds[i].push_back(round_of(shapes[i], dtype, together, pin));
    }
  at::set_num_threads(threads_before);
  std::vector<double> seconds;
  for (auto& r : rounds) {
    std::sort(r.begin(), r.end());
    seconds.push_back(r[kPasses / 2]);
  }
  return seconds;
}

double time_linear(int64_t rows, int64_t k, int64_t n, at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype);
  const at::Tensor x = at::randn({rows, k}, options), w = at::randn({k, n}, options), g = at::randn({rows, n}, options);
  const double flops = 6.0 * rows * k * n;
  return best_of(flops > 2e10 ? 1 : 3, [&] {
    at::matmul(x, w);
    at::matmul(g, w.t());
    at::matmul(x.t(), g);
  });
}

double time_copy_gbps() {
  const size_t bytes = size_t(256) << 20;
  std::vector<char> from(bytes, 1), to(bytes, 0);
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(to.data(), from.data(), bytes);
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * double(bytes) / best / 1e9;
}

LinkProbe time_link(Communicator& comm, int64_t bytes) {
  const int ranks = comm.size();
  LinkProbe mine;
  const int64_t n = bytes / 4 / ranks * ranks;
  at::Tensor full = at::ones({n}), part = at::empty({n / ranks}), one = at::ones({1});
  comm.all_reduce(one);  // connections up
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) comm.all_reduce(one);
  mine.latency_us = seconds_since(t0) / 10 * 1e6;
  // The best of three, each collective started together (a barrier) as the engine's are.
  auto best_of_three = [&](auto&& collective) {
    double best = 1e30;
    for (int i = 0; i < 3; ++i) {
      comm.barrier();
      const auto start = std::chrono::steady_clock::now();
      collective();
      best = std::min(best, seconds_since(start));
    }
    return best;
  };
  const double ring = double(ranks - 1) / ranks * double(n * 4);
  const double rs = best_of_three([&] { comm.reduce_scatter(full, part); });
  const double ag = best_of_three([&] { comm.all_gather(part, full); });
  const double ar = best_of_three([&] { comm.all_reduce(full); });
  const double pair = best_of_three([&] {
    comm.reduce_scatter(full, part);
    comm.all_gather(part, full);
  });
  mine.bus_gbps = 2 * ring / pair / 1e9;
  mine.reduce_scatter_gbps = ring / rs / 1e9;
  mine.all_gather_gbps = ring / ag / 1e9;
  mine.all_reduce_gbps = 2 * ring / ar / 1e9;
  return mine;
}

LinkProbe slowest_of(const std::vector<LinkProbe>& ranks) {
  LinkProbe slowest{1e30, 0, 1e30, 1e30, 1e30};
  for (const LinkProbe& r : ranks) {
    slowest.bus_gbps = std::min(slowest.bus_gbps, r.bus_gbps);
    slowest.latency_us = std::max(slowest.latency_us, r.latency_us);
    slowest.reduce_scatter_gbps = std::min(slowest.reduce_scatter_gbps, r.reduce_scatter_gbps);
    slowest.all_gather_gbps = std::min(slowest.all_gather_gbps, r.all_gather_gbps);
    slowest.all_reduce_gbps = std::min(slowest.all_reduce_gbps, r.all_reduce_gbps);
  }
  return slowest;
}

LinkProbe time_gloo(int ranks, int64_t bytes, int cores) {
  if (ranks < 2) return LinkProbe{};
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<LinkProbe> per_rank(ranks);
  std::vector<std::exception_ptr> errors(ranks);
  std::vector<int> members(ranks);
  for (int r = 0; r < ranks; ++r) members[r] = r;
  const std::optional<cpu_set_t> pin = node_cores(cores);  // as time_layer's
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      if (pin) pthread_setaffinity_np(pthread_self(), sizeof *pin, &*pin);
      try {
        auto backend = make_backend(BackendKind::Gloo, store, r, ranks, std::chrono::seconds(60));
        Communicator comm(backend, "planner probe", members, r, c10::Device(c10::kCPU),
                          has_native_reduce_scatter(BackendKind::Gloo));
        per_rank[r] = time_link(comm, bytes);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return slowest_of(per_rank);
}

}  // namespace tessera::planner
