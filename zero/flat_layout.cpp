#include "zero/flat_layout.h"

#include <algorithm>
#include <stdexcept>

namespace tessera {

FlatLayout FlatLayout::build(const std::vector<int64_t>& numels, int partitions, int64_t bucket_numel,
                             const std::vector<int>& keys) {
  if (partitions < 1) throw std::invalid_argument("FlatLayout: partitions must be >= 1");
  if (bucket_numel < 1) throw std::invalid_argument("FlatLayout: bucket size must be >= 1");
  if (!keys.empty() && keys.size() != numels.size()) throw std::invalid_argument("FlatLayout: one key per parameter");
  // Placement order: reverse registration order, grouped by key (highest first) when keyed.
  std::vector<int> order(numels.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(order.size() - 1 - i);
  auto key_of = [&](int i) { return keys.empty() ? 0 : keys[i]; };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key_of(a) > key_of(b); });
  FlatLayout layout;
  layout.partitions = partitions;
  layout.params.resize(numels.size());
  auto close_bucket = [&](FlatBucket& b) {
    b.numel = (b.used + partitions - 1) / partitions * partitions;
    b.shard = b.numel / partitions;
    b.shard_offset = layout.shard_numel;
    layout.shard_numel += b.shard;
    layout.total += b.numel;
    layout.buckets.push_back(b);
  };
  FlatBucket current;
  for (int i : order) {
    if (!current.params.empty() && (current.used + numels[i] > bucket_numel || current.key != key_of(i))) {
      close_bucket(current);
      current = FlatBucket{};
    }
    if (current.params.empty()) current.offset = layout.total, current.key = key_of(i);
    layout.params[i] = {numels[i], current.offset + current.used, static_cast<int>(layout.buckets.size())};
    current.params.push_back(i);
    current.used += numels[i];
  }
  if (!current.params.empty()) close_bucket(current);
  return layout;
}

std::vector<ShardPiece> FlatLayout::pieces(int rank) const {
  std::vector<ShardPiece> out;
  for (const auto& b : buckets) {
    const int64_t begin = b.offset + rank * b.shard, end = begin + b.shard;
    for (int p : b.params) {  // params of a bucket are in increasing flat order
      const int64_t pb = params[p].offset, pe = pb + params[p].numel;
      const int64_t lo = std::max(begin, pb), hi = std::min(end, pe);
      if (lo < hi) out.push_back({p, b.shard_offset + (lo - begin), lo - pb, hi - lo});
    }
  }
  return out;
}

int64_t FlatLayout::padding() const {
  int64_t used = 0;
  for (const auto& p : params) used += p.numel;
  return total - used;
}

}  // namespace tessera
