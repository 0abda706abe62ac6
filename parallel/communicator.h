// Collectives on one process group, over flat tensors.
//
// Every collective comes in two forms: `x(...)` waits, `x_async(...)` returns a CommHandle to wait
// on later (to overlap communication with compute). A failure — a dead peer, a timeout — surfaces
// as CommError naming the collective, the group and its ranks, so no rank hangs silently.
//
// Flat slices: reduce_scatter and all_gather split a flat tensor of n elements across the group's
// p ranks in balanced chunks, chunk r = [r·n/p ...) with the first n mod p ranks one element longer
// (see chunk_range). Where the backend lacks a native reduce-scatter, the chunks are uneven or the
// input is small enough (CommunicatorOptions), the reduce-scatter runs as one all-to-all plus a local sum: each rank sends n − n_r and receives
// (p − 1)·n_r elements, exactly what a ring reduce-scatter moves, never an allreduce in disguise.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Backend;
class Work;
}  // namespace c10d

namespace tessera {

enum class ReduceOp { Sum, Avg, Max, Min };

class CommError : public std::runtime_error {
 public:
  explicit CommError(const std::string& what) : std::runtime_error(what) {}
};

// [begin, end) of rank r's chunk when n elements are split over p ranks.
struct ChunkRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
ChunkRange chunk_range(int64_t n, int p, int r);

// What one kind of collective moved on this group, as seen by this rank (Communicator::stats()).
//   calls    how many were issued
//   bytes    the size of each call's whole flat buffer, summed (the tensor of an all_reduce or
//            broadcast, the input of a reduce_scatter or all_to_all, the output of an all_gather,
//            the message of a send/recv): the size NCCL's own tests report
//   sent_bytes  what this rank puts on the wire for it under the bandwidth-optimal algorithm (the
//            bytes a slow link carries): all_reduce 2(p−1)/p of the buffer (a ring), reduce_scatter
//            the input less this rank's chunk, all_gather (p−1) times this rank's chunk, all_to_all
//            (p−1)/p of the input, broadcast the buffer at the root and 0 elsewhere, send the
//            message, recv and barrier 0
//   seconds  from the call until the caller's wait() returned, summed; for an async collective that
//            includes whatever the caller did meanwhile (so it bounds the communication time)
//   blocked_seconds  inside wait() only: what the caller could not hide behind its own work (for
//            a collective waited for at once, the same as seconds)
struct CollectiveStats {
  int64_t calls = 0;
  int64_t bytes = 0;
  int64_t sent_bytes = 0;
  double seconds = 0;
  double blocked_seconds = 0;
};

// A collective in flight. wait() blocks until it is done (and its local post-processing, such as
// the sum after an all-to-all or the division of an Avg, has run exactly once); it throws
// CommError on failure. Move-only: the post-processing mutates the result, so a copy could run it
// twice. Dropping an unwaited handle skips the post-processing (the c10d work keeps its tensors
// alive until the backend is done with them); every async collective is therefore [[nodiscard]].
class [[nodiscard]] CommHandle {
 public:
  CommHandle();  // empty: wait() returns at once
  // `stats`, `sized`: the communicator's entries for the collective and for it at this size, which
  // wait() adds its seconds to.
  CommHandle(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish, std::string what,
             CollectiveStats* stats = nullptr, CollectiveStats* sized = nullptr);
  // Several works that together make one collective (point-to-point sends and receives), each
  // waited for at most `timeout` (c10d's point-to-point works have no timeout of their own).
  CommHandle(std::vector<c10::intrusive_ptr<c10d::Work>> works, std::function<void()> finish, std::string what,
             CollectiveStats* stats, CollectiveStats* sized, std::chrono::milliseconds timeout);
  // Out of line (communicator.cpp), where c10d::Work is complete: users need not include it.
  CommHandle(CommHandle&&) noexcept;
  CommHandle& operator=(CommHandle&&) noexcept;
  ~CommHandle();
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;
  void wait();
  bool pending() const { return !works_.empty(); }
  // Runs `next` after the collective's own post-processing, inside wait() (at once when nothing is
  // pending): how a host-staged collective copies its result back to the device.
  void then(std::function<void()> next);

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::optional<std::chrono::milliseconds> timeout_;
  std::function<void()> finish_;
  std::string what_;
  CollectiveStats* stats_ = nullptr;  // the communicator's entry for this collective
  CollectiveStats* sized_ = nullptr;  // and for it at this message size
  std::chrono::steady_clock::time_point started_;
};

struct CommunicatorOptions {
  // Reduce-scatters of at most this many bytes run as the all-to-all (or the sends and receives
  // below) even where the backend has a native one. -1: the backend's default: always for Gloo
  // (INT64_MAX), whose native reduce-scatter is an allreduce of the whole input plus copies; on the
  // 2-core VM, 1 to 256 MB, the sends and receives ran it 1.6-2.1x faster on 2 ranks and 1.6-2.5x
  // on 4 (bench/bench_collectives); 0 (never) for NCCL.
  int64_t alltoall_reduce_scatter_max_bytes = -1;
  // All-gather by direct sends and receives: this rank's chunk goes to every peer and each peer's
  // chunk is received straight into its place in the output (no copy; uneven chunks need no
  // padding). -1: the backend's default (yes for Gloo, whose allgather gathers into a flat buffer
  // it allocates on its worker thread and then copies out; no for NCCL).
  int pairwise_all_gather = -1;
  // The reduce-scatters that would run as the all-to-all run as direct sends and receives instead:
  // this rank's chunk of each peer goes to that peer, each peer's contribution to this rank's
  // chunk arrives in a row of a buffer, then the local sum. Same bytes, but every pair exchanges
  // both ways at once: between two hosts on a 1 Gbit/s link, Gloo's all-to-all reached 0.46-0.54
  // of the link, the sends and receives 0.9+ (bench/run_cluster_collectives.sh). -1: the backend's
  // default (yes for Gloo, no for NCCL).
  int pairwise_reduce_scatter = -1;
  // How long a point-to-point part of a collective may wait (ParallelContext sets TESSERA_TIMEOUT_S).
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // The backend computes on host memory (Gloo): a CUDA tensor is copied to a pinned host buffer,
  // reduced there, and copied back when the collective is waited for. This is what lets ranks that
  // share one GPU (where NCCL refuses two ranks per device) train on it; NCCL never needs it.
  bool stage_cuda_through_host = false;
};

// `options` with each -1 ("the backend's default") replaced by that default for Gloo (`gloo`) or
// NCCL: what every group the engine makes runs, and what a probe of its collectives must run.
CommunicatorOptions with_backend_defaults(CommunicatorOptions options, bool gloo);

class Communicator {
 public:
  // `ranks` are the global ranks of the group's members, in group-rank order. `device` is where the
  // group's users keep their tensors (the CPU or this rank's GPU for Gloo, this rank's GPU for NCCL):
  // every collective checks its tensors against it (a host-staged group takes CPU tensors as well),
  // and callers make their scalars there (`options()`).
  // `native_reduce_scatter`: the backend has a flat reduce-scatter (parallel/c10d_compat.h).
  Communicator(c10::intrusive_ptr<c10d::Backend> backend, std::string name, std::vector<int> ranks, int rank,
               c10::Device device, bool native_reduce_scatter, CommunicatorOptions options = {});
  ~Communicator();

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }  // this process's rank within the group
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& global_ranks() const { return ranks_; }
  const std::string& describe() const { return description_; }  // "group 'data' (2 ranks: global 0, 2)"
  c10::Device device() const { return device_; }
  // Options for a tensor this group can take (fp32 on its device), e.g. a scalar to reduce.
  at::TensorOptions options(at::ScalarType dtype = at::kFloat) const;

  // In place on `tensor`.
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  [[nodiscard]] CommHandle all_reduce_async(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);

  // `input`: the flat tensor of n elements; `output`: this rank's chunk, chunk_range(n, size, rank).
  // In place: `output` may be the input's own chunk, input.narrow(0, begin, size) (NCCL documents
  // it; Gloo and the all-to-all form support it: tests/workers/worker.cpp checks both). The rest of
  // `input` is then left in an unspecified state.
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op = ReduceOp::Sum);
  [[nodiscard]] CommHandle reduce_scatter_async(const at::Tensor& input, at::Tensor& output, ReduceOp op = ReduceOp::Sum);

  // `input`: this rank's chunk of `output`, a flat tensor of n elements. In place: `input` may be
  // the output's own chunk, output.narrow(0, begin, size) (checked like the reduce-scatter's).
  void all_gather(const at::Tensor& input, at::Tensor& output);
  [[nodiscard]] CommHandle all_gather_async(const at::Tensor& input, at::Tensor& output);

  void broadcast(at::Tensor& tensor, int root);  // root is a group rank
  [[nodiscard]] CommHandle broadcast_async(at::Tensor& tensor, int root);

  // Equal splits: chunk j of `input` goes to group rank j; chunk i of `output` comes from rank i.
  void all_to_all(const at::Tensor& input, at::Tensor& output);
  [[nodiscard]] CommHandle all_to_all_async(const at::Tensor& input, at::Tensor& output);

  // Uneven splits (MPI's alltoallv): `input` and `output` are flat; input_splits[j] elements go to
  // group rank j (in order), output_splits[i] elements arrive from rank i. Both lists have one entry
  // per rank and sum to the tensors' sizes; each rank's output_splits[i] must be rank i's
  // input_splits[this rank] (a mismatch is the backend's error, or a hang: exchange counts first).
  void all_to_all(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& input_splits,
                  const std::vector<int64_t>& output_splits);
  [[nodiscard]] CommHandle all_to_all_async(const at::Tensor& input, at::Tensor& output,
                                            const std::vector<int64_t>& input_splits,
                                            const std::vector<int64_t>& output_splits);

  void send(at::Tensor& tensor, int peer, int tag = 0);  // peer is a group rank
  [[nodiscard]] CommHandle send_async(at::Tensor& tensor, int peer, int tag = 0);
  void recv(at::Tensor& tensor, int peer, int tag = 0);
  [[nodiscard]] CommHandle recv_async(at::Tensor& tensor, int peer, int tag = 0);

  void barrier();
  [[nodiscard]] CommHandle barrier_async();

  // Per collective ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "send",
  // "recv", "barrier"): calls, bytes and seconds since construction or reset_stats(). For tests,
  // benchmarks and a communication logger.
  const std::map<std::string, CollectiveStats>& stats() const { return stats_; }
  // The same by collective and message size (CollectiveStats::bytes of one call): the comms
  // logger's rows (python/tessera/comms_logger.py).
  const std::map<std::pair<std::string, int64_t>, CollectiveStats>& stats_by_size() const { return stats_by_size_; }
  void reset_stats() {  // zeroes the entries in place: handles in flight point at them
    for (auto& entry : stats_) entry.second = CollectiveStats{};
    for (auto& entry : stats_by_size_) entry.second = CollectiveStats{};
  }

  // How many reduce-scatters ran natively and as all-to-all (for tests and benchmarks).
  int64_t native_reduce_scatters() const { return native_reduce_scatters_; }
  int64_t alltoall_reduce_scatters() const { return alltoall_reduce_scatters_; }
  int64_t pairwise_reduce_scatters() const { return pairwise_reduce_scatters_; }

 private:
  CommHandle reduce_scatter_by_alltoall(const at::Tensor& input, at::Tensor& output, ReduceOp op);
  CommHandle all_gather_pairwise(const at::Tensor& input, at::Tensor& output);
  CommHandle reduce_scatter_pairwise(const at::Tensor& input, at::Tensor& output, ReduceOp op);
  // Both pairwise forms: at step k = 1 .. p-1 this rank receives `receive_into(from)` from the rank
  // k behind and sends `send_from(to)` to the rank k ahead (an empty piece skips its half), every
  // pair of ranks meeting once; counted in the stats as `op`; `finish` runs once all arrived.
  CommHandle exchange_pairwise(const std::string& op, const std::string& what, int64_t bytes, int64_t sent_bytes,
                               const std::function<at::Tensor(int from)>& receive_into,
                               const std::function<at::Tensor(int to)>& send_from, std::function<void()> finish);
  int next_pairwise_tag();
  CommHandle issue(const char* collective, int64_t bytes, int64_t sent, const std::string& what,
                   const std::function<c10::intrusive_ptr<c10d::Work>()>& start, std::function<void()> finish = {});
  std::string label(const char* collective, const at::Tensor& t) const;
  void check_tensor(const at::Tensor& t, const char* collective) const;  // defined, contiguous, on device()
  bool staged(const at::Tensor& t) const { return options_.stage_cuda_through_host && t.is_cuda(); }

  c10::intrusive_ptr<c10d::Backend> backend_;
  std::string name_;
  std::string description_;
  std::vector<int> ranks_;
  int rank_;
  c10::Device device_;
  CommunicatorOptions options_;
  bool native_reduce_scatter_;
  // Tags of the pairwise collectives, above any user's send/recv tag; every rank issues its
  // collectives in the same order, so the counters agree.
  static constexpr int kPairwiseTagBase = 1 << 24;
  int pairwise_tag_ = 0;
  std::map<std::string, CollectiveStats> stats_;  // std::map: entries stay put while handles point at them
  std::map<std::pair<std::string, int64_t>, CollectiveStats> stats_by_size_;
  int64_t native_reduce_scatters_ = 0;
  int64_t alltoall_reduce_scatters_ = 0;
  int64_t pairwise_reduce_scatters_ = 0;
};

}  // namespace tessera
