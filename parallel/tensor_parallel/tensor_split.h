// How a tensor-parallel parameter is cut over the tensor group, as data: what the engine keeps per
// parameter so that a checkpoint can say which elements of the whole parameter each slice holds,
// and a load at another tensor-parallel degree can find them (engine/checkpoint/reshard.h).
// tensor_parallel_slice (regions.h) is the cut itself.
#pragma once

#include <cstdint>

namespace tessera {

struct TensorSplit {
  int64_t dim = -1;   // the dimension split over the tensor ranks; -1: replicated (every rank whole)
  int64_t fused = 1;  // that dimension is this many equal blocks (q|k|v), each split, the pieces concatenated
  bool sharded() const { return dim >= 0; }
  bool operator==(const TensorSplit& o) const { return dim == o.dim && fused == o.fused; }
  bool operator!=(const TensorSplit& o) const { return !(*this == o); }
};

}  // namespace tessera
