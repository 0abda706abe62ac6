// Keys that DeepSpeed reads but tessera does not implement: reported as "unsupported" rather
// than "unknown", with a hint where DeepSpeed renamed or moved the key.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace tessera {

struct UnsupportedKey {
  const char* path;  // full JSON path, "zero_optimization.cpu_offload"
  const char* hint;  // what to do instead, or "" when there is nothing to say
  // DeepSpeed's default as JSON text: a config that sets the key to it changes nothing and is
  // accepted without a word. kDisabledSection: a section whose "enabled" is false. nullptr: none.
  const char* deepspeed_default = nullptr;
  // A feature outside tessera's scope (compression, data efficiency, ...): its name, for the error.
  const char* out_of_scope = nullptr;
};

inline constexpr const char* kDisabledSection = "{\"enabled\": false}";

// nullptr when `path` is not a DeepSpeed key tessera leaves out.
const UnsupportedKey* find_unsupported_key(const std::string& path);

// Whether `value` is DeepSpeed's default for the key (so setting it changes nothing).
bool is_deepspeed_default(const UnsupportedKey& key, const nlohmann::json& value);

}  // namespace tessera
