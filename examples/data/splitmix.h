// SplitMix64 (Steele, Lea & Flood 2014): a tiny, good 64-bit mixer, used to derive every random
// choice of the data loaders from (seed, step) so that batches are reproducible on every rank.
#pragma once

#include <cstdint>

namespace tessera::examples {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace tessera::examples
