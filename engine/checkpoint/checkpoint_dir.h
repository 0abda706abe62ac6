// The life of a checkpoint directory, so that a run killed at any moment leaves the previous
// checkpoint intact and `latest` naming a complete one:
//
//   save_dir/
//     global_step120/             a complete checkpoint (its tag)
//     .global_step140.partial/    one being written: never read, removed by the next save of that tag
//     latest                      the newest complete tag, replaced by a rename
//
// CheckpointWriter creates the partial directory; the caller writes every file into it (each one
// fsynced: write_safetensors and write_file_durably do); commit() fsyncs the directory, renames it
// to its tag (an older checkpoint of the same tag is moved aside first and removed after), fsyncs
// save_dir, and only then replaces `latest` (written as latest.tmp, fsynced, renamed, save_dir
// fsynced). On several ranks the engine has one rank create and commit, the others write between
// two barriers.
//
// SaveOptions::crash_at (TESSERA_CHECKPOINT_CRASH, read by the Engine: engine/environment.h) kills
// the process with SIGKILL at that point of commit(), for the crash tests: after_shard_write (this rank's file written: the engine's save), before_commit (files
// written, not yet committed), after_fsync, after_rename, after_latest.
#pragma once

#include <string>

namespace tessera::checkpoint {

class CheckpointWriter {
 public:
  // `crash_at`: the crash tests' point to die at (crash_point), empty for none.
  CheckpointWriter(std::string save_dir, std::string tag, std::string crash_at = "");
  ~CheckpointWriter();  // an uncommitted partial directory stays (a crash leaves one too); the next save removes it
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  const std::string& partial_dir() const { return partial_; }
  std::string file(const std::string& name) const { return partial_ + "/" + name; }
  // Makes the checkpoint durable under its tag, then names it in `latest`.
  void commit();

 private:
  std::string crash_at_;
  std::string save_dir_, tag_, partial_;
  bool committed_ = false;
};

// Where CheckpointWriter(save_dir, tag) writes: save_dir/.TAG.partial (the other ranks write there too).
std::string partial_dir_of(const std::string& save_dir, const std::string& tag);

// The tag `latest` names in save_dir; throws std::runtime_error naming save_dir when there is no
// `latest` or it names a directory that does not exist.
std::string read_latest(const std::string& save_dir);
// The path of checkpoint `tag` in save_dir (tag empty: the latest), checked to exist.
std::string checkpoint_path(const std::string& save_dir, const std::string& tag = "");

// `text` into `path` through `path`.tmp: written, fsynced, renamed, the directory fsynced.
void write_file_durably(const std::string& path, const std::string& text);

// SIGKILL here when `at` names `point` (the crash tests: SaveOptions::crash_at, from
// TESSERA_CHECKPOINT_CRASH through engine/environment.h).
void crash_point(const std::string& at, const char* point);

// A tag is one path component: not empty, no '/', not starting with '.', not "latest".
void check_tag(const std::string& tag);

}  // namespace tessera::checkpoint
