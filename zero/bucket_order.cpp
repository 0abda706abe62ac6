#include "zero/bucket_order.h"

#include <algorithm>
#include <set>
#include <unordered_map>

namespace tessera {

BucketOrder reduction_order(const Groups& groups, bool by_unit) {
  BucketOrder order;
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (size_t b = 0; b < groups[gi]->layout.buckets.size(); ++b) order.emplace_back(static_cast<int>(gi), static_cast<int>(b));
  if (!by_unit) return order;
  auto key = [&](const std::pair<int, int>& gb) {
    const ZeroGroup& g = *groups[gb.first];
    return g.partitioned ? g.layout.buckets[gb.second].key : -1;
  };
  std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) { return key(a) > key(b); });
  return order;
}

std::vector<BucketOrder> buckets_by_unit(const Groups& groups, const UnitTracker& units) {
  std::unordered_map<const void*, std::pair<int, int>> where;
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (size_t i = 0; i < groups[gi]->params.size(); ++i)
      where[groups[gi]->params[i].unsafeGetTensorImpl()] = {static_cast<int>(gi), groups[gi]->layout.params[i].bucket};
  std::vector<BucketOrder> out(units.size());
  for (int u = 0; u < units.size(); ++u) {
    std::set<std::pair<int, int>> buckets;
    for (const void* p : units.params_used(u))
      if (auto it = where.find(p); it != where.end()) buckets.insert(it->second);
    out[u].assign(buckets.begin(), buckets.end());
  }
  return out;
}

BucketOrder forward_order(const Groups& groups, const std::vector<BucketOrder>& unit_buckets) {
  BucketOrder order;
  std::set<std::pair<int, int>> ordered;
  for (const auto& buckets : unit_buckets)
    for (const auto& gb : buckets)
      if (ordered.insert(gb).second) order.push_back(gb);
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (int b = static_cast<int>(groups[gi]->layout.buckets.size()) - 1; b >= 0; --b)
      if (ordered.insert({static_cast<int>(gi), b}).second) order.emplace_back(static_cast<int>(gi), b);
  return order;
}

}  // namespace tessera
