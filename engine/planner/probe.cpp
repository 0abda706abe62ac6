#include "engine/planner/probe.h"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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
#include <ATen/ops/mm.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
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

double time_copy_gbps(int threads) {
  threads = std::max(1, threads);
  // Each thread its own 256 MiB / threads, touched first (a page fault is not a copy).
  const size_t bytes = (size_t(256) << 20) / size_t(threads);
  std::vector<std::vector<char>> from(threads, std::vector<char>(bytes, 1)), to(threads, std::vector<char>(bytes, 0));
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    std::vector<std::thread> copiers;
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t)
      copiers.emplace_back([&, t] { std::memcpy(to[t].data(), from[t].data(), bytes); });
    for (auto& c : copiers) c.join();
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * double(bytes) * threads / best / 1e9;
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
  LinkProbe slowest{1e30, 0, 1e30, 1e30, 1e30, {}};
  for (const LinkProbe& r : ranks) {
    slowest.bus_gbps = std::min(slowest.bus_gbps, r.bus_gbps);
    slowest.latency_us = std::max(slowest.latency_us, r.latency_us);
    slowest.reduce_scatter_gbps = std::min(slowest.reduce_scatter_gbps, r.reduce_scatter_gbps);
    slowest.all_gather_gbps = std::min(slowest.all_gather_gbps, r.all_gather_gbps);
    slowest.all_reduce_gbps = std::min(slowest.all_reduce_gbps, r.all_reduce_gbps);
    for (const auto& [g, us] : r.synced_latency_us)
      slowest.synced_latency_us[g] = std::max(slowest.synced_latency_us[g], us);
  }
  return slowest;
}

namespace {

// What one forked rank of time_gloo sends back through its pipe: plain bytes, no allocation.
struct RankRecord {
  int ok = 0;
  double bus_gbps = 0, latency_us = 0, reduce_scatter_gbps = 0, all_gather_gbps = 0, all_reduce_gbps = 0;
  int groups = 0;
  int group_size[16] = {};
  double synced_latency_us[16] = {};
  char error[512] = {};
};

// The latency of a one-element allreduce among the `group`'s ranks issued between compute
// segments, as tensor parallelism issues them, while every other rank of the node computes too:
// what the loop with the collectives takes beyond the same loop without them, a call. Ranks that
// share cores reach each collective at different times (the kernel has not scheduled some of
// them), which an allreduce among idle ranks does not see: on the 2-core VM this probe measured
// 1.4-2.1 ms a call for 4 ranks and 0.8-1.6 ms for 2, and longer segments pay more (4 ms for
// 4 ranks between 15 ms products).
double synced_latency_us(Communicator& node, Communicator& group) {
  constexpr int kCalls = 40;
  // A segment of a few milliseconds on a shared core: a [512 x 768] by [768 x 768] product.
  const at::Tensor a = at::randn({512, 768}), b = at::randn({768, 768});
  at::Tensor one = at::ones({1});
  auto loop = [&](bool collective) {
    node.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) {
      at::mm(a, b);
      if (collective) group.all_reduce(one);
    }
    node.barrier();
    return seconds_since(t0);
  };
  loop(true);  // warm
  std::vector<double> extra;
  for (int round = 0; round < 3; ++round) {
    const double without = loop(false);
    extra.push_back(std::max(0.0, loop(true) - without) / kCalls * 1e6);
  }
  std::sort(extra.begin(), extra.end());
  return extra[1];
}

// One rank of time_gloo, in a forked process: the node's collectives over a file store, then the
// synced latency for every group size that divides the node's ranks.
RankRecord probe_rank(int rank, int ranks, int64_t bytes, const std::optional<cpu_set_t>& pin,
                      const std::string& store_path) {
  RankRecord record;
  try {
    if (pin) sched_setaffinity(0, sizeof *pin, &*pin);
    at::set_num_threads(1);
    auto store = c10::make_intrusive<c10d::FileStore>(store_path, ranks);
    std::vector<int> members(ranks);
    for (int r = 0; r < ranks; ++r) members[r] = r;
    const bool native = has_native_reduce_scatter(BackendKind::Gloo);
    // The algorithms the engine's groups run (a Communicator's own -1s would run Gloo's allgather
    // and its allreduce-based reduce-scatter instead: half the rate on the 2-core VM).
    const CommunicatorOptions engine_like = with_backend_defaults({}, /*gloo=*/true);
    Communicator node(make_backend(BackendKind::Gloo, store, rank, ranks, std::chrono::seconds(60)), "planner probe",
                      members, rank, c10::Device(c10::kCPU), native, engine_like);
    const LinkProbe link = time_link(node, bytes);
    record.bus_gbps = link.bus_gbps, record.latency_us = link.latency_us;
    record.reduce_scatter_gbps = link.reduce_scatter_gbps, record.all_gather_gbps = link.all_gather_gbps;
    record.all_reduce_gbps = link.all_reduce_gbps;
    for (int g = 2; g <= ranks && record.groups < 16; g *= 2) {
      if (ranks % g != 0) continue;
      const int first = rank / g * g;
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("group" + std::to_string(g) + "-" + std::to_string(first), store);
      Communicator group(make_backend(BackendKind::Gloo, prefixed, rank - first, g, std::chrono::seconds(60)),
                         "planner probe group",
                         std::vector<int>(members.begin() + first, members.begin() + first + g), rank - first,
                         c10::Device(c10::kCPU), native, engine_like);
      record.group_size[record.groups] = g;
      record.synced_latency_us[record.groups] = synced_latency_us(node, group);
      ++record.groups;
    }
    node.barrier();  // no rank leaves while another still talks to it
    record.ok = 1;
  } catch (const std::exception& e) {
    std::snprintf(record.error, sizeof record.error, "%s", e.what());
  }
  return record;
}

}  // namespace

LinkProbe time_gloo(int ranks, int64_t bytes, int cores) {
  if (ranks < 2) return LinkProbe{};
  const std::optional<cpu_set_t> pin = node_cores(cores);  // as time_layer's
  char dir[] = "/tmp/tessera-probe-XXXXXX";
  if (!mkdtemp(dir)) throw std::runtime_error(std::string("tessera plan --measure: mkdtemp: ") + std::strerror(errno));
  const std::string store_path = std::string(dir) + "/store";
  // The ranks are processes, as the launcher starts them (each its own allocator and address
  // space), each running the engine's algorithms (probe_rank).
  std::vector<pid_t> children;
  std::vector<int> pipes;
  for (int r = 0; r < ranks; ++r) {
    int fd[2];
    if (pipe(fd) != 0) break;
    const pid_t pid = fork();
    if (pid == 0) {
      close(fd[0]);
      const RankRecord record = probe_rank(r, ranks, bytes, pin, store_path);
      const char* p = reinterpret_cast<const char*>(&record);
      for (size_t left = sizeof record; left > 0;) {
        const ssize_t n = write(fd[1], p, left);
        if (n <= 0) break;
        p += n, left -= size_t(n);
      }
      _exit(record.ok ? 0 : 1);  // no atexit handlers or destructors of the parent's state
    }
    close(fd[1]);
    if (pid < 0) {
      close(fd[0]);
      break;
    }
    children.push_back(pid), pipes.push_back(fd[0]);
  }
  // Each rank's record, within a deadline (a rank that hangs is killed, not waited for forever).
  std::vector<RankRecord> records(children.size());
  std::string error = int(children.size()) < ranks ? "could not start " + std::to_string(ranks) + " processes" : "";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  for (size_t i = 0; i < children.size() && error.empty(); ++i) {
    char* p = reinterpret_cast<char*>(&records[i]);
    size_t left = sizeof(RankRecord);
    while (left > 0 && error.empty()) {
      const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd pfd{pipes[i], POLLIN, 0};
      if (remaining.count() <= 0 || poll(&pfd, 1, int(remaining.count())) <= 0) {
        error = "rank " + std::to_string(i) + " did not finish within 180 s";
        break;
      }
      const ssize_t n = read(pipes[i], p, left);
      if (n <= 0) error = "rank " + std::to_string(i) + " ended without its figures";
      else p += n, left -= size_t(n);
    }
  }
  for (pid_t pid : children) {
    if (!error.empty()) kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  for (int fd : pipes) close(fd);
  std::remove(store_path.c_str());
  rmdir(dir);
  if (error.empty())
    for (size_t i = 0; i < records.size(); ++i)
      if (!records[i].ok) error = "rank " + std::to_string(i) + ": " + records[i].error;
  if (!error.empty())
    throw std::runtime_error("tessera plan --measure: Gloo among " + std::to_string(ranks) + " processes: " + error);
  std::vector<LinkProbe> per_rank;
  for (const RankRecord& r : records) {
    LinkProbe l{r.bus_gbps, r.latency_us, r.reduce_scatter_gbps, r.all_gather_gbps, r.all_reduce_gbps, {}};
    for (int g = 0; g < r.groups; ++g) l.synced_latency_us[r.group_size[g]] = r.synced_latency_us[g];
    per_rank.push_back(l);
  }
  return slowest_of(per_rank);
}

}  // namespace tessera::planner
