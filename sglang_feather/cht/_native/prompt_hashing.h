// tree.cpp's part: prompts hashed into cumulative chunk digests, and token ids and chunk hashes read from Python.
#pragma once

#include <Python.h>
#include <nanobind/nanobind.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "tree_status.h"
#include "memory.h"
#include "xxh64.h"

namespace nb = nanobind;

namespace {

// Token sources for hashing: `word(k)` is tokens k and k + 1 as one little-endian u64 (two 4-byte ids),
// `one(k)` token k as a u32; `valid()` says whether every id read lies in [0, 2**32). A contiguous buffer is
// read in place (no packed copy): u32 ids need no check, i32 ids a sign check on the words, wider or
// narrower ones are packed two at a time with any bit at or above 2**32 (negative values included) recorded.
struct U32Tokens {
    const unsigned char* p;
    uint64_t word(size_t k) const { return read64(p + 4 * k); }
    uint32_t one(size_t k) const { return read32(p + 4 * k); }
    void prefetch(size_t k) const { FEATHER_PREFETCH(p + 4 * k); }
    bool valid() const { return true; }
};

struct I32Tokens {
    const unsigned char* p;
    uint64_t sign = 0;
    uint64_t word(size_t k) {
        uint64_t w = read64(p + 4 * k);
        sign |= w;
        return w;
    }
    uint32_t one(size_t k) {
        uint32_t w = read32(p + 4 * k);
        sign |= w;
        return w;
    }
    void prefetch(size_t k) const { FEATHER_PREFETCH(p + 4 * k); }
    bool valid() const { return (sign & 0x8000000080000000ULL) == 0; }
};

template <typename T>
struct WideTokens {
    const T* p;
    uint64_t high = 0;
    static uint64_t bits(T v) { return static_cast<uint64_t>(static_cast<int64_t>(v)); }
    uint64_t word(size_t k) {
        uint64_t a = bits(p[k]), b = bits(p[k + 1]);
        high |= a | b;
        return (a & 0xFFFFFFFFULL) | (b << 32);
    }
    uint32_t one(size_t k) {
        uint64_t a = bits(p[k]);
        high |= a;
        return static_cast<uint32_t>(a);
    }
    void prefetch(size_t k) const { FEATHER_PREFETCH(p + k); }
    bool valid() const { return (high >> 32) == 0; }
};


// Digests of every prefix of `n` tokens ending at b = chunk, 2 chunk, ..., n (the last one may be partial):
// xxh64 over the ids as 4-byte little-endian words, the xxhash package's digests. False if an id lies outside
// [0, 2**32) (then `out` is garbage). Two passes: the first runs the four accumulators over the whole prompt
// (long dependent chains, one round per 8 bytes each) and records them at every chunk boundary; the second
// finalises each digest from its accumulators and the few ids after the last whole stripe. A digest's
// finalisation is a chain of ~15 dependent multiplies; in a pass of their own the digests are independent
// and overlap (a warm 10K-token insert: 7.9 -> 7.6 µs).
constexpr size_t PREFETCH_TOKENS = 1024;  // how far ahead of the stripe loop prompts are prefetched (see below)

template <typename Src>
bool cumulative_xxh64(Src& src, size_t n, size_t chunk, uint64_t seed, std::vector<Lanes>& lanes,
                      std::vector<uint64_t>& out) {
    size_t count = (n + chunk - 1) / chunk;
    lanes.resize(count);
    out.resize(count);
    Lanes* at = lanes.data();
    auto [v1, v2, v3, v4] = initial_lanes(seed);
    size_t done = 0;  // tokens folded into v1..v4 (a multiple of 8: 32-byte stripes)
    for (size_t i = 0; i < count; ++i) {
        size_t end = std::min((i + 1) * chunk, n);
        for (; done + 8 <= end; done += 8) {
            src.prefetch(done + PREFETCH_TOKENS);
            v1 = round64(v1, src.word(done));
            v2 = round64(v2, src.word(done + 2));
            v3 = round64(v3, src.word(done + 4));
            v4 = round64(v4, src.word(done + 6));
        }
        at[i] = Lanes{v1, v2, v3, v4};
    }
    uint64_t* dst = out.data();
    for (size_t i = 0; i < count; ++i) {
        size_t end = std::min((i + 1) * chunk, n);
        dst[i] = finish(at[i], end, seed, src);
    }
    return src.valid();
}

// Scratch arrays hashing reuses: packed ids (strided buffers only) and accumulators.
struct HashScratch {
    std::vector<uint32_t> ids;
    std::vector<Lanes> lanes;
};

template <typename T>
bool hash_strided(const char* base, size_t n, Py_ssize_t stride, size_t chunk, uint64_t seed, HashScratch& scratch,
                  std::vector<uint64_t>& out) {
    std::vector<uint32_t>& ids = scratch.ids;
    ids.resize(n);
    uint64_t high = 0;
    for (size_t i = 0; i < n; ++i) {
        T v;
        std::memcpy(&v, base + static_cast<Py_ssize_t>(i) * stride, sizeof(T));
        uint64_t bits = WideTokens<T>::bits(v);
        high |= bits;
        ids[i] = static_cast<uint32_t>(bits);
    }
    U32Tokens src{reinterpret_cast<const unsigned char*>(ids.data())};
    cumulative_xxh64(src, n, chunk, seed, scratch.lanes, out);
    return (high >> 32) == 0;
}

template <typename T>
bool hash_typed(const char* base, size_t n, Py_ssize_t stride, size_t chunk, uint64_t seed, HashScratch& scratch,
                std::vector<uint64_t>& out) {
    if (stride != static_cast<Py_ssize_t>(sizeof(T))) return hash_strided<T>(base, n, stride, chunk, seed, scratch, out);
    const auto* bytes = reinterpret_cast<const unsigned char*>(base);
    if constexpr (std::is_same_v<T, uint32_t>) {
        U32Tokens src{bytes};
        return cumulative_xxh64(src, n, chunk, seed, scratch.lanes, out);
    } else if constexpr (std::is_same_v<T, int32_t>) {
        I32Tokens src{bytes};
        return cumulative_xxh64(src, n, chunk, seed, scratch.lanes, out);
    } else {
        WideTokens<T> src{reinterpret_cast<const T*>(base)};
        return cumulative_xxh64(src, n, chunk, seed, scratch.lanes, out);
    }
}

// Buffers (array.array, numpy) read in place: 1-D, integer ids or hashes in native byte order. Anything else
// (a big-endian dtype, floats, 2-D) gets NOT_IN_PLACE and goes the way the Python tree takes it.
constexpr int64_t NOT_IN_PLACE = 1;

struct IntFormat {
    size_t itemsize = 0;  // 0: not an integer buffer this code reads in place
    bool is_signed = false;
};

IntFormat int_format(const Py_buffer& view) {
    const char* fmt = view.format ? view.format : "B";
    while (*fmt == '@' || *fmt == '=' || *fmt == '<') ++fmt;  // native order (the build is little-endian)
    if (view.ndim != 1 || fmt[0] == '\0' || fmt[1] != '\0') return {};
    if (std::strchr("bhilqn", fmt[0])) return {static_cast<size_t>(view.itemsize), true};
    if (std::strchr("BHILQN", fmt[0])) return {static_cast<size_t>(view.itemsize), false};
    return {};
}

// `f(T{})` with T the integer type of that width and signedness; false for any other width.
template <typename F>
bool with_int_type(const IntFormat& format, F&& f) {
    switch (format.itemsize) {
        case 8: return format.is_signed ? f(int64_t{}) : f(uint64_t{});
        case 4: return format.is_signed ? f(int32_t{}) : f(uint32_t{});
        case 2: return format.is_signed ? f(int16_t{}) : f(uint16_t{});
        case 1: return format.is_signed ? f(int8_t{}) : f(uint8_t{});
        default: return false;
    }
}

// A buffer's view for reading it in place (released on scope exit); `readable()` when it is a 1-D integer
// buffer in native byte order.
class IntBuffer {
  public:
    explicit IntBuffer(PyObject* obj) : held_(PyObject_GetBuffer(obj, &view_, PyBUF_FORMAT | PyBUF_STRIDES) == 0) {
        if (held_) format = int_format(view_);
        else PyErr_Clear();
    }
    ~IntBuffer() {
        if (held_) PyBuffer_Release(&view_);
    }
    IntBuffer(const IntBuffer&) = delete;
    IntBuffer& operator=(const IntBuffer&) = delete;
    bool readable() const { return format.itemsize != 0; }
    const char* base() const { return static_cast<const char*>(view_.buf); }
    size_t size() const { return static_cast<size_t>(view_.shape[0]); }
    Py_ssize_t stride() const { return view_.strides[0]; }
    IntFormat format;

  private:
    Py_buffer view_;
    bool held_;
};

// Status of hashing a buffer of token ids into its cumulative chunk digests.
int64_t hash_tokens(PyObject* obj, size_t chunk, uint64_t seed, HashScratch& scratch, std::vector<uint64_t>& out) {
    IntBuffer ids(obj);
    if (!ids.readable()) return NOT_IN_PLACE;
    if (ids.size() == 0) return EMPTY;
    bool ok = with_int_type(ids.format, [&](auto type) {
        return hash_typed<decltype(type)>(ids.base(), ids.size(), ids.stride(), chunk, seed, scratch, out);
    });
    return ok ? OK : INVALID_TOKENS;
}

// A list or tuple of ints packed into u32 ids (what `token_bytes` does, without struct.pack): OK, EMPTY,
// INVALID_TOKENS for an int outside [0, 2**32), or NOT_IN_PLACE for any other sequence, or an item that is not
// exactly an int (those go through `token_bytes` itself).
int64_t pack_list(PyObject* obj, std::vector<uint32_t>& ids) {
    if (!PyList_CheckExact(obj) && !PyTuple_CheckExact(obj)) return NOT_IN_PLACE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    if (n == 0) return EMPTY;
    PyObject** items = PySequence_Fast_ITEMS(obj);
    ids.resize(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (!PyLong_CheckExact(items[i])) return NOT_IN_PLACE;
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (overflow != 0 || v < 0 || v > 0xFFFFFFFFLL) return INVALID_TOKENS;
        ids[static_cast<size_t>(i)] = static_cast<uint32_t>(v);
    }
    return OK;
}

template <typename T>
bool read_typed(const char* base, size_t n, Py_ssize_t stride, uint64_t* out) {
    bool ok = true;
    for (size_t i = 0; i < n; ++i) {
        T v;
        std::memcpy(&v, base + static_cast<Py_ssize_t>(i) * stride, sizeof(T));
        if constexpr (std::is_signed_v<T>) ok &= v >= 0;
        out[i] = static_cast<uint64_t>(v);
    }
    return ok;
}

// Status of reading a buffer of hashes in place (every value must lie in [0, 2**64)).
int64_t read_hash_buffer(PyObject* obj, std::vector<uint64_t>& out) {
    IntBuffer hashes(obj);
    if (!hashes.readable()) return NOT_IN_PLACE;
    out.resize(hashes.size());
    bool ok = with_int_type(hashes.format, [&](auto type) {
        return read_typed<decltype(type)>(hashes.base(), hashes.size(), hashes.stride(), out.data());
    });
    return !ok ? BAD_HASH : out.empty() ? EMPTY : OK;
}

// Clears the Python error a refused hash list raised when it is one `checked_hashes` turns into HashChainError
// (TypeError, OverflowError, ValueError); any other error (an iterator's own) propagates, as it does there.
void clear_refusal() {
    if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_OverflowError) &&
        !PyErr_ExceptionMatches(PyExc_ValueError))
        throw nb::python_error();
    PyErr_Clear();
}

// One chunk hash: an int (or anything with __index__) in [0, 2**64), as array('Q', ...) takes it; false, with
// no Python error set, for anything else.
bool read_hash(PyObject* item, uint64_t& out) {
    unsigned long long v;
    if (PyLong_CheckExact(item)) {
        v = PyLong_AsUnsignedLongLong(item);
    } else {
        PyObject* index = PyNumber_Index(item);
        if (index == nullptr) {
            clear_refusal();
            return false;
        }
        v = PyLong_AsUnsignedLongLong(index);
        Py_DECREF(index);
    }
    if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
        clear_refusal();
        return false;
    }
    out = v;
    return true;
}

// Status of reading chunk hashes (any sequence of integers in [0, 2**64), like array('Q', ...)) into `out`.
int64_t read_hashes(PyObject* obj, std::vector<uint64_t>& out) {
    // array('Q', ...) refuses bytes and str too (even empty ones)
    if (PyBytes_Check(obj) || PyByteArray_Check(obj) || PyUnicode_Check(obj)) return BAD_HASH;
    PyObject* seq = PySequence_Fast(obj, "hashes must be a sequence");
    if (seq == nullptr) {
        clear_refusal();
        return BAD_HASH;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject** items = PySequence_Fast_ITEMS(seq);
    out.resize(static_cast<size_t>(n));
    int64_t status = n == 0 ? EMPTY : OK;
    for (Py_ssize_t i = 0; i < n && status == OK; ++i)
        if (!read_hash(items[i], out[static_cast<size_t>(i)])) status = BAD_HASH;
    Py_DECREF(seq);
    return status;
}

// A key to look up as a chunk hash the way a dict of int hashes would (tree.py's `h in self._cache`): ints,
// anything with __index__, and integral floats in [0, 2**64); false for any other hashable, which can name no
// cached hash. Raises Python's TypeError for an unhashable item, as the dict lookup does.
bool lookup_hash(PyObject* item, uint64_t& out) {
    if (PyFloat_Check(item)) {
        double v = PyFloat_AS_DOUBLE(item);
        if (!(v >= 0.0 && v < 18446744073709551616.0) || std::floor(v) != v) return false;
        out = static_cast<uint64_t>(v);
        return true;
    }
    if (PyLong_Check(item) || PyIndex_Check(item)) return read_hash(item, out);
    if (PyObject_Hash(item) == -1) throw nb::python_error();
    return false;
}

// Whether this machine stores integers little-endian (checked at import where the compiler does not say).
inline bool little_endian() {
    const uint32_t one = 1;
    unsigned char first;
    std::memcpy(&first, &one, 1);
    return first == 1;
}

}  // namespace
