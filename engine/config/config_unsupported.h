// Keys that DeepSpeed reads but tessera does not implement: reported as "unsupported" rather
// than "unknown", with a hint where DeepSpeed renamed or moved the key.
#pragma once

#include <string>

namespace tessera {

struct UnsupportedKey {
  const char* path;  // full JSON path, "zero_optimization.cpu_offload"
  const char* hint;  // what to do instead, or "" when there is nothing to say
};

// nullptr when `path` is not a DeepSpeed key tessera leaves out.
const UnsupportedKey* find_unsupported_key(const std::string& path);

}  // namespace tessera
