#include "examples/train_args.h"

#include <ATen/ops/full.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
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
    else if (flag == "--save-parameters") a.save_parameters = value;
    else if (flag == "--save") a.save = value;
    else if (flag == "--load") a.load = value;
    else if (flag == "--n-layer") a.n_layer = integer(flag, value);
    else if (flag == "--n-head") a.n_head = integer(flag, value);
    else if (flag == "--n-embd") a.n_embd = integer(flag, value);
    else if (flag == "--seq-len") a.seq_len = integer(flag, value);
    else if (flag == "--timeline") a.timeline = value;
    else throw std::invalid_argument("unknown flag " + flag + "\n" + usage);
  }
  if (a.config.empty() || a.steps < 1)
    throw std::invalid_argument(std::string("--config FILE and --steps N (N >= 1) are required\n") + usage);
  return a;
}

void write_parameters(const std::string& path, const std::vector<at::Tensor>& tensors) {
  const std::string partial = path + ".partial";
  std::FILE* f = std::fopen(partial.c_str(), "wb");
  if (!f) throw std::runtime_error("--save-parameters: cannot create " + partial + ": " + std::strerror(errno));
  bool ok = true;
  for (const at::Tensor& t : tensors) {
    const at::Tensor values = t.detach().to(at::kCPU, at::kFloat).contiguous();
    const size_t n = static_cast<size_t>(values.numel());
    ok = ok && std::fwrite(values.data_ptr<float>(), sizeof(float), n, f) == n;
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(partial.c_str(), path.c_str()) != 0) {
    std::remove(partial.c_str());
    throw std::runtime_error("--save-parameters: writing " + path + " failed: " + std::strerror(errno));
  }
}

double data_parallel_mean(ParallelContext& ctx, double value) {
  at::Tensor t = at::full({1}, value, at::kDouble);
  ctx.data().all_reduce(t, ReduceOp::Avg);
  return t.item<double>();
}

}  // namespace tessera::examples
