// The directory that holds a rank's swap files (offload_optimizer.nvme_path, offload_param.nvme_path):
// checked once, before any file is created, so that bad input fails at engine construction naming
// the key, the path and, when space is short, the bytes needed against the bytes free.
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

// Throws std::invalid_argument (empty path) or std::runtime_error (missing, not a directory, not
// writable, `needed_bytes` more than the filesystem has free), each naming `key` and the path.
// `what` names the files in the message ("this rank's optimizer swap files").
void check_swap_directory(const std::string& key, const std::string& dir, int64_t needed_bytes, const std::string& what);

}  // namespace tessera
