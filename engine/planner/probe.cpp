#include "engine/planner/probe.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
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

at::Tensor weight(int64_t rows, int64_t cols, at::ScalarType dtype) {
  return (at::randn({rows, cols}, at::TensorOptions().dtype(dtype)) * 0.02).requires_grad_(true);
}

}  // namespace

std::string LayerShape::key() const {
  return std::to_string(micro) + "x" + std::to_string(tokens) + "/" + std::to_string(seq_len) + " h" +
         std::to_string(hidden) + " heads" + std::to_string(heads) + "/" + std::to_string(kv_heads) + " ffn" +
         std::to_string(ffn) + " in" + std::to_string(linear_in) + " out" + std::to_string(linear_out) +
         (swiglu ? " swiglu" : "") + (rmsnorm ? " rms" : "");
}

double time_layer(const LayerShape& s, at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype);
  const int64_t h = s.hidden, head_dim = s.linear_out / std::max<int64_t>(1, s.heads * (s.seq_len / s.tokens));
  const at::Tensor w_qkv = weight(h, s.linear_in, dtype), w_o = weight(s.linear_out, h, dtype);
  const at::Tensor w_in = weight(h, (s.swiglu ? 2 : 1) * s.ffn, dtype), w_out = weight(s.ffn, h, dtype);
  const at::Tensor gamma = at::ones({h}, options).requires_grad_(true);
  const at::Tensor beta = at::zeros({h}, options).requires_grad_(true);
  const at::Tensor x = at::randn({s.micro, s.tokens, h}, options).requires_grad_(true);
  auto norm = [&](const at::Tensor& t) {
    return s.rmsnorm ? at::rms_norm(t, {h}, gamma) : at::layer_norm(t, {h}, gamma, beta);
  };
  const int64_t q_cols = s.linear_out, kv_cols = (s.linear_in - s.linear_out) / 2;
  auto body = [&] {
    const at::Tensor qkv = at::matmul(norm(x), w_qkv);
    auto parts = qkv.split_with_sizes({q_cols, kv_cols, kv_cols}, -1);
    // After Ulysses's all-to-all a rank holds heads / cp heads of the whole sequence: the same
    // elements, regrouped (what the probe times is the attention over seq_len keys).
    auto heads_of = [&](const at::Tensor& t, int64_t n) {
      return t.reshape({s.micro, n, s.seq_len, head_dim});
    };
    at::Tensor q = heads_of(parts[0], s.heads), k = heads_of(parts[1], s.kv_heads), v = heads_of(parts[2], s.kv_heads);
    if (s.kv_heads != s.heads) {
      k = k.repeat_interleave(s.heads / s.kv_heads, 1);
      v = v.repeat_interleave(s.heads / s.kv_heads, 1);
    }
    const at::Tensor attention = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    const at::Tensor y = x + at::matmul(attention.reshape({s.micro, s.tokens, q_cols}), w_o);
    at::Tensor inner = at::matmul(norm(y), w_in);
    if (s.swiglu) {
      auto gate_up = inner.chunk(2, -1);
      inner = at::silu(gate_up[0]) * gate_up[1];
    } else {
      inner = at::gelu(inner);
    }
    const at::Tensor out = y + at::matmul(inner, w_out);
    out.backward(at::ones_like(out));
    for (const at::Tensor& t : {x, w_qkv, w_o, w_in, w_out, gamma, beta}) t.mutable_grad().reset();
  };
  const double flops = 6.0 * s.micro * s.tokens * h * (s.linear_in + s.linear_out + 3.0 * s.ffn);
  return best_of(flops > 2e10 ? 1 : 2, body);
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

LinkProbe time_gloo(int ranks, int64_t bytes) {
  LinkProbe probe;
  if (ranks < 2) return probe;
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<double> bus(ranks), latency(ranks);
  std::vector<std::exception_ptr> errors(ranks);
  std::vector<int> members(ranks);
  for (int r = 0; r < ranks; ++r) members[r] = r;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        auto backend = make_backend(BackendKind::Gloo, store, r, ranks, std::chrono::seconds(60));
        Communicator comm(backend, "planner probe", members, r, c10::Device(c10::kCPU),
                          has_native_reduce_scatter(BackendKind::Gloo));
        const int64_t n = bytes / 4 / ranks * ranks;
        at::Tensor full = at::ones({n}), part = at::empty({n / ranks}), one = at::ones({1});
        comm.all_reduce(one);  // connections up
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 10; ++i) comm.all_reduce(one);
        latency[r] = seconds_since(t0) / 10 * 1e6;
        double best = 1e30;
        for (int i = 0; i < 3; ++i) {
          comm.barrier();
          t0 = std::chrono::steady_clock::now();
          comm.reduce_scatter(full, part);
          comm.all_gather(part, full);
          best = std::min(best, seconds_since(t0));
        }
        bus[r] = 2.0 * (ranks - 1) / ranks * double(n * 4) / best / 1e9;
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  probe.bus_gbps = *std::min_element(bus.begin(), bus.end());
  probe.latency_us = *std::max_element(latency.begin(), latency.end());
  return probe;
}

}  // namespace tessera::planner
