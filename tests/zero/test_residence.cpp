// The residence strategies (zero/residence.h) on a small group built by hand, without an engine:
// each one's bind / step / unbind around SGD with momentum, its checkpoint read and write, and its
// memory report, against the same group with everything in memory (bit for bit: the sites move
// values, they never change the arithmetic).
#include <catch2/catch.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include <memory>
#include <vector>

#include "tests/subprocess.h"
#include "zero/residence.h"

using namespace tessera;
using tessera::testing::TempDir;

namespace {

// Rank 1 of 2's shard of two parameters (10 and 7 elements) in buckets of at most 8 elements:
// two buckets (the 7 padded to 8, then the 10 alone), each split in two chunks. `partitioned`: the compute buffer is the shard
// (ZeRO-3); else the whole flat buffer (ZeRO 1-2). `mixed`: bf16 compute with an fp32 master.
struct Group {
  Groups all;  // the one group, as the sites take their groups
  static constexpr int kRank = 1;
  Group(bool mixed, bool partitioned, StepSite& site, uint64_t seed = 7) {
    all.push_back(std::make_unique<ZeroGroup>());
    ZeroGroup& z = *all.front();
    z.layout = FlatLayout::build({10, 7}, 2, 8);
    z.mixed_precision = mixed;
    z.partitioned = partitioned;
    const FlatLayout& L = z.layout;
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    const at::ScalarType compute = mixed ? at::kBFloat16 : at::kFloat;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    at::Tensor values = at::randn({L.total}, gen, f32);
    z.compute = (partitioned ? at::empty({L.shard_numel}, f32) : values.clone()).to(compute);
    if (mixed) z.master = at::empty({L.shard_numel}, site.master_options(f32));
    z.grads = at::randn({L.shard_numel}, gen, f32);
    for (size_t b = 0; b < L.buckets.size(); ++b) {
      const FlatBucket& k = L.buckets[b];
      at::Tensor mine = values.narrow(0, L.flat_of_local(kRank, static_cast<int>(b)), k.shard);
      const int64_t flat = partitioned ? k.shard_offset : L.flat_of_local(kRank, static_cast<int>(b));
      if (partitioned) z.compute.narrow(0, k.shard_offset, k.shard).copy_(mine);
      if (mixed) z.master.narrow(0, k.shard_offset, k.shard).copy_(mine);
      ShardSegment s;
      s.grads = z.grads.narrow(0, k.shard_offset, k.shard);
      s.params = mixed ? z.master.narrow(0, k.shard_offset, k.shard) : z.compute.narrow(0, flat, k.shard);
      s.local_offset = k.shard_offset;
      if (mixed) s.compute_copy = z.compute.narrow(0, flat, k.shard);
      z.segments.push_back(s);
    }
    site.add_group(z, at::kFloat, compute);
    OptimizerHyperparams hyper;
    hyper.momentum = 0.9;
    z.optimizer = make_flat_optimizer("SGD", hyper, L.shard_numel, site.state_options(f32));
  }
  ZeroGroup& operator*() { return *all.front(); }
  // This rank's values (the compute buffer's chunks, as fp32), in shard order.
  at::Tensor values() const {
    const ZeroGroup& g = *all.front();
    std::vector<at::Tensor> parts;
    for (const ShardSegment& s : g.segments) parts.push_back((g.mixed() ? s.compute_copy : s.params).to(at::kFloat));
    return at::cat(parts);
  }
};

StepInputs inputs(int64_t step) {
  StepInputs in;
  in.step = step;
  in.lr = 0.25;
  return in;
}

// Two steps of every bucket through `state`, binding with `params` and stepping `site`'s segments.
std::vector<std::pair<int, int>> step_twice(ZeroGroup& g, StepSite& site, StateSite& state, ParameterSite& params) {
  std::vector<std::pair<int, int>> done;
  BucketOrder order;
  for (int b = static_cast<int>(g.segments.size()) - 1; b >= 0; --b) order.emplace_back(g.index, b);
  for (int64_t step = 1; step <= 2; ++step) {
    for (size_t b = 0; b < g.segments.size(); ++b) site.gradient_final(g, static_cast<int>(b));
    site.before_step();
    state.step(
        order,
        [&](int, int bucket) {
          params.bind(g, bucket);
          return site.segments(g)[bucket];
        },
        [&](int, const ShardSegment& piece, const std::vector<at::Tensor>& arrays) {
          if (arrays.empty()) g.optimizer->step(inputs(step), {piece});
          else g.optimizer->step_with_state(inputs(step), {piece}, arrays, piece.local_offset);
        },
        [&](int group, int bucket) {
          params.unbind(g, bucket);
          site.after_bucket(g, bucket);
          done.emplace_back(group, bucket);
        });
    params.wait_writes();
  }
  return done;
}

// The reference: the same group, everything in memory.
at::Tensor reference_values(bool mixed, bool partitioned) {
  auto site = make_in_place_step();
  auto state = make_state_in_memory();
  auto params = make_parameters_in_memory();
  Group ref(mixed, partitioned, *site);
  step_twice(*ref, *site, *state, *params);
  return ref.values();
}

}  // namespace

TEST_CASE("Residence in memory: each bucket bound - stepped and finished in the given order") {
  auto site = make_in_place_step();
  auto state = make_state_in_memory();
  auto params = make_parameters_in_memory();
  Group group(/*mixed=*/false, /*partitioned=*/false, *site);
  const at::Tensor before = group.values();
  const auto done = step_twice(*group, *site, *state, *params);
  REQUIRE(done.size() == 4);  // two buckets, two steps, in the order given
  CHECK(done[0] == std::make_pair(0, 1));
  CHECK(done[1] == std::make_pair(0, 0));
  CHECK((*group).segments.size() == 2);
  CHECK_FALSE(at::equal(before, group.values()));
  // The state is the optimizer's own; a checkpoint reads it by name and cannot write it as arrays.
  CheckpointState read = state->read(*group);
  CHECK_FALSE(read.from_files);
  REQUIRE(read.named.size() == 1);
  CHECK(read.named[0].second.numel() == (*group).layout.shard_numel);
  CHECK_THROWS_AS(state->write(*group, {}), std::logic_error);
  MemoryReport m;
  site->add_memory(*group, m);
  CHECK(m.optimizer_states == 4 * (*group).layout.shard_numel);
  CHECK(m.host_optimizer_bytes == 0);
}

TEST_CASE("HostStep: gradients copied to host copies - stepped there - and the chunk sent back") {
  for (bool mixed : {false, true}) {
    INFO((mixed ? "bf16" : "fp32"));
    auto site = make_host_step(c10::Device(c10::kCPU), /*pinned=*/false, /*shards_on_host=*/false);
    auto state = make_state_in_memory();
    auto params = make_parameters_in_memory();
    Group group(mixed, false, *site);
    ZeroGroup& g = *group;
    // The optimizer steps other storage than the device's segments.
    const ShardSegment &host = site->segments(g)[0], &device = g.segments[0];
    CHECK(host.grads.data_ptr() != device.grads.data_ptr());
    if (!mixed) CHECK(host.params.data_ptr() != device.params.data_ptr());
    if (mixed) CHECK(host.compute_copy.data_ptr() != device.compute_copy.data_ptr());
    // A gradient reaches the host copy only when final.
    CHECK_FALSE(at::equal(host.grads, device.grads));
    site->gradient_final(g, 0);
    CHECK(at::equal(host.grads, device.grads));
    step_twice(g, *site, *state, *params);
    CHECK(at::equal(group.values(), reference_values(mixed, false)));
    // A write to the device's values outside a step reaches the host master (fp32).
    g.segments[1].params.fill_(mixed ? 0.0 : 3.0);
    site->values_changed(g);
    if (!mixed) CHECK(at::equal(site->segments(g)[1].params, g.segments[1].params));
    MemoryReport m;
    site->add_memory(g, m);
    const int64_t n = g.layout.shard_numel;
    // host gradient copy + (fp32: a host master; bf16: the device-side master is host memory too,
    // and a bf16 staging copy) + the momentum
    CHECK(m.host_optimizer_bytes == 4 * n + (mixed ? 4 * n + 2 * n : 4 * n) + 4 * n);
    CHECK(m.optimizer_states == 0);
    CHECK(site->on_host());
  }
}

TEST_CASE("StateInFiles: state and master streamed tile by tile - read and written for checkpoints") {
  for (bool mixed : {false, true}) {
    INFO((mixed ? "bf16" : "fp32"));
    TempDir dir;
    OptimizerSwapOptions options;
    options.path = dir.path;
    options.tile_numel = 3;  // tiles smaller than a bucket's chunk
    options.buffer_count = 2;
    auto site = make_in_place_step();
    auto state = make_state_in_files(options);
    auto params = make_parameters_in_memory();
    Group group(mixed, false, *site);
    ZeroGroup& g = *group;
    g.optimizer = make_flat_optimizer("SGD", [] { OptimizerHyperparams h; h.momentum = 0.9; return h; }(), 0,
                                      at::TensorOptions().dtype(at::kFloat));  // built without state
    state->attach(group.all, *site);
    CHECK(state->in_files());
    CHECK(state->master_in_file(g) == mixed);
    CHECK(g.master.defined() == false);
    step_twice(g, *site, *state, *params);
    CHECK(at::equal(group.values(), reference_values(mixed, false)));
    // A checkpoint reads the momentum (and master) from the files; writing them back changes both.
    CheckpointState read = state->read(g);
    CHECK(read.from_files);
    REQUIRE(read.arrays.size() == (mixed ? 2u : 1u));
    REQUIRE(read.named.size() == 1);
    CHECK(read.named[0].second.numel() == g.layout.shard_numel);
    CHECK(read.master.defined() == mixed);
    std::vector<at::Tensor> arrays;
    for (const at::Tensor& a : read.arrays) arrays.push_back(at::arange(a.numel(), at::kFloat));
    state->write(g, arrays);
    CheckpointState again = state->read(g);
    for (size_t k = 0; k < arrays.size(); ++k) CHECK(at::equal(again.arrays[k], arrays[k]));
    if (mixed)  // the compute copy followed the master
      CHECK(at::equal(group.values(), arrays.back().to(at::kBFloat16).to(at::kFloat)));
    MemoryReport m;
    state->add_memory(m);
    CHECK(m.offloaded_optimizer_bytes > 0);
    CHECK(m.optimizer_states > 0);  // the tile buffers
    CHECK(m.offload_read_bytes > 0);
  }
}

TEST_CASE("ParametersInFiles: a ZeRO-3 shard in its file - bound around each step - brought in whole") {
  for (bool mixed : {false, true}) {
    INFO((mixed ? "bf16" : "fp32"));
    TempDir dir;
    ParameterSwapOptions options;
    options.path = dir.path;
    options.buffer_count = 2;
    auto site = make_in_place_step();
    auto state = make_state_in_memory();
    auto params = make_parameters_in_files(options, /*buffers_on_host=*/false);
    Group group(mixed, /*partitioned=*/true, *site);
    ZeroGroup& g = *group;
    g.params = {at::empty({10}), at::empty({7})};  // the model's tensors: their dtype names the shard's
    for (auto& p : g.params) p = p.to(mixed ? at::kBFloat16 : at::kFloat);
    const at::Tensor before = group.values();
    params->attach(group.all);
    CHECK_FALSE(g.compute.defined());  // its memory went with it
    CHECK(params->in_files(g));
    REQUIRE(params->swapper() != nullptr);
    // Read whole for a while (a checkpoint's save): the values are the shard's, then gone again.
    params->bring_in(group.all, /*modifies=*/false);
    CHECK(at::equal(group.values(), before));
    params->put_back(group.all);
    CHECK_FALSE(g.compute.defined());
    // Each bucket swapped in around its step and written back behind it.
    step_twice(g, *site, *state, *params);
    CHECK_FALSE(g.compute.defined());
    params->bring_in(group.all, false);
    CHECK(at::equal(group.values(), reference_values(mixed, true)));
    params->put_back(group.all);
    // A chunk written while the shard is in its file, then read back whole.
    const FlatBucket& k = g.layout.buckets[1];
    params->write(g, 1, at::full({k.shard}, 2.0, at::TensorOptions().dtype(g.params.front().scalar_type())));
    params->wait_writes();
    bool ran = false;
    params->with_group_resident(g, [&] {
      ran = true;
      CHECK(g.compute.defined());
      CHECK(at::equal(g.compute.narrow(0, k.shard_offset, k.shard).to(at::kFloat), at::full({k.shard}, 2.0)));
    });
    CHECK(ran);
    CHECK_FALSE(g.compute.defined());
    MemoryReport m;
    params->add_memory(m);
    CHECK(m.offloaded_parameter_bytes > 0);
    CHECK(m.offload_written_bytes > 0);
  }
}
