// The checksum recorded for every tensor of a checkpoint: XXH64 (Yann Collet's xxHash, 64-bit,
// seed 0), written from its published specification. Not cryptographic: it catches truncation, bit
// rot and a shard from another run, at several GB/s on one core, so verifying costs little next
// to the read itself.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::checkpoint {

uint64_t xxh64(const void* data, size_t bytes, uint64_t seed = 0);
// 16 lowercase hex digits, as `xxhsum` prints it.
std::string xxh64_hex(const void* data, size_t bytes);

}  // namespace tessera::checkpoint
