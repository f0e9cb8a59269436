// tree.cpp's part: the constants its parts share (the empty handle, the compaction floor) and its status codes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace {

constexpr uint32_t NIL = 0xFFFFFFFFu;
constexpr uint32_t ROOT = 0;
constexpr size_t COMPACT_MIN = 64;

enum Status : int64_t {
    OK = 0,
    EMPTY = -1,
    INVALID_TOKENS = -2,
    HASH_CHAIN = -3,
    BAD_HASH = -4,
    BAD_STATE = -5,
    ALREADY_SUSPENDED = -6,
    NOT_SUSPENDED = -7,
    BAD_ARRIVAL = -8,
};

enum State : uint8_t { FREE = 0, WAITING = 1, ACTIVE = 2 };

}  // namespace
