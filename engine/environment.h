// The environment variables that change what the engine does with the data, read only here (by the
// Engine: at construction, and the crash point at each save) and handed down as options; the
// layers below read none of them:
//   TESSERA_HOST_STAGING=1       CPU ranks take the GPU ranks' host path for optimizer offload
//                                (ZeroOptions::host_staging_on_cpu), so it is tested without a GPU
//   TESSERA_CHECKPOINT_CRASH=P   a save kills the process at point P (SaveOptions::crash_at): the
//                                crash tests' hook (before_commit, after_fsync, after_rename,
//                                after_latest, after_shard_write)
//   TESSERA_CHECKPOINT_WRITE_DELAY_MS=N   a save's file writes start N ms late (SaveOptions::
//                                write_delay_ms): the asynchronous-save tests' hook, so that
//                                training has changed the engine's buffers before the write
//   TESSERA_TEST_SPECULATION_FAULT=F   super_offload's speculated step with a deliberate fault F
//                                (early, unchecked, unrestored; ZeroOptions::speculation_fault): the
//                                tests that show its checks can fail
// Tuning knobs that pick a kernel or size an allocator (TESSERA_CPU_*, TESSERA_AIO_BACKEND,
// TESSERA_HEAP_TRIM_MIB, ...) stay with the code they tune: they change no result.
#pragma once

#include <cstdlib>
#include <string>

namespace tessera {

struct EngineEnvironment {
  bool host_staging_on_cpu = false;
  std::string checkpoint_crash_at;
  int checkpoint_write_delay_ms = 0;
  std::string speculation_fault;

  static EngineEnvironment read() {
    EngineEnvironment e;
    const char* staging = std::getenv("TESSERA_HOST_STAGING");
    e.host_staging_on_cpu = staging != nullptr && std::string(staging) == "1";
    if (const char* at = std::getenv("TESSERA_CHECKPOINT_CRASH")) e.checkpoint_crash_at = at;
    if (const char* ms = std::getenv("TESSERA_CHECKPOINT_WRITE_DELAY_MS")) e.checkpoint_write_delay_ms = std::atoi(ms);
    if (const char* fault = std::getenv("TESSERA_TEST_SPECULATION_FAULT")) e.speculation_fault = fault;
    return e;
  }
};

}  // namespace tessera
