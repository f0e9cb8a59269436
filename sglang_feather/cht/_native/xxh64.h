// xxh64 over 4-byte little-endian token ids, the pieces the compiled tree (tree.cpp, prompt_hashing.h) shares:
// the primes, one round, the four accumulators and a digest's finalisation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace {

constexpr uint64_t P1 = 11400714785074694791ULL;
constexpr uint64_t P2 = 14029467366897019727ULL;
constexpr uint64_t P3 = 1609587929392839161ULL;
constexpr uint64_t P4 = 9650029242287828579ULL;
constexpr uint64_t P5 = 2870177450012600261ULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t read64(const unsigned char* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}
inline uint32_t read32(const unsigned char* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline uint64_t round64(uint64_t acc, uint64_t lane) {
    acc += lane * P2;
    acc = rotl(acc, 31);
    return acc * P1;
}
inline uint64_t merge64(uint64_t acc, uint64_t v) {
    acc ^= round64(0, v);
    return acc * P1 + P4;
}

struct Lanes {  // xxh64's four accumulators after some number of whole 32-byte stripes (8 token ids)
    uint64_t v1, v2, v3, v4;
    bool operator==(const Lanes& o) const { return v1 == o.v1 && v2 == o.v2 && v3 == o.v3 && v4 == o.v4; }
    bool operator!=(const Lanes& o) const { return !(*this == o); }
};

inline Lanes initial_lanes(uint64_t seed) { return Lanes{seed + P1 + P2, seed + P2, seed, seed - P1}; }

// The digest of the first `end` tokens from the accumulators over the whole stripes among them: `src.word(k)`
// reads tokens k and k + 1 as one little-endian u64, `src.one(k)` token k (only the ids after the last whole
// stripe are read). The xxhash package's `xxh64_intdigest` of the same bytes.
template <typename Src>
inline uint64_t finish(const Lanes& l, size_t end, uint64_t seed, Src& src) {
    uint64_t h;
    if (end >= 8) {
        h = rotl(l.v1, 1) + rotl(l.v2, 7) + rotl(l.v3, 12) + rotl(l.v4, 18);
        h = merge64(h, l.v1);
        h = merge64(h, l.v2);
        h = merge64(h, l.v3);
        h = merge64(h, l.v4);
    } else {
        h = seed + P5;
    }
    h += static_cast<uint64_t>(end) * 4;
    size_t k = end & ~size_t{7};
    for (; k + 2 <= end; k += 2) {
        h ^= round64(0, src.word(k));
        h = rotl(h, 27) * P1 + P4;
    }
    if (k < end) {
        h ^= static_cast<uint64_t>(src.one(k)) * P1;
        h = rotl(h, 23) * P2 + P3;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

}  // namespace
