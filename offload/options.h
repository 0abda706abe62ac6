// The NVMe swappers' sizes, each default written once (DeepSpeed's): the swappers' options
// (offload/optimizer_swapper.h, offload/parameter_swapper.h), the config's offload sections and the
// memory estimator take them from here. Plain constants: the config includes this, not the swappers.
#pragma once

#include <cstdint>

namespace tessera {

inline constexpr int64_t kOptimizerSwapTileNumel = 1'000'000'000;   // zero_optimization.sub_group_size
inline constexpr int kOptimizerSwapBufferCount = 4;                  // offload_optimizer.buffer_count
inline constexpr int kParameterSwapBufferCount = 5;                  // offload_param.buffer_count
inline constexpr int64_t kParameterSwapBufferNumel = 100'000'000;    // offload_param.buffer_size

}  // namespace tessera
