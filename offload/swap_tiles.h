// The tiles the NVMe optimizer swapper (offload/optimizer_swapper.h) cuts a segment into, as a
// pure function: the swapper and the memory estimator (engine/estimator/) both size their files and
// buffers by it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tessera {

// A segment (a bucket's shard) of `segment_numel` elements is cut into tiles of at most
// sub_group_size elements and, when large, into at least kOptimizerSwapMinTiles tiles of at most
// kOptimizerSwapMaxTileNumel: one tile's read, the step of the one before and the write of the one
// before that overlap only across tiles. Measured (bench/bench_swapper.cpp, docs/offload.md): one
// or two tiles a segment move a step's bytes at 0.63-0.65 of the disk's speed, eight or more at
// 0.8-1.0; and the tile buffers held in memory shrink with them.
inline constexpr int kOptimizerSwapMinTiles = 8;
inline constexpr int64_t kOptimizerSwapMinTileNumel = 1'000'000;
inline constexpr int64_t kOptimizerSwapMaxTileNumel = 16'000'000;

inline int64_t optimizer_swap_tile_numel(int64_t sub_group_size, int64_t segment_numel) {
  const int64_t split =
      std::max(kOptimizerSwapMinTileNumel, (segment_numel + kOptimizerSwapMinTiles - 1) / kOptimizerSwapMinTiles);
  return std::max<int64_t>(1, std::min({sub_group_size, kOptimizerSwapMaxTileNumel, split}));
}

}  // namespace tessera
