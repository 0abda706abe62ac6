#include "zero/partitioned_init.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/UndefinedTensorImpl.h>

#include <cmath>

#include "csrc/heap_trim.h"
#include <stdexcept>

namespace tessera {

at::Tensor released_placeholder(at::IntArrayRef shape, const at::TensorOptions& options) {
  return at::full({1}, NAN, options).expand(shape);
}

namespace {

int64_t total_numel(const std::vector<at::Tensor>& params) {
  int64_t n = 0;
  for (const at::Tensor& p : params) n += p.numel();
  return n;
}

}  // namespace

void PartitionedInit::forget_dropped() {
  for (auto it = entries_.begin(); it != entries_.end();)
    it = it->second.param.expired() ? entries_.erase(it) : std::next(it);
}

void PartitionedInit::partition(const std::vector<at::Tensor>& all) {
  forget_dropped();
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : all)
    if (p.defined() && !entries_.count(p.unsafeGetTensorImpl())) {
      bool twice = false;
      for (const at::Tensor& q : params) twice = twice || q.is_same(p);
      if (!twice) params.push_back(p);
    }
  if (params.empty()) return;
  // Rank 0's values, all of them in one fp32 broadcast (exact for fp32, bf16 and fp16 alike).
  const int ranks = data_.size(), rank = data_.rank();
  at::Tensor flat = at::empty({total_numel(params)}, data_.options(at::kFloat));
  int64_t offset = 0;
  for (const at::Tensor& p : params) {
    if (p.device() != data_.device())
      throw std::invalid_argument("tessera: zero.Init: a parameter is on " + p.device().str() +
                                  ", but the data-parallel group's collectives run on " + data_.device().str());
    flat.narrow(0, offset, p.numel()).copy_(p.detach().reshape({-1}));
    offset += p.numel();
  }
  if (ranks > 1) data_.broadcast(flat, 0);
  offset = 0;
  for (const at::Tensor& p : params) {
    const int64_t n = p.numel(), c = init_chunk_numel(n, ranks);
    const int64_t begin = std::min(n, rank * c), end = std::min(n, begin + c);
    Entry e(p);
    e.chunk = at::zeros({c}, p.options().requires_grad(false));
    if (end > begin) e.chunk.narrow(0, 0, end - begin).copy_(flat.narrow(0, offset + begin, end - begin));
    at::Tensor(p).set_data(released_placeholder(p.sizes(), p.options().requires_grad(false)));
    entries_.emplace(p.unsafeGetTensorImpl(), std::move(e));
    offset += n;
  }
  // What the piece was built in goes back to the OS now: glibc keeps freed heap memory, and with
  // its default (moving) mmap threshold building layer after layer grows the heap past the whole
  // model (measured: 16 layers of 4 MiB on 2 ranks, peak +92 MiB without this, +44 with it).
  flat = at::Tensor();
  release_free_heap();
}

bool PartitionedInit::holds(const at::Tensor& param) const {
  auto it = entries_.find(param.unsafeGetTensorImpl());
  return it != entries_.end() && !it->second.param.expired();
}

std::vector<PartitionedInit::Entry*> PartitionedInit::entries_of(const std::vector<at::Tensor>& params) {
  std::vector<Entry*> out;
  for (const at::Tensor& p : params) {
    auto it = entries_.find(p.unsafeGetTensorImpl());
    if (it == entries_.end()) continue;
    bool twice = false;
    for (Entry* e : out) twice = twice || e == &it->second;
    if (!twice) out.push_back(&it->second);
  }
  return out;
}

// Every rank contributes its chunks of the parameters, one allgather for all of them; parameter
// i's values are then rank 0's chunk, rank 1's, ... cut to its size.
void PartitionedInit::gather(const std::vector<at::Tensor>& params) {
  std::vector<Entry*> entries;
  for (Entry* e : entries_of(params))
    if (e->gathered++ == 0) entries.push_back(e);
  if (entries.empty()) return;
  const int ranks = data_.size(), rank = data_.rank();
  int64_t per_rank = 0;
  for (Entry* e : entries) per_rank += e->chunk.numel();
  at::Tensor all = at::empty({ranks * per_rank}, data_.options(at::kFloat));
  at::Tensor mine = all.narrow(0, rank * per_rank, per_rank);
  int64_t offset = 0;
  for (Entry* e : entries) {
    mine.narrow(0, offset, e->chunk.numel()).copy_(e->chunk);
    offset += e->chunk.numel();
  }
  if (ranks > 1) data_.all_gather(mine, all);
  at::Tensor grid = all.view({ranks, per_rank});
  offset = 0;
  for (Entry* e : entries) {
    at::Tensor p(e->param.lock());
    const int64_t c = e->chunk.numel();
    at::Tensor whole = grid.narrow(1, offset, c).reshape({-1}).narrow(0, 0, p.numel());
    p.set_data(whole.to(p.scalar_type()).view(p.sizes()));
    offset += c;
  }
}

void PartitionedInit::release(const std::vector<at::Tensor>& params, int root) {
  std::vector<Entry*> entries;
  for (Entry* e : entries_of(params))
    if (e->gathered > 0) entries.push_back(e);
  if (entries.empty()) return;
  const int ranks = data_.size(), rank = data_.rank();
  if (root >= ranks || root < -1)
    throw std::invalid_argument("tessera: GatheredParameters: modifier_rank " + std::to_string(root) +
                                " is not a data-parallel rank (0.." + std::to_string(ranks - 1) + ")");
  if (root >= 0) {
    std::vector<at::Tensor> tensors;
    for (Entry* e : entries) tensors.emplace_back(e->param.lock());
    at::Tensor flat = at::empty({total_numel(tensors)}, data_.options(at::kFloat));
    int64_t offset = 0;
    for (const at::Tensor& p : tensors) {
      flat.narrow(0, offset, p.numel()).copy_(p.detach().reshape({-1}));
      offset += p.numel();
    }
    if (ranks > 1) data_.broadcast(flat, root);
    offset = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      const int64_t n = tensors[i].numel(), c = entries[i]->chunk.numel();
      const int64_t begin = std::min(n, rank * c), end = std::min(n, begin + c);
      if (end > begin) entries[i]->chunk.narrow(0, 0, end - begin).copy_(flat.narrow(0, offset + begin, end - begin));
      offset += n;
    }
  }
  for (Entry* e : entries) {
    if (--e->gathered > 0) continue;  // an enclosing gather still holds it whole
    at::Tensor p(e->param.lock());
    p.set_data(released_placeholder(p.sizes(), p.options().requires_grad(false)));
  }
}

void PartitionedInit::take_shards(ModelDescription& model) {
  for (const ParamGroup& g : model.groups)
    for (size_t i = 0; i < g.params.size(); ++i) {
      auto it = entries_.find(g.params[i].unsafeGetTensorImpl());
      if (it != entries_.end() && it->second.gathered)
        throw std::logic_error("tessera: " + param_name(g, i) +
                               " is inside a GatheredParameters block; end the block before initializing the engine");
    }
  for (ParamGroup& g : model.groups) {
    for (size_t i = 0; i < g.params.size(); ++i) {
      auto it = entries_.find(g.params[i].unsafeGetTensorImpl());
      if (it == entries_.end()) continue;
      if (g.shards.size() < g.params.size()) g.shards.resize(g.params.size());
      g.shards[i] = std::move(it->second.chunk);
      entries_.erase(it);
    }
  }
}

int64_t PartitionedInit::held_bytes() const {
  int64_t bytes = 0;
  for (const auto& [impl, e] : entries_)
    if (!e.param.expired()) bytes += e.chunk.numel() * static_cast<int64_t>(e.chunk.element_size());
  return bytes;
}

int64_t PartitionedInit::held_parameters() const {
  int64_t n = 0;
  for (const auto& [impl, e] : entries_) n += !e.param.expired();
  return n;
}

}  // namespace tessera
