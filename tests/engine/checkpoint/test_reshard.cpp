// engine/checkpoint/reshard.h without ranks: the whole parameter's indices of a slice's elements
// agree with tensor_parallel_slice (the cut the model makes), fused blocks and data ranges included.
#include <catch2/catch.hpp>

#include <ATen/ops/arange.h>

#include <vector>

#include "engine/checkpoint/reshard.h"
#include "parallel/tensor_parallel/regions.h"

using namespace tessera;
using namespace tessera::checkpoint;

TEST_CASE("reshard: a slice's elements named in the whole parameter are tensor_parallel_slice's", "[checkpoint]") {
  const std::vector<int64_t> shape{12, 6};
  const at::Tensor whole = at::arange(72, at::TensorOptions().dtype(at::kLong)).view(shape);
  for (const TensorSplit split : {TensorSplit{0, 1}, TensorSplit{0, 3}, TensorSplit{1, 1}, TensorSplit{1, 3}})
    for (int64_t ranks : {1, 2}) {
      if (split.fused * ranks > shape[split.dim]) continue;
      for (int64_t rank = 0; rank < ranks; ++rank) {
        INFO("dim " << split.dim << " fused " << split.fused << " rank " << rank << " of " << ranks);
        const at::Tensor slice = tensor_parallel_slice(whole, rank, ranks, split.dim, split.fused).reshape(-1);
        CHECK(whole_indices(shape, split, rank, ranks, 0, slice.numel()).equal(slice));
        // A data-parallel rank's range of the slice (ZeRO partitions the flat slice).
        CHECK(whole_indices(shape, split, rank, ranks, 5, 7).equal(slice.narrow(0, 5, 7)));
      }
    }
  CHECK(whole_indices(shape, TensorSplit{}, 0, 1, 3, 4).equal(at::arange(3, 7, at::TensorOptions().dtype(at::kLong))));
  CHECK(whole_shape_of({4, 6}, TensorSplit{0, 3}, 3) == std::vector<int64_t>{12, 6});
  CHECK_THROWS_WITH(whole_indices(shape, TensorSplit{1, 3}, 0, 4, 0, 1),
                    Catch::Contains("6 entries along dimension 1, which do not divide into 3 fused block(s) over 4"));
}
