// engine/checkpoint/checkpoint_dir.h: a checkpoint appears whole under its tag and only then in
// `latest`; a save killed (SIGKILL) at each point of its commit, or at 10 random moments while it
// writes, leaves `latest` naming a complete checkpoint that reads back.
#include <catch2/catch.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/full.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/safetensors.h"
#include "tests/subprocess.h"

using namespace tessera::checkpoint;
using tessera::testing::contains;

namespace {

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// One checkpoint: a shard file whose values say which save wrote it, and a metadata file.
void save(const std::string& dir, const std::string& tag, const at::Tensor& values, const std::string& crash_at = "") {
  CheckpointWriter writer(dir, tag, crash_at);
  write_safetensors(writer.file("rank0.safetensors"), {{"values", values}});
  write_file_durably(writer.file("metadata.json"), "{\"tag\": \"" + tag + "\"}");
  writer.commit();
}

// The latest checkpoint reads back whole: its shard equals one of the saves' values.
at::Tensor read_back(const std::string& dir) {
  const std::string path = checkpoint_path(dir);
  SafetensorsReader reader(path + "/rank0.safetensors");
  REQUIRE(is_dir(path));
  return reader.read("values");
}

// Runs `save` in a child process that kills itself at `point` (or is killed by the parent after
// `kill_after_us` when that is >= 0); returns whether it died by SIGKILL.
bool save_killed(const std::string& dir, const std::string& tag, const at::Tensor& values, const std::string& point,
                 int kill_after_us = -1) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    try {
      save(dir, tag, values, point);  // the writer dies at `point` (the Engine passes TESSERA_CHECKPOINT_CRASH)
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(0);
  }
  if (kill_after_us >= 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(kill_after_us));
    ::kill(pid, SIGKILL);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

}  // namespace

TEST_CASE("checkpoint directory: a checkpoint appears whole under its tag and then in latest") {
  tessera::testing::TempDir tmp;
  const std::string dir = tmp.file("run/checkpoints");
  CHECK_THROWS_WITH(read_latest(dir), Catch::Contains("no checkpoint in " + dir));
  {
    CheckpointWriter writer(dir, "global_step10");
    write_safetensors(writer.file("rank0.safetensors"), {{"values", at::full({4}, 1.0)}});
    CHECK(is_dir(dir + "/.global_step10.partial"));
    CHECK_FALSE(is_dir(dir + "/global_step10"));  // not before commit
    CHECK_THROWS(read_latest(dir));
    writer.commit();
  }
  CHECK(read_latest(dir) == "global_step10");
  CHECK_FALSE(is_dir(dir + "/.global_step10.partial"));
  save(dir, "global_step20", at::full({4}, 2.0));
  CHECK(read_latest(dir) == "global_step20");
  CHECK(at::equal(read_back(dir), at::full({4}, 2.0)));
  // Saving a tag again replaces it whole.
  save(dir, "global_step10", at::full({4}, 3.0));
  CHECK(read_latest(dir) == "global_step10");
  CHECK(at::equal(read_back(dir), at::full({4}, 3.0)));
  CHECK(checkpoint_path(dir, "global_step20") == dir + "/global_step20");
  CHECK_THROWS_WITH(checkpoint_path(dir, "global_step30"), Catch::Contains("no checkpoint \"global_step30\""));
  for (const char* bad : {"", "a/b", ".hidden", "latest"})
    CHECK_THROWS_WITH(CheckpointWriter(dir, bad), Catch::Contains("must be one path component"));
}

TEST_CASE("checkpoint directory: a save killed at any point leaves latest naming a complete checkpoint") {
  tessera::testing::TempDir tmp;
  const std::string dir = tmp.file("checkpoints");
  const at::Tensor first = at::arange(1 << 22, at::kFloat), second = first * 2;
  save(dir, "first", first);
  // The commit's points: before it, the checkpoint is not there; after the rename it is complete,
  // but latest still names the previous one until it is replaced.
  for (const std::string point : {"before_commit", "after_fsync", "after_rename", "after_latest"}) {
    INFO(point);
    CHECK(save_killed(dir, "second", second, point));
    const bool replaced = point == "after_latest";
    CHECK(read_latest(dir) == (replaced ? "second" : "first"));
    CHECK(at::equal(read_back(dir), replaced ? second : first));
    CHECK(is_dir(dir + "/second") == (point == "after_rename" || replaced));
    save(dir, "first", first);  // back to the start for the next point
  }
  // 10 kills at random moments of a save of 16 MiB: latest always names a checkpoint that reads back.
  std::mt19937 random(17);
  int killed = 0;
  for (int i = 0; i < 10; ++i) {
    const std::string tag = "random" + std::to_string(i);
    killed += save_killed(dir, tag, second + i, "", static_cast<int>(random() % 80000));
    const at::Tensor back = read_back(dir);
    const std::string latest = read_latest(dir);
    INFO(i << ": latest " << latest);
    CHECK((latest == "first" ? at::equal(back, first) : at::equal(back, second + std::stoi(latest.substr(6)))));
  }
  WARN("checkpoint directory: " << killed << " of 10 random kills landed before the save completed");
}
