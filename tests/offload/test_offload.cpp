// NVMe and CPU optimizer offload (offload/optimizer_swapper.h): the swapper against an optimizer
// holding its state in memory (bit-exact, every tile and pipeline setting), the engine on 1 and 2
// ranks at stages 1–3 in fp32 and bf16 against the same run without offload (byte for byte, and
// each against the single-process reference of tests/workers/engine_worker.cpp), the memory it moves out,
// and the failures: a bad nvme_path, LAMB, a disk that fills up mid-run, a stale file.
#include <catch2/catch.hpp>

#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "offload/optimizer_swapper.h"
#include "optim/flat_optimizer.h"
#include "tests/engine_worker_runs.h"
#include "tests/subprocess.h"

using tessera::OptimizerSwapOptions;
using tessera::OptimizerSwapper;
using tessera::ShardSegment;
using tessera::testing::contains;
using tessera::testing::read_file;
using tessera::testing::TempDir;
using tessera::testing::engine_worker::case_outputs;
using tessera::testing::engine_worker::train;

namespace {

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') names.push_back(e->d_name);
    closedir(d);
  }
  return names;
}

// The same with `dir` a 4 MiB tmpfs of its own (a mount namespace: root only); prints "exit=N",
// then "left:" and what the tmpfs holds after the run.
// Whether train_on_small_disk can run here (root and unshare -m); says so when not.
bool can_mount_small_disk() {
  if (geteuid() == 0 && tessera::testing::run({"unshare", "-m", "true"}, {}, 10).status == 0) return true;
  WARN("skipped: needs root and unshare -m to mount a small tmpfs");
  return false;
}

// With `prefill` the tmpfs is full before the run starts.
tessera::testing::RunResult train_on_small_disk(int ranks, const std::vector<std::string>& args, const std::string& dir,
                                                bool prefill = false) {
  std::string command = "mount -t tmpfs -o size=4M tmpfs '" + dir + "' && {";
  if (prefill) command += " dd if=/dev/zero of='" + dir + "/filler' bs=64k 2>/dev/null;";
  for (const std::string& a : {std::string(TESSERA_CLI_PATH), std::string("launch"), std::string("--nproc-per-node"),
                               std::to_string(ranks), std::string("--master-port"),
                               std::to_string(tessera::testing::free_port()), std::string("--"),
                               std::string(TESSERA_ENGINE_WORKER_PATH)})
    command += " '" + a + "'";
  for (const std::string& a : args) command += " '" + a + "'";
  command += "; echo exit=$?; echo left:; ls '" + dir + "'; }";
  return tessera::testing::run({"unshare", "-m", "sh", "-c", command}, {}, 180);
}

}  // namespace

TEST_CASE("optimizer swapper: tiles through files equal the state held in memory (bit-exact)") {
  const int64_t n = 10007;
  for (const std::string type : {"AdamW", "SGD"})
    for (bool mixed : {false, true})
      for (int buffers : {1, 2, 4})
        for (bool pipeline : {false, true}) {
          INFO(type << (mixed ? " bf16" : " fp32") << " buffers " << buffers << (pipeline ? " pipelined" : ""));
          TempDir dir;
          tessera::OptimizerHyperparams hyper;
          hyper.lr = 0.01;
          hyper.weight_decay = 0.1;
          hyper.momentum = 0.9;
          hyper.adam_w_mode = true;
          const auto f32 = at::TensorOptions().dtype(at::kFloat);
          at::Tensor start = at::randn({n}, f32), grads = at::empty({n}, f32);
          // Two segments (buckets) of the shard, as the engine gives them.
          auto segments = [&](const at::Tensor& params, const at::Tensor& copy) {
            std::vector<ShardSegment> s(2);
            const int64_t cut = 6000;
            s[0].local_offset = 0, s[1].local_offset = cut;
            s[0].grads = grads.narrow(0, 0, cut), s[1].grads = grads.narrow(0, cut, n - cut);
            if (params.defined()) s[0].params = params.narrow(0, 0, cut), s[1].params = params.narrow(0, cut, n - cut);
            if (copy.defined()) s[0].compute_copy = copy.narrow(0, 0, cut), s[1].compute_copy = copy.narrow(0, cut, n - cut);
            return s;
          };
          at::Tensor ref_params = start.clone(), ref_copy, swap_params, swap_copy;
          if (mixed) ref_copy = at::empty({n}, f32.dtype(at::kBFloat16)), swap_copy = ref_copy.clone();
          else swap_params = start.clone();
          auto reference = tessera::make_flat_optimizer(type, hyper, n, f32);
          auto offloaded = tessera::make_flat_optimizer(type, hyper, 0, f32);
          CHECK(offloaded->state_bytes() == 0);
          OptimizerSwapOptions o;
          o.path = dir.path;
          o.tile_numel = 1000;
          o.buffer_count = buffers;
          o.pipeline_read = o.pipeline_write = pipeline;
          OptimizerSwapper swapper(o);
          const std::vector<ShardSegment> ref_segments = segments(ref_params, ref_copy);
          const std::vector<ShardSegment> swap_segments = segments(swap_params, swap_copy);
          const int64_t file = swapper.add_group(0, swap_segments, offloaded->state_arrays(), mixed ? start : at::Tensor());
          // 11 tiles (6 + 4 of 1000 elements, one of 7), each slot its arrays packed and aligned.
          const int arrays = (type == "AdamW" ? 2 : 1) + (mixed ? 1 : 0);
          CHECK(file == 10 * tessera::aio_aligned(4000 * arrays) + 4096);
          swapper.create_files();
          CHECK(swapper.resident_bytes() <= buffers * tessera::aio_aligned(1000 * 4 * 3));
          for (int step = 1; step <= 3; ++step) {
            grads.copy_(at::randn({n}, f32));
            tessera::StepInputs in;
            in.step = step, in.lr = 0.01, in.weight_decay = 0.1, in.grad_scale = 0.5;
            reference->step(in, ref_segments);
            int segments_done = 0;
            swapper.step({{0, 1}, {0, 0}},  // any order of segments
                         [&](int, int segment) { return swap_segments[segment]; },
                         [&](int, const ShardSegment& tile, const std::vector<at::Tensor>& state) {
                           offloaded->step_with_state(in, {tile}, state, tile.local_offset);
                         },
                         [&](int, int) { ++segments_done; });
            CHECK(segments_done == 2);
            if (mixed) CHECK(at::equal(swap_copy, ref_copy));
            else CHECK(at::equal(swap_params, ref_params));
          }
          CHECK(swapper.bytes_written() >= 3 * file);
        }
}

TEST_CASE("NVMe offload: stages 1-3 on 1 and 2 ranks in fp32 and bf16 train byte for byte as without it") {
  for (const std::string stage : {"1", "2", "3"})
    for (int ranks : {1, 2})
      for (const std::string dtype : {"fp32", "bf16"}) {
        INFO("stage " << stage << " ranks " << ranks << " " << dtype);
        TempDir dir;
        const std::vector<std::string> common = {"--stage", stage, "--dtype", dtype, "--steps", "4", "--bucket", "300",
                                                 "--units"};
        // One launch: the run without offload, then (--then) the one with it.
        auto args = common;
        args.insert(args.end(), {"--dump", dir.file("plain.bin"), "--then"});
        args.insert(args.end(), common.begin(), common.end());
        // Small tiles (several per bucket), and every other case pipelined with 2 buffers.
        const bool pipeline = (stage == "2") == (ranks == 2);
        args.insert(args.end(), {"--dump", dir.file("nvme.bin"), "--offload", "nvme", "--tile", "50",
                                 "--buffers", pipeline ? "2" : "4"});
        if (pipeline) args.push_back("--pipeline");
        mkdir(dir.file("swap").c_str(), 0700);
        args.insert(args.end(), {"--nvme-path", dir.file("swap")});
        auto run = train(ranks, args);
        INFO(run.output);
        REQUIRE(run.status == 0);
        const std::vector<std::string> outputs = case_outputs(run.output);
        REQUIRE(outputs.size() == 2);
        CHECK(contains(outputs[1], "engine ok"));
        CHECK(read_file(dir.file("nvme.bin")) == read_file(dir.file("plain.bin")));
        CHECK(read_file(dir.file("plain.bin")).size() > 4 * 8);
        CHECK(files_in(dir.file("swap")).empty());  // removed when the engine went
      }
}

TEST_CASE("CPU offload on a CPU rank trains byte for byte as without it") {
  TempDir dir;
  auto run = train(2, {"--stage", "2", "--steps", "3", "--dump", dir.file("plain.bin"), "--then", "--stage", "2",
                       "--steps", "3", "--offload", "cpu", "--dump", dir.file("cpu.bin")});
  INFO(run.output);
  REQUIRE(run.status == 0);
  CHECK(read_file(dir.file("cpu.bin")) == read_file(dir.file("plain.bin")));
}

// The GPU ranks' path for offload_optimizer cpu and nvme (host copies of the gradient shard, and of
// the parameters in fp32; the CPU steps those; each updated chunk copied back before its
// allgather), and at stage 3 for offload_param cpu (the shard in host memory is the optimizer's
// copy, and goes to the gathered buffer before each allgather), taken on CPU ranks with
// TESSERA_HOST_STAGING=1: every copy is CPU to CPU, so all but the streams is checked here, byte
// for byte against training without offload.
TEST_CASE("The GPU ranks' host path (TESSERA_HOST_STAGING): offload cpu and nvme at stages 1-3 train byte for byte",
          "[slow]") {
  const std::regex memory("memory: params (\\d+) master (\\d+) grads (\\d+) states (\\d+) buckets \\d+ host (\\d+) "
                          "host-params (\\d+)");
  for (const std::string stage : {"1", "2", "3"})
    for (int ranks : {1, 2})
      for (const std::string dtype : {"fp32", "bf16"}) {
        INFO("stage " << stage << " ranks " << ranks << " " << dtype);
        TempDir dir;
        // On 2 ranks with accumulation: at stages 2-3 the host adds up the micro-steps' chunks.
        const std::vector<std::string> common = {"--stage", stage, "--dtype", dtype, "--steps", "3", "--bucket", "300",
                                                 "--units", "--memory", "--gas", ranks == 2 ? "2" : "1"};
        // NVMe everywhere (small tiles, every other case pipelined), CPU on 2 ranks, and at stage 3
        // each with the parameter shards in host memory too, or in NVMe files. One launch runs the
        // run without offload (case 0) and then each of these (the worker's --then).
        std::vector<std::string> variants = {"nvme"};
        if (ranks == 2) variants.push_back("cpu");
        if (stage == "3") variants.insert(variants.end(), {"nvme+params", "cpu+params", "cpu+nvme-params", "nvme+nvme-params"});
        std::vector<std::string> args = common;
        args.insert(args.end(), {"--dump", dir.file("plain.bin")});
        mkdir(dir.file("swap").c_str(), 0700);
        mkdir(dir.file("param-swap").c_str(), 0700);
        for (const std::string& variant : variants) {
          const std::string device = variant.substr(0, variant.find('+'));
          const bool params = variant != device, params_in_files = variant.find("nvme-params") != std::string::npos;
          args.push_back("--then");
          args.insert(args.end(), common.begin(), common.end());
          args.insert(args.end(), {"--dump", dir.file(variant + ".bin"), "--offload", device});
          if (params_in_files)
            args.insert(args.end(), {"--offload-param", "nvme", "--param-path", dir.file("param-swap"), "--param-buffers", "2"});
          else if (params)
            args.insert(args.end(), {"--offload-param", "cpu"});
          if (device == "nvme") {
            args.insert(args.end(), {"--nvme-path", dir.file("swap"), "--tile", "50", "--buffers", "2"});
            if ((stage == "2") == (ranks == 2)) args.push_back("--pipeline");
          }
        }
        auto staged = train(ranks, args, {{"TESSERA_HOST_STAGING", "1"}});
        INFO(staged.output);
        REQUIRE(staged.status == 0);
        const std::vector<std::string> outputs = case_outputs(staged.output);
        REQUIRE(outputs.size() == variants.size() + 1);
        for (size_t v = 0; v < variants.size(); ++v) {
          const std::string& variant = variants[v];
          INFO(variant);
          const bool params = variant.find('+') != std::string::npos;
          CHECK(read_file(dir.file(variant + ".bin")) == read_file(dir.file("plain.bin")));
          // The host path was taken: the optimizer's buffers are reported as host memory (with
          // NVMe the master, in bf16, and the state are in the file, its tile buffers in memory),
          // and with offload_param the shards (nothing persistent here) as well; at stages 2-3 the
          // device keeps no gradient shard (each reduced chunk went to the host).
          std::smatch m;
          REQUIRE(std::regex_search(outputs[v + 1], m, memory));
          CHECK(std::stoll(m[2]) == 0);
          CHECK((std::stoll(m[3]) == 0) == (stage != "1"));
          CHECK(std::stoll(m[4]) == 0);
          CHECK(std::stoll(m[5]) > 0);
          CHECK((std::stoll(m[6]) > 0) == params);
          if (params) CHECK(std::stoll(m[1]) == 0);
        }
        CHECK(files_in(dir.file("swap")).empty());  // the swap files are removed when each engine goes
        CHECK(files_in(dir.file("param-swap")).empty());
      }
}

// offload_optimizer.delayed_param_update (ZeRO-Offload's DPU) on the GPU ranks' host path: after
// the warm-up each step's host update runs on a thread of its own while the next forward and
// backward run on the parameters from before it. Against the worker's reference that delays its
// updates the same way (fp32: within 2e-5 everywhere), and against references that do not (an
// update applied early, or one step late, is a MISMATCH).
TEST_CASE("Delayed parameter update (TESSERA_HOST_STAGING): ZeRO 1-3 on 1 and 2 ranks in fp32 and bf16, the state in "
          "memory and in NVMe files, match a reference delayed the same way and no other") {
  const std::map<std::string, std::string> staging{{"TESSERA_HOST_STAGING", "1"}};
  for (int ranks : {1, 2}) {  // one launch on each number of ranks runs its six cases in turn (--then)
    TempDir dir;
    std::vector<std::string> args, names;
    for (const std::string stage : {"1", "2", "3"})
      for (const std::string dtype : {"fp32", "bf16"}) {
        // Accumulation, clipping and plain SGD (a wrong gradient scale shows) in some of them; the
        // state streamed from NVMe files in tiles in the others.
        const bool nvme = (stage == "2") != (ranks == 2);
        if (!names.empty()) args.push_back("--then");
        args.insert(args.end(), {"--stage", stage, "--dtype", dtype, "--steps", "6", "--bucket", "300", "--units",
                                 "--offload", nvme ? "nvme" : "cpu", "--delayed", ranks == 1 ? "0" : "2"});
        if (nvme) args.insert(args.end(), {"--nvme-path", dir.path, "--tile", "50", "--buffers", "2", "--pipeline"});
        if (stage == "1") args.insert(args.end(), {"--gas", "2", "--clip", "0.5"});
        if (dtype == "fp32" && ranks == 2) args.insert(args.end(), {"--optimizer", "sgd-plain"});
        names.push_back("stage " + stage + " ranks " + std::to_string(ranks) + " " + dtype + (nvme ? " nvme" : ""));
      }
    auto run = train(ranks, args, staging);
    INFO(run.output);
    CHECK(run.status == 0);
    const std::vector<std::string> outputs = case_outputs(run.output);
    REQUIRE(outputs.size() == names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      INFO(names[i]);
      CHECK(contains(outputs[i], "engine ok"));
    }
  }
  for (const std::string reference : {"-1", "3"}) {
    auto run = train(1, {"--stage", reference == "3" ? "3" : "2", "--steps", "6", "--offload", "cpu", "--delayed", "2",
                         "--units", "--reference-delay", reference}, staging);
    INFO(run.output);
    CHECK(run.status != 0);
    CHECK(contains(run.output, "engine MISMATCH"));
  }
}

TEST_CASE("Delayed parameter update refuses what it cannot run by name: CPU ranks - ZeRO-3 shards on the host - LAMB") {
  const std::map<std::string, std::string> staging{{"TESSERA_HOST_STAGING", "1"}};
  const std::string key = "zero_optimization.offload_optimizer.delayed_param_update.enabled: true ";
  auto cpu = train(1, {"--stage", "2", "--offload", "cpu", "--delayed", "1"});
  CHECK(contains(cpu.output, key + "overlaps the host's optimizer step with the GPU's"));
  auto stage3 = train(1, {"--stage", "3", "--offload", "cpu", "--offload-param", "cpu", "--delayed", "1"}, staging);
  CHECK(contains(stage3.output, key + "with zero_optimization.offload_param.device \"cpu\": the delayed update would write"));
  auto lamb = train(1, {"--stage", "2", "--optimizer", "lamb", "--offload", "cpu", "--delayed", "1"}, staging);
  CHECK(contains(lamb.output, key + "needs optimizer.type Adam, AdamW or SGD (found Lamb)"));
  for (const auto* r : {&cpu, &stage3, &lamb}) CHECK(r->status != 0);
}

TEST_CASE("NVMe offload refuses a bad nvme_path and LAMB by name before training") {
  TempDir dir;
  auto missing = train(1, {"--stage", "2", "--offload", "nvme", "--nvme-path", dir.file("nope")});
  CHECK(missing.status != 0);
  CHECK(contains(missing.output, dir.file("nope") + " does not exist"));
  std::FILE* f = std::fopen(dir.file("plain").c_str(), "w");
  std::fclose(f);
  auto not_dir = train(1, {"--stage", "2", "--offload", "nvme", "--nvme-path", dir.file("plain")});
  CHECK(contains(not_dir.output, "is not a directory"));
  auto lamb = train(1, {"--stage", "2", "--optimizer", "lamb", "--offload", "nvme", "--nvme-path", dir.path});
  CHECK(lamb.status != 0);
  CHECK(contains(lamb.output, "Lamb cannot do"));
}

TEST_CASE("NVMe offload: a disk that fills up mid-run stops training naming the file - no swap file stays") {
  if (!can_mount_small_disk()) return;
  TempDir dir;
  // A 4 MiB tmpfs of its own: the files fit at construction (the check passes); then another
  // writer takes the space and the first step's write fails.
  const std::string swap = dir.file("swap");
  mkdir(swap.c_str(), 0700);
  auto r = train_on_small_disk(2, {"--stage", "2", "--steps", "3", "--offload", "nvme", "--fill-nvme", "--nvme-path", swap},
                               swap);
  INFO(r.output);
  CHECK(contains(r.output, "No space left on device"));
  CHECK(contains(r.output, swap + "/tessera-optimizer-rank"));
  CHECK_FALSE(contains(r.output, "exit=0"));
  const std::string left = r.output.substr(r.output.find("left:"));  // `ls` of the tmpfs after the failure
  CHECK(contains(left, "filler"));
  CHECK_FALSE(contains(left, ".swp"));
}

TEST_CASE("NVMe offload replaces a stale swap file without reading it") {
  TempDir dir;
  const std::string swap = dir.file("swap");
  mkdir(swap.c_str(), 0700);
  {
    std::ofstream stale(swap + "/tessera-optimizer-rank0-group0.swp", std::ios::binary);
    stale << std::string(1 << 20, '\x7f');  // garbage a killed run might leave
  }
  auto plain = train(1, {"--stage", "2", "--steps", "3", "--dump", dir.file("plain.bin")});
  auto nvme = train(1, {"--stage", "2", "--steps", "3", "--offload", "nvme", "--dump", dir.file("nvme.bin"),
                        "--nvme-path", swap});
  INFO(nvme.output);
  REQUIRE(nvme.status == 0);
  CHECK(contains(nvme.output, "replacing the stale optimizer swap file"));
  CHECK(read_file(dir.file("nvme.bin")) == read_file(dir.file("plain.bin")));
  CHECK(files_in(swap).empty());
}

TEST_CASE("NVMe offload: peak RSS falls by at least 80% of the optimizer state it moves out (2 ranks - 50M params)") {
  // tests/workers/engine_worker.cpp --rss: a 50M-parameter MLP at stage 2 on 2 ranks, large blocks unmapped
  // when freed (TESSERA_CPU_BLOCK_CACHE_MIB=0) so the peak is what was live (tests/zero/test_memory.cpp).
  // In bf16 the fp32 master moves out too.
  TempDir dir;
  for (const std::string dtype : {"fp32", "bf16"}) {
    auto peak = [&](bool nvme) {
      std::vector<std::string> argv = {TESSERA_CLI_PATH, "launch", "--nproc-per-node", "2", "--master-port",
                                       std::to_string(tessera::testing::free_port()), "--timeout", "120", "--",
                                       TESSERA_ENGINE_WORKER_PATH, "--rss", "--stage", "2", "--dtype", dtype,
                                       "--hidden", "1024", "--layers", "48", "--mb", "2", "--steps", "3",
                                       "--bucket", "4000000"};
      if (nvme) argv.insert(argv.end(), {"--offload", "nvme", "--nvme-path", dir.path, "--tile", "1000000", "--pipeline"});
      auto r = tessera::testing::run(argv, {{"TESSERA_CPU_BLOCK_CACHE_MIB", "0"}}, 300);
      INFO(r.output);
      REQUIRE(r.status == 0);
      std::smatch m, mem;
      REQUIRE(std::regex_search(r.output, m, std::regex("peak rss stage 2 dtype \\w+: (\\d+) (\\d+)")));
      REQUIRE(std::regex_search(r.output, mem, std::regex("master (\\d+) grads \\d+ states (\\d+)")));
      std::printf("%s %s: %s, %s\n", dtype.c_str(), nvme ? "nvme" : "none", m[0].str().c_str(), mem[0].str().c_str());
      // peak rank 0, peak rank 1, master + states in memory
      return std::vector<int64_t>{std::stoll(m[1]), std::stoll(m[2]), std::stoll(mem[1]) + std::stoll(mem[2])};
    };
    const std::vector<int64_t> plain = peak(false), nvme = peak(true);
    const int64_t moved = plain[2] - nvme[2];  // optimizer state (and master) no longer in memory
    const int arrays = dtype == "fp32" ? 2 : 3;
    const int64_t tiles = 4 * tessera::aio_aligned(int64_t(1000000) * 4 * arrays);
    INFO(dtype);
    CHECK(nvme[2] <= tiles);  // the engine holds the tile buffers only
    CHECK(moved >= plain[2] - tiles);
    for (int rank = 0; rank < 2; ++rank) {
      INFO("rank " << rank << ": peak " << plain[rank] << " -> " << nvme[rank] << " bytes, moved out " << moved);
      CHECK(plain[rank] - nvme[rank] >= 0.8 * double(moved));
    }
    CHECK(files_in(dir.path).empty());
  }
}

// ---- parameter offload (offload/parameter_swapper.h): ZeRO-3's parameter shards in files -------

TEST_CASE("NVMe parameter offload: stage 3 on 1 and 2 ranks in fp32 and bf16 trains byte for byte as without it") {
  // With the optimizer's state in files too (ZeRO-Infinity) or not, one buffer or several; then
  // LAMB (its step brings the shard into memory whole), a model built partitioned, persistent and
  // partitioned tensors in one run, and gradient accumulation with clipping, on 2 ranks.
  std::vector<std::vector<std::string>> cases;
  for (const std::string ranks : {"1", "2"})
    for (const std::string dtype : {"fp32", "bf16"})
      for (const std::string optimizer_offload : {"none", "nvme"})
        cases.push_back({ranks, "--dtype", dtype, "--offload", optimizer_offload, "--param-buffers",
                         optimizer_offload == "nvme" ? "1" : "3"});
  for (const std::vector<std::string>& extra : std::vector<std::vector<std::string>>{
           {"--optimizer", "lamb"}, {"--init"}, {"--persist", "40"}, {"--gas", "2", "--clip", "0.1", "--optimizer", "sgd"}}) {
    cases.push_back({"2"});
    cases.back().insert(cases.back().end(), extra.begin(), extra.end());
  }
  for (const auto& c : cases) {
    std::string name;
    for (const auto& a : c) name += a + " ";
    INFO("ranks " << name);
    TempDir dir;
    const std::string params = dir.file("params"), states = dir.file("states");
    mkdir(params.c_str(), 0700);
    mkdir(states.c_str(), 0700);
    std::vector<std::string> common = {"--stage", "3", "--steps", "4", "--bucket", "300", "--units"};
    common.insert(common.end(), c.begin() + 1, c.end());
    for (size_t i = 0; i + 1 < common.size(); ++i)
      if (common[i] == "--offload" && common[i + 1] == "none") common.erase(common.begin() + i, common.begin() + i + 2);
    auto plain_args = common;
    for (size_t i = 0; i + 1 < plain_args.size(); ++i)  // the same run, nothing offloaded
      if (plain_args[i] == "--offload" || plain_args[i] == "--param-buffers")
        plain_args.erase(plain_args.begin() + i, plain_args.begin() + i + 2), --i;
    // One launch: the plain run, then (--then) the offloaded one.
    auto args = plain_args;
    args.insert(args.end(), {"--dump", dir.file("plain.bin"), "--then"});
    args.insert(args.end(), common.begin(), common.end());
    args.insert(args.end(), {"--dump", dir.file("nvme.bin"), "--offload-param", "nvme", "--param-path", params,
                             "--nvme-path", states, "--tile", "50"});
    auto run = train(std::stoi(c[0]), args);
    INFO(run.output);
    REQUIRE(run.status == 0);
    const std::vector<std::string> outputs = case_outputs(run.output);
    REQUIRE(outputs.size() == 2);
    CHECK(contains(outputs[1], "engine ok"));
    CHECK(read_file(dir.file("nvme.bin")) == read_file(dir.file("plain.bin")));
    CHECK(files_in(params).empty());  // removed when the engine went
    CHECK(files_in(states).empty());
  }
}

TEST_CASE("CPU parameter offload on a CPU rank trains byte for byte as without it") {
  TempDir dir;
  const std::vector<std::string> common = {"--stage", "3", "--steps", "3", "--bucket", "300", "--units"};
  auto args = common;
  args.insert(args.end(), {"--dump", dir.file("plain.bin"), "--then"});
  args.insert(args.end(), common.begin(), common.end());
  args.insert(args.end(), {"--offload-param", "cpu", "--offload", "cpu", "--dump", dir.file("cpu.bin")});
  auto run = train(2, args);
  INFO(run.output);
  REQUIRE(run.status == 0);
  CHECK(read_file(dir.file("cpu.bin")) == read_file(dir.file("plain.bin")));
}

TEST_CASE("NVMe parameter offload refuses a bad nvme_path and a buffer_size below a bucket's chunk by name") {
  TempDir dir;
  const std::vector<std::string> stage3 = {"--stage", "3", "--bucket", "300", "--units", "--offload-param", "nvme"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), stage3.begin(), stage3.end());
    return train(1, extra);
  };
  auto missing = with({"--param-path", dir.file("nope")});
  CHECK(missing.status != 0);
  CHECK(contains(missing.output, "zero_optimization.offload_param.nvme_path " + dir.file("nope") + " does not exist"));
  auto small = with({"--param-path", dir.path, "--param-buffer-size", "10"});
  CHECK(small.status != 0);
  CHECK(contains(small.output, "zero_optimization.offload_param.buffer_size is 10 elements; the largest bucket's chunk"));
  CHECK(files_in(dir.path).empty());
}

TEST_CASE("NVMe parameter offload: a disk without room for the shards fails at construction naming the bytes") {
  // The shards are written whole at construction and only overwritten in place after it, so a disk
  // that fills up later cannot fail them; one without room fails before training, naming the path.
  if (!can_mount_small_disk()) return;
  TempDir dir;
  const std::string swap = dir.file("swap");
  mkdir(swap.c_str(), 0700);
  auto r = train_on_small_disk(2, {"--stage", "3", "--steps", "3", "--bucket", "300", "--units", "--offload-param",
                                   "nvme", "--param-path", swap},
                               swap, /*prefill=*/true);
  INFO(r.output);
  CHECK(contains(r.output, "zero_optimization.offload_param.nvme_path " + swap + " has 0 bytes free; this rank's "
                           "parameter swap files need"));
  CHECK_FALSE(contains(r.output, "exit=0"));
  const std::string left = r.output.substr(r.output.find("left:"));
  CHECK(contains(left, "filler"));
  CHECK_FALSE(contains(left, ".swp"));
}

TEST_CASE("NVMe parameter offload replaces a stale swap file without reading it") {
  TempDir dir;
  const std::string swap = dir.file("swap");
  mkdir(swap.c_str(), 0700);
  {
    std::ofstream stale(swap + "/tessera-param-rank0-group0.swp", std::ios::binary);
    stale << std::string(1 << 20, '\x7f');
  }
  const std::vector<std::string> common = {"--stage", "3", "--steps", "3", "--bucket", "300", "--units"};
  auto plain_args = common, nvme_args = common;
  plain_args.insert(plain_args.end(), {"--dump", dir.file("plain.bin")});
  nvme_args.insert(nvme_args.end(), {"--offload-param", "nvme", "--param-path", swap, "--dump", dir.file("nvme.bin")});
  auto plain = train(1, plain_args), nvme = train(1, nvme_args);
  INFO(nvme.output);
  REQUIRE(nvme.status == 0);
  CHECK(contains(nvme.output, "replacing the stale parameter swap file"));
  CHECK(read_file(dir.file("nvme.bin")) == read_file(dir.file("plain.bin")));
  CHECK(files_in(swap).empty());
}
