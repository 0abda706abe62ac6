#include "zero/partitioned_parameters.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

namespace tessera {

namespace {

size_t bytes_of(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

}  // namespace

at::DataPtr release_storage(const at::Tensor& buffer) {
  c10::StorageImpl* s = buffer.storage().unsafeGetStorageImpl();
  at::DataPtr old = s->set_data_ptr(at::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
  return old;
}

// The storage behind a slot's buffer (and every parameter view of it) gets or loses its bytes; the
// tensors keep their sizes. Freed bytes go to a pool of buffers by size (a transformer's blocks
// have the same sizes, so the next unit reuses them: no page faults, and the C library's heap
// does not grow with every gather) while pooled and gathered bytes together stay within
// stage3_max_live_parameters; past it they are freed.
void PartitionedParameters::allocate_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t bytes = bytes_of(t);
  if (s->nbytes() == bytes && s->data_ptr().get()) return;
  std::vector<at::DataPtr>& free = pool_[bytes];
  // No buffer of this size pooled: pooled buffers of other sizes go first where keeping them would
  // take pooled and gathered bytes past stage3_max_live_parameters.
  const int64_t cap = options_.max_live_numel * t.element_size();
  const int64_t live_bytes = live_numel_ * t.element_size();
  for (auto it = pool_.begin(); free.empty() && it != pool_.end() && pooled_bytes_ + live_bytes + static_cast<int64_t>(bytes) > cap;) {
    if (it->second.empty()) {
      ++it;
      continue;
    }
    it->second.pop_back();  // freed here
    pooled_bytes_ -= static_cast<int64_t>(it->first);
  }
  if (!free.empty()) {
    s->set_data_ptr_noswap(std::move(free.back()));
    free.pop_back();
    pooled_bytes_ -= static_cast<int64_t>(bytes);
  } else {
    s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  }
  s->set_nbytes(bytes);
}

void PartitionedParameters::free_storage(const at::Tensor& t) {
  const size_t bytes = t.storage().nbytes();
  at::DataPtr old = release_storage(t);
  if (!old.get()) return;
  // Pooled and gathered bytes together stay within stage3_max_live_parameters (live_numel_ still
  // counts this buffer): a pool on top of a full window would double the parameters' footprint.
  const int64_t cap = options_.max_live_numel * t.element_size();
  if (pooled_bytes_ + live_numel_ * t.element_size() > cap) return;  // `old` frees it
  pooled_bytes_ += static_cast<int64_t>(bytes);
  pool_[bytes].push_back(std::move(old));
}

PartitionedParameters::PartitionedParameters(Communicator& gather, const std::vector<ZeroGroup*>& groups,
                                             UnitTracker& units, const PartitionedOptions& options,
                                             bool start_released, ParameterSwapper* swapper)
    : comm_(gather), swapper_(swapper), units_(units), options_(options), partitioned_mode_(start_released) {
  for (ZeroGroup* g : groups) {
    if (!g->partitioned) continue;
    for (size_t b = 0; b < g->layout.buckets.size(); ++b) {
      const FlatBucket& k = g->layout.buckets[b];
      Slot slot;
      for (int p : k.params) {
        slot_of_[g->params[p].unsafeGetTensorImpl()] = static_cast<int>(slots_.size());
        slot.params.emplace_back(g->params[p], g->params[p].detach());  // the detached view keeps the layout
      }
      if (!released_value_.defined()) released_value_ = at::full({1}, NAN, g->gathered.front().options());
      slot.group = g;
      slot.bucket = static_cast<int>(b);
      slot.owner = k.key;
      slot.numel = k.numel;
      if (start_released) {
        slot.state = State::Released;
        for (auto& [param, view] : slot.params) param.set_data(released_value_.expand(param.sizes()));
      } else {
        live_numel_ += k.numel;
      }
      slots_.push_back(std::move(slot));
    }
  }
  peak_live_numel_ = live_numel_;
  unit_slots_.resize(units_.size());
  for (int u = 0; u < units_.size(); ++u) {
    for (const void* p : units_.params_used(u)) {
      auto it = slot_of_.find(p);
      if (it == slot_of_.end()) continue;  // a persistent parameter
      if (std::find(unit_slots_[u].begin(), unit_slots_[u].end(), it->second) == unit_slots_[u].end())
        unit_slots_[u].push_back(it->second);
    }
  }
  open_.assign(units_.size(), 0);
  units_.add_listener(this);
}

PartitionedParameters::~PartitionedParameters() {
  units_.remove_listener(this);
  // The model outlives the engine: it gets its parameters whole (unless a peer is gone).
  try {
    for (size_t s = 0; s < slots_.size(); ++s)
      if (slots_[s].state == State::Released) launch(static_cast<int>(s));
    for (size_t s = 0; s < slots_.size(); ++s) wait(static_cast<int>(s));
  } catch (const std::exception&) {  // a peer gone, a swap file unreadable: the engine is going anyway
  }
}

double PartitionedParameters::take_wait_s() { return std::exchange(wait_s_, 0.0); }

void PartitionedParameters::launch(int s) {
  Slot& slot = slots_[s];
  const FlatBucket& k = slot.group->layout.buckets[slot.bucket];
  at::Tensor& full = slot.group->gathered[slot.bucket];
  if (slot.state == State::Released)
    for (auto& [param, view] : slot.params) param.set_data(view);
  if (slot.state != State::Live) {
    allocate_storage(full);
    live_numel_ += slot.numel;
    peak_live_numel_ = std::max(peak_live_numel_, live_numel_);
  }
  // This rank's chunk of the bucket comes from its shard; the allgather fills the rest in place.
  Communicator& comm = *slot.group->gather_comm;  // the group's own ranks (ZeroGroup::gather_comm)
  at::Tensor chunk = full.narrow(0, comm.rank() * k.shard, k.shard);
  const at::Tensor& shard = slot.group->compute;
  // offload_param "cpu" on a GPU rank: the shard is in host memory (asynchronous when pinned:
  // the CPU writes it again only after the step's wait for the stream).
  if (shard.defined())
    chunk.copy_(shard.narrow(0, k.shard_offset, k.shard), shard.device() != chunk.device() && shard.is_pinned());
  else swapper_->read(slot.group->index, slot.bucket, chunk);  // NVMe parameter offload
  if (comm.size() == 1) {
    slot.state = State::Live;
    return;
  }
  slot.handle = comm.all_gather_async(chunk, full);
  slot.state = State::InFlight;
}

void PartitionedParameters::wait(int s) {
  Slot& slot = slots_[s];
  if (slot.state != State::InFlight) return;
  const auto start = std::chrono::steady_clock::now();
  slot.handle.wait();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  slot.state = State::Live;
  if (slot.prefetched) in_flight_prefetch_ -= slot.numel, slot.prefetched = false;
}

void PartitionedParameters::release(int s) {
  Slot& slot = slots_[s];
  if (slot.state == State::Released) return;
  wait(s);  // never free a buffer under a running collective
  free_storage(slot.group->gathered[slot.bucket]);
  for (auto& [param, view] : slot.params) param.set_data(released_value_.expand(param.sizes()));
  slot.state = State::Released;
  live_numel_ -= slot.numel;
}

void PartitionedParameters::need(int unit) {
  for (int s : unit_slots_[unit])
    if (slots_[s].state == State::Released) launch(s);
  for (int s : unit_slots_[unit]) wait(s);
}

bool PartitionedParameters::used_by_open_unit(int s, int except) const {
  for (int v = 0; v < static_cast<int>(open_.size()); ++v)
    if (v != except && open_[v] && std::count(unit_slots_[v].begin(), unit_slots_[v].end(), s)) return true;
  return false;
}

// Elements gathered between now (forward position `position`: the next unit to begin) and the
// slot's next use: later units of this forward, then the backward from the last unit down.
int64_t PartitionedParameters::reuse_distance(int s, size_t position) const {
  int64_t distance = 0;
  auto uses = [&](int u) { return std::count(unit_slots_[u].begin(), unit_slots_[u].end(), s) > 0; };
  auto add = [&](int u) {
    for (int t : unit_slots_[u]) distance += slots_[t].numel;
  };
  for (size_t i = position; i < order_.size(); ++i) {
    if (uses(order_[i])) return distance;
    add(order_[i]);
  }
  for (size_t i = order_.size(); i-- > 0;) {
    if (uses(order_[i])) return distance;
    add(order_[i]);
  }
  return INT64_MAX;
}

void PartitionedParameters::prefetch_after(size_t position, bool backward) {
  auto try_unit = [&](int u) {
    for (int s : unit_slots_[u]) {
      Slot& slot = slots_[s];
      if (slot.state != State::Released) continue;
      if (in_flight_prefetch_ + slot.numel > options_.prefetch_numel ||
          live_numel_ + slot.numel > options_.max_live_numel)
        return false;
      launch(s);
      slot.prefetched = true;
      in_flight_prefetch_ += slot.numel;
    }
    return true;
  };
  if (backward) {
    for (size_t i = position; i-- > 0;)
      if (!try_unit(order_[i])) return;
  } else {
    for (size_t i = position; i < order_.size(); ++i)
      if (!try_unit(order_[i])) return;
  }
}

void PartitionedParameters::on_unit_event(int u, UnitEvent event) {
  if (u < 0 || u >= static_cast<int>(unit_slots_.size())) return;
  switch (event) {
    case UnitEvent::ForwardBegin: {
      if (!partitioned_mode_) {
        // The model reports its units: from now on, only what runs is gathered.
        partitioned_mode_ = true;
        if (gather_all_depth_ == 0)
          for (size_t s = 0; s < slots_.size(); ++s)
            if (!std::count(unit_slots_[u].begin(), unit_slots_[u].end(), static_cast<int>(s)) && !used_by_open_unit(static_cast<int>(s), -1))
              release(static_cast<int>(s));
        peak_live_numel_ = live_numel_;  // the peak counts from here: construction held the model whole
      }
      open_[u] = 1;
      open_stack_.push_back(u);
      order_checked_ = false;
      // Where this forward is in the recorded order.
      if (order_known_ && (cursor_ >= order_.size() || order_[cursor_] != u) && !order_.empty() && order_[0] == u)
        cursor_ = 0;  // a new pass (the previous one ended, or stopped early)
      if (cursor_ == 0) backward_cursor_ = order_.size();
      if (!order_known_) {
        order_.push_back(u);
        cursor_ = order_.size();
      } else if (cursor_ < order_.size() && order_[cursor_] == u) {
        ++cursor_;
      } else {
        if (!warned_order_ && comm_.rank() == 0)
          std::fprintf(stderr, "[tessera] ZeRO-3: unit %d (%s) ran where the recorded order has unit %d; recording the "
                               "order again (prefetch pauses until it is known)\n",
                       u, units_.unit(u).name.c_str(), cursor_ < order_.size() ? order_[cursor_] : -1);
        warned_order_ = true;
        order_.resize(cursor_);
        order_.push_back(u);
        cursor_ = order_.size();
        order_known_ = false;
      }
      need(u);
      if (order_known_) prefetch_after(cursor_, /*backward=*/false);
      break;
    }
    case UnitEvent::ForwardEnd: {
      open_[u] = 0;
      if (auto it = std::find(open_stack_.rbegin(), open_stack_.rend(), u); it != open_stack_.rend())
        open_stack_.erase(std::next(it).base());
      if (gather_all_depth_ > 0 || !partitioned_mode_) break;
      const bool training = at::GradMode::is_enabled();
      // Its backward could begin without notice (no output handed over): keep its parameters.
      if (training && !units_.is_output_watched(u)) break;
      for (int s : unit_slots_[u]) {
        if (used_by_open_unit(s, u)) continue;
        if (training && order_known_ && live_numel_ <= options_.max_live_numel &&
            reuse_distance(s, cursor_) <= options_.max_reuse_distance)
          continue;
        release(s);
      }
      if (order_known_) prefetch_after(cursor_, /*backward=*/false);  // what the release made room for
      break;
    }
    case UnitEvent::BackwardBegin: {
      // Every backward's first unit: the order its forward followed, on every rank alike (a rank
      // whose forward departed re-records alone, so the check cannot wait for a re-recording).
      if (!order_checked_) {
        check_order_across_ranks();
        order_checked_ = true;
      }
      if (!order_known_) {  // the first backward: the forward before it is the order
        order_known_ = true;
        backward_cursor_ = order_.size();
      }
      need(u);
      size_t pos = std::min(backward_cursor_, order_.size());
      while (pos > 0 && order_[pos - 1] != u) --pos;
      if (pos > 0) {
        backward_cursor_ = pos - 1;
        prefetch_after(pos - 1, /*backward=*/true);
      }
      break;
    }
    case UnitEvent::BackwardEnd: {
      if (gather_all_depth_ > 0 || !partitioned_mode_) break;
      for (int s : unit_slots_[u])
        if (slots_[s].owner == u && !used_by_open_unit(s, -1)) release(s);
      if (order_known_ && backward_cursor_ < order_.size() && order_[backward_cursor_] == u)
        prefetch_after(backward_cursor_, /*backward=*/true);  // what the release made room for
      break;
    }
  }
}

// Every rank must have run the same units in the same order: the gathers pair up across ranks by
// their order, so a rank whose control flow departs (a branch on its rank or its data) would
// exchange one unit's values for another's. One small allgather each time an order is recorded:
// (length, FNV-1a hash of the unit sequence) per rank. Every rank sees every rank's pair, so all
// of them raise together rather than some going on into mismatched collectives.
void PartitionedParameters::check_order_across_ranks() {
  if (comm_.size() == 1) return;
  // This pass's units: the recorded order up to where the pass is (all of it after a re-recording).
  const size_t ran = std::min(cursor_, order_.size());
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < ran; ++i) hash = (hash ^ static_cast<uint64_t>(order_[i] + 1)) * 1099511628211ull;
  at::Tensor all = at::zeros({2 * comm_.size()}, comm_.options(at::kLong));
  at::Tensor mine = all.narrow(0, 2 * comm_.rank(), 2);
  mine[0] = static_cast<int64_t>(ran);
  mine[1] = static_cast<int64_t>(hash);
  comm_.all_gather(mine, all);
  all = all.cpu();  // NCCL: the pairs are on the device
  const int64_t* v = all.data_ptr<int64_t>();
  std::string ranks;
  bool same = true;
  for (int r = 0; r < comm_.size(); ++r) {
    same = same && v[2 * r] == v[0] && v[2 * r + 1] == v[1];
    char digest[32];
    std::snprintf(digest, sizeof digest, "%04llx", static_cast<unsigned long long>(v[2 * r + 1]) & 0xffff);
    ranks += (r ? ", " : "") + std::to_string(r) + ": " + std::to_string(v[2 * r]) + " units, order hash " + digest;
  }
  if (same) return;
  std::string mine_names;
  for (size_t i = 0; i < ran; ++i) mine_names += (i ? ", " : "") + units_.unit(order_[i]).name;
  throw std::runtime_error("tessera: ZeRO-3: the units ran in different orders on the data-parallel ranks (by rank: " +
                           ranks + "); this rank (" + std::to_string(comm_.rank()) + ") ran " + mine_names +
                           ". Every rank must run the same units in the same order each step: the parameter gathers "
                           "pair up across ranks by their order (a branch on the rank or on the data breaks it).");
}

void PartitionedParameters::fetch(const at::Tensor& param) {
  auto it = slot_of_.find(param.unsafeGetTensorImpl());
  if (it == slot_of_.end()) return;
  const int s = it->second;
  if (!open_stack_.empty()) {
    std::vector<int>& used = unit_slots_[open_stack_.back()];
    if (std::find(used.begin(), used.end(), s) == used.end()) used.push_back(s);
  }
  if (slots_[s].state == State::Released) launch(s);
  wait(s);
}

void PartitionedParameters::end_of_forward() {
  if (at::GradMode::is_enabled() || gather_all_depth_ > 0 || !partitioned_mode_) return;
  for (size_t s = 0; s < slots_.size(); ++s)
    if (!used_by_open_unit(static_cast<int>(s), -1)) release(static_cast<int>(s));
}

void PartitionedParameters::after_step() {
  std::fill(open_.begin(), open_.end(), 0);
  open_stack_.clear();
  if (partitioned_mode_ && gather_all_depth_ == 0) {
    for (size_t s = 0; s < slots_.size(); ++s) release(static_cast<int>(s));
    return;
  }
  // Whole (no units reported yet, or inside gather_all): gather the updated values again.
  for (size_t s = 0; s < slots_.size(); ++s) {
    wait(static_cast<int>(s));
    launch(static_cast<int>(s));
  }
  for (size_t s = 0; s < slots_.size(); ++s) wait(static_cast<int>(s));
}

void PartitionedParameters::abort_backward() {
  std::fill(open_.begin(), open_.end(), 0);
  open_stack_.clear();
  if (partitioned_mode_ && gather_all_depth_ == 0)
    for (size_t s = 0; s < slots_.size(); ++s) release(static_cast<int>(s));
}

void PartitionedParameters::partition_without_units() {
  partitioned_mode_ = true;
  if (gather_all_depth_ == 0)
    for (size_t s = 0; s < slots_.size(); ++s) release(static_cast<int>(s));
  peak_live_numel_ = live_numel_;
}

void PartitionedParameters::gather_all() {
  if (gather_all_depth_++ > 0) return;
  for (size_t s = 0; s < slots_.size(); ++s)
    if (slots_[s].state == State::Released) launch(static_cast<int>(s));
  for (size_t s = 0; s < slots_.size(); ++s) wait(static_cast<int>(s));
}

void PartitionedParameters::release_all() {
  if (gather_all_depth_ == 0 || --gather_all_depth_ > 0 || !partitioned_mode_) return;
  for (size_t s = 0; s < slots_.size(); ++s)
    if (!used_by_open_unit(static_cast<int>(s), -1)) release(static_cast<int>(s));
}

}  // namespace tessera
