#include "examples/train_args.h"

#include <ATen/ops/full.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "parallel/parallel_context.h"

namespace tessera::examples {

namespace {
int64_t integer(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    const long long v = std::stoll(value, &used);
    if (used == value.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(flag + ": not a non-negative integer: " + value);
}
}  // namespace

TrainArgs parse_train_args(int argc, char** argv, const char* usage) {
  TrainArgs a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::puts(usage);
      std::exit(0);
    }
    if (flag == "--checkpoint-activations") {
      a.checkpoint_activations = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value\n" + usage);
    const std::string value = argv[++i];
    if (flag == "--config") a.config = value;
    else if (flag == "--steps") a.steps = integer(flag, value);
    else if (flag == "--seed") a.seed = static_cast<uint64_t>(integer(flag, value));
    else if (flag == "--eval-every") a.eval_every = integer(flag, value);
    else throw std::invalid_argument("unknown flag " + flag + "\n" + usage);
  }
  if (a.config.empty() || a.steps < 1)
    throw std::invalid_argument(std::string("--config FILE and --steps N (N >= 1) are required\n") + usage);
  return a;
}

double data_parallel_mean(ParallelContext& ctx, double value) {
  at::Tensor t = at::full({1}, value, at::kDouble);
  ctx.data().all_reduce(t, ReduceOp::Avg);
  return t.item<double>();
}

}  // namespace tessera::examples
