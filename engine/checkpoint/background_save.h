// checkpoint.async_save: the part of a save that writes files, run by a thread of its own while
// training goes on. The save call itself copies this rank's tensors to host memory (a snapshot:
// training may change the engine's buffers right after) and returns; the thread hashes and writes
// the rank's file, then exchanges the ranks' entries and commits (metadata.json, then `latest`)
// over a communicator of its own ("world" on the "checkpoint" channel), so that its collectives
// never interleave with the training step's. Atomicity is the synchronous save's: until the commit
// the previous `latest` is the one that loads.
//
// The next save, a load, and the engine's end wait for it (wait()); an error of the thread (a full
// disk on any rank) is raised there, on every rank, naming the checkpoint.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <thread>

namespace tessera {

class BackgroundSave {
 public:
  // Starts `write` on a thread. `host_bytes`: the snapshot it holds until its file is written.
  BackgroundSave(std::string path, int64_t host_bytes, std::function<void()> write);
  ~BackgroundSave();  // waits; an error not taken by wait() is printed, not thrown
  BackgroundSave(const BackgroundSave&) = delete;
  BackgroundSave& operator=(const BackgroundSave&) = delete;

  // Blocks until the checkpoint is committed; rethrows the thread's error (once).
  void wait();
  const std::string& path() const { return path_; }
  int64_t host_bytes() const { return host_bytes_; }
  double seconds() const { return seconds_; }  // the thread's time, once it has ended
  bool done() const { return done_.load(); }    // the thread has ended (wait() returns at once)

 private:
  std::string path_;
  int64_t host_bytes_ = 0;
  double seconds_ = 0;
  std::exception_ptr error_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace tessera
