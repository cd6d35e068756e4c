// The random draw behind Backend::sample.
//
// Contract: sampling_uniform(seed, step) is a pure function of (seed, step)
// that returns a float in [0, 1). There is no generator state to carry between
// calls, so a request that is replayed, preempted or moved to another backend
// draws the same numbers, and the rows of a batch can be drawn in any order or
// in parallel.
//
// Definition (every backend must compute exactly this; all arithmetic is on
// unsigned 64-bit integers and wraps modulo 2^64, shifts are logical):
//
//   mix64(z)  = z ^= z >> 30; z *= 0xbf58476d1ce4e5b9;
//               z ^= z >> 27; z *= 0x94d049bb133111eb;
//               z ^= z >> 31                     (the SplitMix64 finaliser)
//   h         = mix64(mix64(seed + G) + (step + 1) * G),  G = 0x9e3779b97f4a7c15
//   u         = float(h >> 40) * 2^-24
//
// The inner mix64 decorrelates neighbouring seeds before the step is added,
// so (seed, step + 1) and (seed + 1, step) are unrelated draws. The top 24
// bits of h convert to float exactly, so u is one of the 2^24 evenly spaced
// values 0, 2^-24, ..., 1 - 2^-24 and never rounds up to 1. A CUDA kernel
// reproduces it with uint64_t arithmetic and __uint2float_rn(h >> 40) *
// 0x1p-24f, which are exact as well.
#pragma once

#include <cstdint>

namespace basalt {

constexpr uint64_t sampling_mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z;
}

constexpr uint64_t sampling_hash(uint64_t seed, uint64_t step) {
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  return sampling_mix64(sampling_mix64(seed + kGolden) + (step + 1) * kGolden);
}

constexpr float sampling_uniform(uint64_t seed, uint64_t step) {
  return static_cast<float>(sampling_hash(seed, step) >> 40) * 0x1p-24f;
}

}  // namespace basalt
