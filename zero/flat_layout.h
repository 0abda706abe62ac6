// How one parameter group is laid out in flat buffers, byte by byte (pure arithmetic).
//
// Parameters are placed in REVERSE registration order, because backward produces gradients
// roughly from the last layer to the first: the first buckets to fill are then the first to be
// reduced. Consecutive parameters are grouped into buckets of at most `bucket_numel` elements
// (a larger parameter gets a bucket of its own); each bucket is padded with zeros to a multiple
// of the partition count p, so that it splits evenly:
//
//   flat:   | bucket 0 (params n-1, n-2, pad) | bucket 1 (params n-3 .. , pad) | ...
//   rank r owns chunk r of every bucket:  [b.offset + r·b.shard, b.offset + (r+1)·b.shard)
//
// A rank's owned chunks, concatenated in bucket order, form its contiguous local shard (the fp32
// master slice, the gradient slice, the optimizer states). Because every bucket splits evenly,
// each bucket is one native reduce-scatter (and one allgather) — no uneven collectives, and
// exactly the bytes a ring reduce-scatter moves.
//
// With `keys` (ZeRO-3: each parameter's owning unit), a bucket never holds two keys: parameters are
// placed by key, highest first (the last unit first, as backward reaches them), then in reverse
// registration order, and a bucket closes when the key changes. A unit's parameters of a group are
// then whole buckets, gathered and reduced without touching another unit's.
#pragma once

#include <cstdint>
#include <vector>

#include "optim/shard.h"

namespace tessera {

struct FlatParam {
  int64_t numel = 0;
  int64_t offset = 0;  // in the flat buffer
  int bucket = 0;
};

struct FlatBucket {
  int64_t offset = 0;        // in the flat buffer
  int64_t numel = 0;         // padded: a multiple of the partition count
  int64_t used = 0;          // elements belonging to parameters (the rest is padding)
  int64_t shard = 0;         // numel / partitions: each rank's chunk
  int64_t shard_offset = 0;  // where this bucket's chunk starts in a rank's local shard
  std::vector<int> params;   // indices (registration order) of the parameters in this bucket
  int key = 0;               // the key its parameters share (0 when built without keys)
};

struct FlatLayout {
  int partitions = 1;
  int64_t total = 0;        // flat buffer length, padding included
  int64_t shard_numel = 0;  // length of each rank's local shard = total / partitions
  std::vector<FlatParam> params;  // in registration order
  std::vector<FlatBucket> buckets;

  static FlatLayout build(const std::vector<int64_t>& numels, int partitions, int64_t bucket_numel,
                          const std::vector<int>& keys = {});

  int64_t flat_of_local(int rank, int bucket) const {  // flat offset of rank's chunk of a bucket
    return buckets[bucket].offset + rank * buckets[bucket].shard;
  }
  // The parameter pieces inside `rank`'s shard, in local order (padding excluded).
  std::vector<ShardPiece> pieces(int rank) const;
  int64_t padding() const;  // total - sum of parameter sizes
};

}  // namespace tessera
