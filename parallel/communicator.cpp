#include "parallel/communicator.h"

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>

#include <ATen/ops/amax.h>
#include <ATen/ops/amin.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "parallel/c10d_compat.h"

namespace tessera {

CommHandle::CommHandle() = default;
CommHandle::CommHandle(CommHandle&&) noexcept = default;
CommHandle& CommHandle::operator=(CommHandle&&) noexcept = default;
CommHandle::~CommHandle() = default;

ChunkRange chunk_range(int64_t n, int p, int r) {
  int64_t base = n / p, extra = n % p;
  int64_t begin = r * base + std::min<int64_t>(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

// ---- CommHandle ------------------------------------------------------------------------------

CommHandle::CommHandle(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish, std::string what,
                       CollectiveStats* stats, CollectiveStats* sized)
    : finish_(std::move(finish)),
      what_(std::move(what)),
      stats_(stats),
      sized_(sized),
      started_(std::chrono::steady_clock::now()) {
  if (work) works_.push_back(std::move(work));
}

CommHandle::CommHandle(std::vector<c10::intrusive_ptr<c10d::Work>> works, std::function<void()> finish,
                       std::string what, CollectiveStats* stats, CollectiveStats* sized,
                       std::chrono::milliseconds timeout)
    : works_(std::move(works)),
      timeout_(timeout),
      finish_(std::move(finish)),
      what_(std::move(what)),
      stats_(stats),
      sized_(sized),
      started_(std::chrono::steady_clock::now()) {}

void CommHandle::wait() {
  if (works_.empty()) return;
  const auto entered = std::chrono::steady_clock::now();
  auto works = std::move(works_);
  works_.clear();
  try {
    for (auto& work : works) {
      if (timeout_) work->wait(*timeout_);
      else work->wait();
    }
  } catch (const std::exception& e) {
    throw CommError(what_ + " failed: " + message_of(e) +
                    "\n(a rank in this group exited or stopped calling collectives, or the timeout "
                    "TESSERA_TIMEOUT_S passed)");
  }
  if (finish_) finish_();
  const auto now = std::chrono::steady_clock::now();
  for (CollectiveStats* s : {stats_, sized_})
    if (s) {
      s->seconds += std::chrono::duration<double>(now - started_).count();
      s->blocked_seconds += std::chrono::duration<double>(now - entered).count();
    }
}

void CommHandle::then(std::function<void()> next) {
  if (works_.empty()) {
    next();
    return;
  }
  if (!finish_) finish_ = std::move(next);
  else finish_ = [first = std::move(finish_), next = std::move(next)]() { first(); next(); };
}

// ---- Communicator ----------------------------------------------------------------------------

namespace {

// Host staging (CommunicatorOptions::stage_cuda_through_host): pinned buffers, so the copy back to
// the device is asynchronous on the current stream and the caching host allocator keeps the
// buffer until that copy has run.
at::Tensor host_empty(const at::Tensor& like) {
  return at::empty(like.sizes(), like.options().device(at::kCPU).pinned_memory(true));
}
at::Tensor host_copy(const at::Tensor& t) { return host_empty(t).copy_(t); }  // waits for the device
std::function<void()> copy_back(at::Tensor device, at::Tensor host) {
  return [device, host]() mutable { device.copy_(host, /*non_blocking=*/true); };
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case ReduceOp::Min: return c10d::ReduceOp(c10d::ReduceOp::MIN);
    default: return c10d::ReduceOp(c10d::ReduceOp::SUM);  // Avg = Sum, then a local division
  }
}

}  // namespace

Communicator::Communicator(c10::intrusive_ptr<c10d::Backend> backend, std::string name, std::vector<int> ranks,
                           int rank, c10::Device device, bool native_reduce_scatter, CommunicatorOptions options)
    : backend_(std::move(backend)),
      name_(std::move(name)),
      ranks_(std::move(ranks)),
      rank_(rank),
      device_(device),
      options_(options),
      native_reduce_scatter_(native_reduce_scatter) {
  // Named once: every collective's error message and label reuse it.
  std::string list;
  for (size_t i = 0; i < ranks_.size() && i < 16; ++i) list += (i ? ", " : "") + std::to_string(ranks_[i]);
  if (ranks_.size() > 16) list += ", ...";
  description_ = "group '" + name_ + "' (" + std::to_string(ranks_.size()) + " ranks: global " + list + ")";
}

Communicator::~Communicator() = default;

at::TensorOptions Communicator::options(at::ScalarType dtype) const {
  return at::TensorOptions().dtype(dtype).device(device_);
}

void Communicator::check_tensor(const at::Tensor& t, const char* collective) const {
  if (!t.defined() || !t.is_contiguous())
    throw std::invalid_argument(std::string("tessera: ") + collective + " on " + describe() +
                                " needs a defined, contiguous tensor");
  if (t.device() != device_ && !(options_.stage_cuda_through_host && (t.is_cpu() || t.is_cuda())))
    throw std::invalid_argument(std::string("tessera: ") + collective + " on " + describe() + " got a tensor on " +
                                t.device().str() + "; this group's collectives take tensors on " + device_.str());
}

std::string Communicator::label(const char* collective, const at::Tensor& t) const {
  return std::string(collective) + " of " + std::to_string(t.numel()) + " " + std::string(t.dtype().name()) +
         " elements on " + describe();
}

CommHandle Communicator::issue(const char* collective, int64_t bytes, int64_t sent, const std::string& what,
                               const std::function<c10::intrusive_ptr<c10d::Work>()>& start,
                               std::function<void()> finish) {
  // TESSERA_TRACE_COMM=1: every collective as it is issued, on stderr (finds a mismatch between ranks).
  static const bool trace = std::getenv("TESSERA_TRACE_COMM") != nullptr;
  if (trace) std::fprintf(stderr, "[comm %s] %s\n", name_.c_str(), what.c_str());
  CollectiveStats& entry = stats_[collective];
  CollectiveStats& sized = stats_by_size_[{collective, bytes}];
  for (CollectiveStats* s : {&entry, &sized}) {
    ++s->calls;
    s->bytes += bytes;
    s->sent_bytes += sent;
  }
  try {
    return CommHandle(start(), std::move(finish), what, &entry, &sized);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(what + " failed to start: " + message_of(e));
  }
}

CommHandle Communicator::all_reduce_async(at::Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "all_reduce");
  if (staged(tensor)) {
    at::Tensor host = host_copy(tensor);
    CommHandle handle = all_reduce_async(host, op);
    handle.then(copy_back(tensor, host));
    return handle;
  }
  std::function<void()> finish;
  if (op == ReduceOp::Avg) finish = [tensor, p = size()]() mutable { tensor.div_(p); };
  return issue("all_reduce", tensor.nbytes(), 2 * (size() - 1) * tensor.nbytes() / size(), label("all_reduce", tensor), [&] {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    return backend_->allreduce(tensors, o);
  }, std::move(finish));
}

CommunicatorOptions with_backend_defaults(CommunicatorOptions options, bool gloo) {
  if (options.alltoall_reduce_scatter_max_bytes < 0)
    options.alltoall_reduce_scatter_max_bytes = gloo ? std::numeric_limits<int64_t>::max() : 0;
  if (options.pairwise_all_gather < 0) options.pairwise_all_gather = gloo ? 1 : 0;
  if (options.pairwise_reduce_scatter < 0) options.pairwise_reduce_scatter = gloo ? 1 : 0;
  return options;
}

CommHandle Communicator::reduce_scatter_async(const at::Tensor& input, at::Tensor& output, ReduceOp op) {
  check_tensor(input, "reduce_scatter");
  check_tensor(output, "reduce_scatter");
  if (staged(input) || staged(output)) {
    at::Tensor in = host_copy(input), out = host_empty(output);
    CommHandle handle = reduce_scatter_async(in, out, op);
    handle.then(copy_back(output, out));
    return handle;
  }
  const int64_t n = input.numel();
  TORCH_CHECK(output.numel() == chunk_range(n, size(), rank_).size(), "tessera: reduce_scatter output has ",
              output.numel(), " elements, this rank's chunk of ", n, " has ", chunk_range(n, size(), rank_).size());
  const bool even = n % size() == 0;
  if (!even || !native_reduce_scatter_ || op == ReduceOp::Min ||
      int64_t(input.nbytes()) <= options_.alltoall_reduce_scatter_max_bytes)
    return options_.pairwise_reduce_scatter > 0 ? reduce_scatter_pairwise(input, output, op)
                                                : reduce_scatter_by_alltoall(input, output, op);
  std::function<void()> finish;
  if (op == ReduceOp::Avg) finish = [output, p = size()]() mutable { output.div_(p); };
  ++native_reduce_scatters_;
  return issue("reduce_scatter", input.nbytes(), input.nbytes() - output.nbytes(), label("reduce_scatter", input), [&] {
    at::Tensor in = input.view({-1}), out = output.view({-1});
    c10d::ReduceScatterOptions o;
    o.reduceOp = to_c10d(op);
    return backend_->_reduce_scatter_base(out, in, o);
  }, std::move(finish));
}

namespace {
// The reduce-scatters that gather every rank's contribution into rows: row r of `received` is rank
// r's contribution to this rank's chunk; the result is their sum (or max, min, mean) into `output`.
std::function<void()> sum_rows(at::Tensor received, at::Tensor output, ReduceOp op, int p) {
  return [received, output, op, p]() mutable {
    const int64_t mine = output.numel();
    at::Tensor rows = received.view({p, mine});
    at::Tensor out = output.view({mine});
    if (op == ReduceOp::Max) at::amax_out(out, rows, {0});
    else if (op == ReduceOp::Min) at::amin_out(out, rows, {0});
    else at::sum_out(out, rows, {0});
    if (op == ReduceOp::Avg) out.div_(p);
  };
}
}  // namespace

int Communicator::next_pairwise_tag() {
  const int tag = kPairwiseTagBase + pairwise_tag_;
  pairwise_tag_ = (pairwise_tag_ + 1) % kPairwiseTagBase;
  return tag;
}

CommHandle Communicator::exchange_pairwise(const std::string& op, const std::string& what, int64_t bytes,
                                           int64_t sent_bytes, const std::function<at::Tensor(int from)>& receive_into,
                                           const std::function<at::Tensor(int to)>& send_from,
                                           std::function<void()> finish) {
  const int p = size();
  const int tag = next_pairwise_tag();
  CollectiveStats& entry = stats_[op];
  CollectiveStats& sized = stats_by_size_[{op, bytes}];
  for (CollectiveStats* s : {&entry, &sized}) {
    ++s->calls;
    s->bytes += bytes;
    s->sent_bytes += sent_bytes;
  }
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  try {
    for (int k = 1; k < p; ++k) {
      const int from = (rank_ - k + p) % p, to = (rank_ + k) % p;
      std::vector<at::Tensor> into{receive_into(from)}, out_of{send_from(to)};
      if (into[0].numel() > 0) works.push_back(backend_->recv(into, from, tag));
      if (out_of[0].numel() > 0) works.push_back(backend_->send(out_of, to, tag));
    }
  } catch (const std::exception& e) {
    throw CommError(what + " failed to start: " + message_of(e));
  }
  if (works.empty()) {  // one rank (or nothing to exchange): a handle with no work never finishes
    if (finish) finish();
    return CommHandle();
  }
  return CommHandle(std::move(works), std::move(finish), what, &entry, &sized, options_.timeout);
}

CommHandle Communicator::reduce_scatter_pairwise(const at::Tensor& input, at::Tensor& output, ReduceOp op) {
  const int p = size();
  const int64_t n = input.numel(), mine = output.numel();
  at::Tensor in = input.view({-1});
  // Row k − 1: the contribution of the rank k behind this one. This rank's own chunk stays in
  // `input` (where `output` may be: in place) and joins them in the finish.
  at::Tensor received = at::empty({(p - 1) * mine}, input.options());
  const at::Tensor own = in.narrow(0, chunk_range(n, p, rank_).begin, mine);
  ++pairwise_reduce_scatters_;
  auto finish = [received, own, output, op, p]() mutable {
    at::Tensor out = output.view({-1});
    if (out.data_ptr() != own.data_ptr()) out.copy_(own);
    for (int k = 1; k < p; ++k) {
      const at::Tensor row = received.narrow(0, (k - 1) * out.numel(), out.numel());
      if (op == ReduceOp::Max) at::maximum_out(out, out, row);
      else if (op == ReduceOp::Min) at::minimum_out(out, out, row);
      else out.add_(row);
    }
    if (op == ReduceOp::Avg) out.div_(p);
  };
  return exchange_pairwise(
      "reduce_scatter", label("reduce_scatter (pairwise)", input), input.nbytes(), input.nbytes() - output.nbytes(),
      [&](int from) { return received.narrow(0, ((rank_ - from + p) % p - 1) * mine, mine); },
      [&](int to) {
        const ChunkRange theirs = chunk_range(n, p, to);
        return in.narrow(0, theirs.begin, theirs.size());
      },
      std::move(finish));
}

CommHandle Communicator::reduce_scatter_by_alltoall(const at::Tensor& input, at::Tensor& output, ReduceOp op) {
  const int p = size();
  const int64_t n = input.numel(), mine = output.numel();
  std::vector<int64_t> send_counts(p), recv_counts(p, mine);
  for (int r = 0; r < p; ++r) send_counts[r] = chunk_range(n, p, r).size();
  at::Tensor received = at::empty({p * mine}, input.options());
  ++alltoall_reduce_scatters_;
  auto finish = sum_rows(received, output, op, p);
  return issue("reduce_scatter", input.nbytes(), input.nbytes() - output.nbytes(), label("reduce_scatter (all-to-all)", input), [&] {
    at::Tensor in = input.view({-1});
    return backend_->alltoall_base(received, in, recv_counts, send_counts);
  }, std::move(finish));
}

CommHandle Communicator::all_gather_async(const at::Tensor& input, at::Tensor& output) {
  check_tensor(input, "all_gather");
  check_tensor(output, "all_gather");
  if (staged(input) || staged(output)) {
    at::Tensor in = host_copy(input), out = host_empty(output);
    CommHandle handle = all_gather_async(in, out);
    handle.then(copy_back(output, out));
    return handle;
  }
  const int p = size();
  const int64_t n = output.numel();
  TORCH_CHECK(input.numel() == chunk_range(n, p, rank_).size(), "tessera: all_gather input has ", input.numel(),
              " elements, this rank's chunk of ", n, " has ", chunk_range(n, p, rank_).size());
  if (options_.pairwise_all_gather > 0) return all_gather_pairwise(input, output);
  if (n % p == 0) {
    return issue("all_gather", output.nbytes(), (p - 1) * input.nbytes(), label("all_gather", output), [&] {
      at::Tensor in = input.view({-1}), out = output.view({-1});
      return backend_->_allgather_base(out, in);
    });
  }
  // Uneven chunks differ by at most one element: gather padded rows, then copy the valid parts.
  const int64_t row = chunk_range(n, p, 0).size();
  at::Tensor padded_in = at::zeros({row}, input.options());
  padded_in.narrow(0, 0, input.numel()).copy_(input.view({-1}));
  at::Tensor padded_out = at::empty({p * row}, output.options());
  auto finish = [padded_out, output, n, p, row]() mutable {
    at::Tensor out = output.view({-1});
    for (int r = 0; r < p; ++r) {
      ChunkRange c = chunk_range(n, p, r);
      out.narrow(0, c.begin, c.size()).copy_(padded_out.narrow(0, r * row, c.size()));
    }
  };
  return issue("all_gather", output.nbytes(), (p - 1) * input.nbytes(), label("all_gather", output), [&] { return backend_->_allgather_base(padded_out, padded_in); },
               std::move(finish));
}

CommHandle Communicator::all_gather_pairwise(const at::Tensor& input, at::Tensor& output) {
  const int p = size();
  const int64_t n = output.numel();
  at::Tensor out = output.view({-1});
  const ChunkRange mine = chunk_range(n, p, rank_);
  at::Tensor own = out.narrow(0, mine.begin, mine.size());
  if (own.data_ptr() != input.data_ptr()) own.copy_(input.view({-1}));  // not in place
  return exchange_pairwise(
      "all_gather", label("all_gather", output), output.nbytes(), (p - 1) * input.nbytes(),
      [&](int from) {
        const ChunkRange theirs = chunk_range(n, p, from);
        return out.narrow(0, theirs.begin, theirs.size());
      },
      [&](int) { return own; }, {});
}

CommHandle Communicator::broadcast_async(at::Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast");
  if (staged(tensor)) {
    at::Tensor host = host_copy(tensor);
    CommHandle handle = broadcast_async(host, root);
    handle.then(copy_back(tensor, host));
    return handle;
  }
  return issue("broadcast", tensor.nbytes(), root == rank_ ? tensor.nbytes() : 0, label("broadcast", tensor), [&] {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return backend_->broadcast(tensors, o);
  });
}

CommHandle Communicator::all_to_all_async(const at::Tensor& input, at::Tensor& output) {
  check_tensor(input, "all_to_all");
  check_tensor(output, "all_to_all");
  TORCH_CHECK(input.numel() == output.numel() && input.numel() % size() == 0,
              "tessera: all_to_all needs input and output of the same size, divisible by the group size");
  if (staged(input) || staged(output)) {
    at::Tensor in = host_copy(input), out = host_empty(output);
    CommHandle handle = all_to_all_async(in, out);
    handle.then(copy_back(output, out));
    return handle;
  }
  return issue("all_to_all", input.nbytes(), (size() - 1) * input.nbytes() / size(), label("all_to_all", input), [&] {
    at::Tensor in = input.view({-1}), out = output.view({-1});
    std::vector<int64_t> equal;  // empty split lists mean equal splits
    return backend_->alltoall_base(out, in, equal, equal);
  });
}

CommHandle Communicator::all_to_all_async(const at::Tensor& input, at::Tensor& output,
                                          const std::vector<int64_t>& input_splits,
                                          const std::vector<int64_t>& output_splits) {
  check_tensor(input, "all_to_all");
  check_tensor(output, "all_to_all");
  const auto sum = [](const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t(0)); };
  TORCH_CHECK(static_cast<int>(input_splits.size()) == size() && static_cast<int>(output_splits.size()) == size(),
              "tessera: all_to_all on ", describe(), " needs one split per rank, got ", input_splits.size(), " and ",
              output_splits.size());
  TORCH_CHECK(sum(input_splits) == input.numel() && sum(output_splits) == output.numel(), "tessera: all_to_all on ",
              describe(), ": the splits (", sum(input_splits), " in, ", sum(output_splits),
              " out) do not add up to the tensors (", input.numel(), ", ", output.numel(), ")");
  if (staged(input) || staged(output)) {
    at::Tensor in = host_copy(input), out = host_empty(output);
    CommHandle handle = all_to_all_async(in, out, input_splits, output_splits);
    handle.then(copy_back(output, out));
    return handle;
  }
  const int64_t own = input_splits[rank()] * static_cast<int64_t>(input.element_size());
  return issue("all_to_all", input.nbytes(), static_cast<int64_t>(input.nbytes()) - own, label("all_to_all", input), [&] {
    at::Tensor in = input.view({-1}), out = output.view({-1});
    std::vector<int64_t> in_splits = input_splits, out_splits = output_splits;
    return backend_->alltoall_base(out, in, out_splits, in_splits);
  });
}

void Communicator::all_to_all(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& input_splits,
                              const std::vector<int64_t>& output_splits) {
  all_to_all_async(input, output, input_splits, output_splits).wait();
}

CommHandle Communicator::send_async(at::Tensor& tensor, int peer, int tag) {
  check_tensor(tensor, "send");
  if (staged(tensor)) {
    at::Tensor host = host_copy(tensor);
    CommHandle handle = send_async(host, peer, tag);
    handle.then([host] {});  // keeps the host copy until the send is done
    return handle;
  }
  return issue("send", tensor.nbytes(), tensor.nbytes(), label("send", tensor) + " to group rank " + std::to_string(peer), [&] {
    std::vector<at::Tensor> tensors{tensor};
    return backend_->send(tensors, peer, tag);
  });
}

CommHandle Communicator::recv_async(at::Tensor& tensor, int peer, int tag) {
  check_tensor(tensor, "recv");
  if (staged(tensor)) {
    at::Tensor host = host_empty(tensor);
    CommHandle handle = recv_async(host, peer, tag);
    handle.then(copy_back(tensor, host));
    return handle;
  }
  return issue("recv", tensor.nbytes(), 0, label("recv", tensor) + " from group rank " + std::to_string(peer), [&] {
    std::vector<at::Tensor> tensors{tensor};
    return backend_->recv(tensors, peer, tag);
  });
}

CommHandle Communicator::barrier_async() {
  return issue("barrier", 0, 0, "barrier on " + describe(), [&] { return backend_->barrier(); });
}

void Communicator::all_reduce(at::Tensor& t, ReduceOp op) { all_reduce_async(t, op).wait(); }
void Communicator::reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) {
  reduce_scatter_async(in, out, op).wait();
}
void Communicator::all_gather(const at::Tensor& in, at::Tensor& out) { all_gather_async(in, out).wait(); }
void Communicator::broadcast(at::Tensor& t, int root) { broadcast_async(t, root).wait(); }
void Communicator::all_to_all(const at::Tensor& in, at::Tensor& out) { all_to_all_async(in, out).wait(); }
void Communicator::send(at::Tensor& t, int peer, int tag) { send_async(t, peer, tag).wait(); }
void Communicator::recv(at::Tensor& t, int peer, int tag) { recv_async(t, peer, tag).wait(); }
void Communicator::barrier() { barrier_async().wait(); }

}  // namespace tessera
