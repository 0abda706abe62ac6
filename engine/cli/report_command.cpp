// `tessera report` (DeepSpeed's ds_report): what this build of tessera is and what works on this
// machine: versions (tessera, LibTorch, CUDA, NCCL, the compiler), the CPU's features that decide
// speed (the Adam kernel's ISA, bf16 arithmetic) and what they mean, the optional parts compiled in
// (CUDA, NCCL, io_uring, libaio) and whether they work here (a GPU found, a kernel I/O queue
// opened), and the Python packages the optional integrations need.
#include <cstdio>
#include <memory>
#include <string>

#include <torch/version.h>

#include "csrc/aio/kernel_queue.h"
#include "csrc/cpu_adam.h"
#include "csrc/cpu_features.h"
#include "csrc/device_stream.h"
#include "engine/cli/commands.h"

#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/NCCLUtils.hpp>
#endif

namespace tessera {

namespace {

void row(const std::string& what, const std::string& value) { std::printf("  %-24s %s\n", what.c_str(), value.c_str()); }

std::string yes_no(bool ok, const std::string& detail) { return std::string(ok ? "yes" : "no") + (detail.empty() ? "" : " (" + detail + ")"); }

// The optional Python packages, as the configured interpreter sees them (one short run of it).
std::string python_packages() {
  const std::string script =
      "import importlib.metadata as m\n"
      "for p in ('tessera', 'torch', 'safetensors', 'tensorboard', 'wandb', 'comet_ml', 'transformers', 'deepspeed'):\n"
      "    try: print('%-24s %s' % (p, m.version(p)))\n"
      "    except m.PackageNotFoundError: print('%-24s not installed' % p)\n";
  const std::string command = "'" + python_interpreter() + "' -c \"" + script + "\" 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  if (!pipe) return "  (could not run " + python_interpreter() + ")\n";
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof(buf), pipe.get())) out += std::string("  ") + buf;
  return out.empty() ? "  (" + python_interpreter() + " printed nothing)\n" : out;
}

int run_report() {
  std::printf("tessera report\n\nversions\n");
  row("tessera", "0.1.0");
  row("LibTorch", TORCH_VERSION);
#ifdef __clang__
  row("compiler", std::string("clang ") + __clang_version__);
#else
  row("compiler", std::string("gcc ") + __VERSION__);
#endif
#ifdef TESSERA_WITH_CUDA
  row("CUDA", "compiled in");
#else
  row("CUDA", "not compiled in (CPU ranks only)");
#endif
#ifdef USE_C10D_NCCL
  row("NCCL", c10d::getNcclVersion());
#else
  row("NCCL", "not compiled in (Gloo only)");
#endif

  std::printf("\nCPU\n");
  row("Adam kernel", std::string(isa_name(cpu_adam_best_isa())) +
                         (cpu_adam_best_isa() == Isa::Avx512 ? " (the fastest path)"
                          : cpu_adam_best_isa() == Isa::Avx2 ? " (no AVX-512: about half the host optimizer's speed)"
                                                            : " (no AVX2: the scalar loop, several times slower)"));
  const bool bf16 = cpu_has_fast_bf16();
  row("bf16 arithmetic", bf16 ? "yes" : "no: " + cpu_bf16_missing() + "; bf16 matmuls on CPU ranks run ~11x slower than fp32");

  std::printf("\nhere\n");
  const int gpus = cuda_device_count();
  row("GPUs", gpus > 0 ? std::to_string(gpus) + " (NCCL between them)" : "none (CPU ranks over Gloo)");
  std::string why;
  const bool uring = aio::make_io_uring_queue(8, why) != nullptr;
  row("io_uring queue", yes_no(uring, uring ? "NVMe offload's first choice" : why));
  why.clear();
  const bool libaio = aio::make_libaio_queue(8, why) != nullptr;
  row("libaio queue", yes_no(libaio, libaio ? "" : why));
  if (!uring && !libaio) row("NVMe offload I/O", "threads (pread/pwrite): works, slower than a kernel queue");

  std::printf("\nPython (%s)\n%s", python_interpreter().c_str(), python_packages().c_str());
  return 0;
}

}  // namespace

void register_report_command(CLI::App& app, int& exit_code) {
  CLI::App* sub = app.add_subcommand("report", "versions, CPU features, compiled-in parts and whether they work here (ds_report)");
  sub->callback([&exit_code] { exit_code = run_report(); });
}

}  // namespace tessera
