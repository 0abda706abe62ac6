// HostStep (zero/residence.h): on GPU ranks with offload_optimizer (ZeRO-Offload, Ren et al. 2021)
// the optimizer steps copies in host memory (pinned with offload_optimizer.pin_memory): the fp32
// master (in fp32 training a host copy of the parameters, the device keeping its own), a copy of
// the reduced gradient chunk (queued to the host as each bucket's reduction completes, while
// backward goes on), and the compute-dtype chunk that goes back to the device, asynchronously,
// before its allgather. With offload_param cpu a partitioned group's shard is allocated on the host
// and IS the host copy (no second one, nothing copied back); with offload_param nvme the host copy
// is the swap buffer each chunk is read into around its step (follow_shard), written back to its file. TESSERA_HOST_STAGING=1 takes this
// path on CPU ranks (copies CPU to CPU), so its bookkeeping is tested without a GPU.
// A delayed parameter update (ZeroOptions::delayed_update_after) steps while the next backward
// queues its gradient copies: those go to a second host gradient buffer, the two taking turns.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include "csrc/device_stream.h"
#include "zero/residence.h"

namespace tessera {
namespace {

class HostStep final : public StepSite {
 public:
  HostStep(c10::Device device, bool pinned, bool shards_on_host)
      : device_(device),
        pinned_(at::TensorOptions().dtype(at::kFloat).pinned_memory(pinned && !device.is_cpu())),
        shards_on_host_(shards_on_host) {}

  at::TensorOptions master_options(const at::TensorOptions&) const override { return pinned_; }
  at::TensorOptions state_options(const at::TensorOptions&) const override { return at::TensorOptions().dtype(at::kFloat); }
  at::TensorOptions shard_options(const at::TensorOptions& device, bool partitioned) const override {
    return shards_on_host_ && partitioned ? pinned_ : device;
  }
  bool holds_shard(const ZeroGroup& g) const override { return shards_on_host_ && g.partitioned; }

  void add_group(ZeroGroup& g, at::ScalarType gradient_dtype, at::ScalarType compute_dtype) override {
    if (copies_.size() <= static_cast<size_t>(g.index)) copies_.resize(g.index + 1);
    Copies& c = copies_[g.index];
    const int64_t n = g.layout.shard_numel;
    const bool shard_here = holds_shard(g);
    c.layout = &g.layout;
    c.grads[0] = at::zeros({n}, pinned_.dtype(gradient_dtype));
    if (g.mixed() && !shard_here) c.compute = at::empty({n}, pinned_.dtype(compute_dtype));
    if (!g.mixed() && !shard_here) c.master = at::empty({n}, pinned_);
    for (size_t b = 0; b < g.segments.size(); ++b) {
      const FlatBucket& k = g.layout.buckets[b];
      const ShardSegment& s = g.segments[b];
      ShardSegment h;
      h.local_offset = s.local_offset;
      h.grads = gradient_chunk(c, 0, static_cast<int>(b));
      h.params = g.mixed() || shard_here ? s.params : c.master.narrow(0, k.shard_offset, k.shard);
      if (g.mixed()) h.compute_copy = shard_here ? s.compute_copy : c.compute.narrow(0, k.shard_offset, k.shard);
      c.segments.push_back(h);
    }
    values_changed(g);
  }

  const std::vector<ShardSegment>& segments(const ZeroGroup& g) const override { return copies_[g.index].segments; }

  void follow_shard(ZeroGroup& g, int bucket) override {
    if (!holds_shard(g)) return;
    std::vector<ShardSegment>& host = copies_[g.index].segments;
    for (size_t b = 0; b < host.size(); ++b) {
      if (bucket >= 0 && static_cast<int>(b) != bucket) continue;
      if (g.mixed()) host[b].compute_copy = g.segments[b].compute_copy;
      else host[b].params = g.segments[b].params;
    }
  }

  void gradient_final(ZeroGroup& g, int bucket) override {
    // Queued behind the reduction on the current stream; before_step() waits once for all of them.
    host_gradient(g, bucket).copy_(g.segments[bucket].grads, /*non_blocking=*/true);
  }

  at::Tensor host_gradient(ZeroGroup& g, int bucket) override {
    const Copies& c = copies_[g.index];
    return gradient_chunk(c, c.filling, bucket);
  }

  void before_step() override {
    wait_for_device_stream(device_);
    for (Copies& c : copies_) {  // the step reads the buffer the backward filled
      if (c.segments.empty() || c.reading == c.filling) continue;
      for (size_t b = 0; b < c.segments.size(); ++b) c.segments[b].grads = gradient_chunk(c, c.filling, static_cast<int>(b));
      c.reading = c.filling;
    }
  }

  void keep_gradients_for_delayed_step() override {
    for (Copies& c : copies_) {
      if (c.segments.empty()) continue;
      if (!c.grads[1].defined()) c.grads[1] = at::zeros(c.grads[0].sizes(), pinned_.dtype(c.grads[0].scalar_type()));
      c.filling = 1 - c.reading;
    }
  }

  void after_bucket(ZeroGroup& g, int bucket) override {
    // offload_param: the shard is the host's already (in memory, or written back to its file, its
    // views let go by the unbind before this)
    if (holds_shard(g)) return;
    const ShardSegment &host = copies_[g.index].segments[bucket], &device = g.segments[bucket];
    const at::Tensor& from = g.mixed() ? host.compute_copy : host.params;
    const at::Tensor& to = g.mixed() ? device.compute_copy : device.params;
    // From pinned memory: queued on the current stream; the next step's before_step() (before the
    // CPU writes the host buffers again) orders the two.
    to.copy_(from, /*non_blocking=*/true);
  }

  void values_changed(ZeroGroup& g) override {  // fp32 training: the host master takes the device's values
    Copies& c = copies_[g.index];
    if (!c.master.defined()) return;
    for (size_t b = 0; b < g.segments.size(); ++b) c.segments[b].params.copy_(g.segments[b].params);
  }

  void release_master_views(ZeroGroup& g) override {
    for (ShardSegment& s : copies_[g.index].segments) s.params = at::Tensor();
  }

  void wait_for_readers() override { wait_for_device_stream(device_); }

  void add_memory(const ZeroGroup& g, MemoryReport& m) const override {  // host memory, not the device's
    const Copies& c = copies_[g.index];
    for (const at::Tensor* t : {&g.master, &c.master, &c.grads[0], &c.grads[1], &c.compute})
      if (t->defined()) m.host_optimizer_bytes += t->nbytes();
    m.host_optimizer_bytes += g.optimizer->state_bytes();
  }

  bool on_host() const override { return true; }

 private:
  struct Copies {
    at::Tensor master, compute;  // each undefined where the group needs none
    at::Tensor grads[2];         // the second only with a delayed parameter update
    int filling = 0, reading = 0;  // the gradient buffer gradient_final() writes, and the one the step reads
    std::vector<ShardSegment> segments;  // what the optimizer steps: views of the above (or the device's master)
    const FlatLayout* layout = nullptr;  // the group's (the groups outlive the site)
  };
  // Bucket `bucket`'s chunk of gradient buffer `buffer`.
  static at::Tensor gradient_chunk(const Copies& c, int buffer, int bucket) {
    const FlatBucket& k = c.layout->buckets[bucket];
    return c.grads[buffer].narrow(0, k.shard_offset, k.shard);
  }
  c10::Device device_;
  at::TensorOptions pinned_;
  bool shards_on_host_;
  std::vector<Copies> copies_;  // by group index
};

}  // namespace

std::unique_ptr<StepSite> make_host_step(c10::Device device, bool pinned, bool shards_on_host) {
  return std::make_unique<HostStep>(device, pinned, shards_on_host);
}

}  // namespace tessera
