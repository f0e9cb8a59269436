// tree.cpp's part: heap keys and entries, the small-array allocator, the chunk-hash index and the slab.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "tree_status.h"
#include "memory.h"

namespace {

// Global heap: (-(depth << 33 | runs << 32 | requests through the node), arrival, seq); strangers: (0, arrival, seq).
struct Key {
    int64_t n;
    double a;
    uint64_t s;
    bool operator<(const Key& o) const {
        if (n != o.n) return n < o.n;
        if (a != o.a) return a < o.a;
        return s < o.s;
    }
    bool operator==(const Key& o) const { return n == o.n && a == o.a && s == o.s; }
    bool operator!=(const Key& o) const { return !(*this == o); }
    bool operator<=(const Key& o) const { return !(o < *this); }
};

struct AKey {  // (arrival, seq): a request's key, and a node's cached best
    double a;
    uint64_t s;
    bool operator<(const AKey& o) const { return a != o.a ? a < o.a : s < o.s; }
    bool operator==(const AKey& o) const { return a == o.a && s == o.s; }
    bool operator!=(const AKey& o) const { return !(*this == o); }
    bool operator<=(const AKey& o) const { return !(o < *this); }
};

struct CEntry {  // node candidate: a waiting request ending here, or a child keyed by its cached best
    AKey k;
    uint64_t push;
    uint32_t item;
    uint32_t gen;
    bool is_req;
};
struct GEntry {  // global (tier 1) and stranger (tier 2) heaps: one live entry per node
    Key k;
    uint64_t push;
    uint32_t node;
    uint32_t gen;
};
struct AEntry {  // arrival heaps: (arrival, seq) of a waiting request
    AKey k;
    uint32_t req;
    uint32_t gen;
};

// Min-heaps through std::*_heap (which builds max-heaps): "a after b".
struct CAfter {
    bool operator()(const CEntry& x, const CEntry& y) const {
        return y.k < x.k || (y.k == x.k && y.push < x.push);
    }
};
struct GAfter {
    bool operator()(const GEntry& x, const GEntry& y) const {
        return y.k < x.k || (y.k == x.k && y.push < x.push);
    }
};
struct AAfter {
    bool operator()(const AEntry& x, const AEntry& y) const { return y.k < x.k; }
};

template <typename E, typename After, typename V>
void heap_push(V& h, const E& e) {
    h.push_back(e);
    std::push_heap(h.begin(), h.end(), After());
}
template <typename E, typename After, typename V>
void heap_pop(V& h) {
    std::pop_heap(h.begin(), h.end(), After());
    h.pop_back();
}

// A stateless std allocator over a memory source with static `allocate(bytes)` and `release(p, bytes)`.
template <typename T, typename Source>
struct SourceAllocator {
    using value_type = T;
    SourceAllocator() = default;
    template <typename U>
    SourceAllocator(const SourceAllocator<U, Source>&) {}
    T* allocate(size_t n) { return static_cast<T*>(Source::allocate(n * sizeof(T))); }
    void deallocate(T* p, size_t n) { Source::release(p, n * sizeof(T)); }
    template <typename U>
    bool operator==(const SourceAllocator<U, Source>&) const { return true; }
    template <typename U>
    bool operator!=(const SourceAllocator<U, Source>&) const { return false; }
};

// Candidate heaps: one per node, and most hold one or two entries (a new node's holds the one below it), so a
// 10K-token insert would call malloc ~100 times and spread the arrays over fresh heap pages. They come
// instead from per-size free lists (one cache line, two, four, ... up to 4 KiB) carved out of huge-page
// blocks; bigger arrays go to malloc. Blocks are kept for the process's lifetime and reused by every tree
// (all calls run under the GIL).
class SmallArrays {
  public:
    static void* allocate(size_t bytes) {
        size_t c = size_class(bytes);
        if (c >= CLASSES) return alloc_bytes(bytes);
        Free*& head = free_[c];
        if (head != nullptr) {
            Free* p = head;
            head = p->next;
            return p;
        }
        size_t size = LINE << c;
        if (left_ < size) {
            cursor_ = static_cast<char*>(alloc_bytes(BLOCK));
            left_ = BLOCK;
        }
        void* p = cursor_;
        cursor_ += size;
        left_ -= size;
        return p;
    }
    static void release(void* p, size_t bytes) {
        size_t c = size_class(bytes);
        if (c >= CLASSES) return free_bytes(p, bytes);
        Free* f = static_cast<Free*>(p);
        f->next = free_[c];
        free_[c] = f;
    }

  private:
    struct Free {
        Free* next;
    };
    static constexpr size_t LINE = 64, CLASSES = 7, BLOCK = size_t{1} << 21;
    static size_t size_class(size_t bytes) {
        size_t c = 0;
        while ((LINE << c) < bytes) ++c;
        return c;
    }
    static inline Free* free_[CLASSES] = {};
    static inline char* cursor_ = nullptr;
    static inline size_t left_ = 0;
};

template <typename T>
using SmallArrayAllocator = SourceAllocator<T, SmallArrays>;

using Candidates = std::vector<CEntry, SmallArrayAllocator<CEntry>>;

// ------------------------------------------------------------------------------------------- hash map

// Chunk hash -> node id. A released node's entry is not erased: it goes stale (each entry records its node's
// generation, and releasing a node bumps it), so finishing a request touches none of its nodes' slots. A
// stale entry is overwritten when its hash comes back and dropped when the table is rebuilt; rebuilds happen
// when live + stale entries reach half the slots (4x larger if more than a quarter are live, else the same
// size), so every rebuild is paid for by a quarter of the table's inserts.
class HashIndex {
  public:
    explicit HashIndex(const std::vector<uint32_t>& gens) : gens_(gens), slots_(64) {}

    uint32_t find(uint64_t key) const {
        size_t mask = slots_.size() - 1;
        for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
            const Slot& s = slots_[i];
            if (s.val == VACANT) return NIL;
            if (s.key == key) return live(s) ? s.val : NIL;
        }
    }

    bool insert(uint64_t key, uint32_t val) {  // false if present
        if ((size_ + 1) * 2 > slots_.size()) rebuild(live_ * 4 < slots_.size() ? slots_.size() : slots_.size() * 4);
        size_t mask = slots_.size() - 1;
        for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
            Slot& s = slots_[i];
            if (s.val == VACANT) {
                s = Slot{key, val, gens_[val]};
                ++size_;
                ++live_;
                return true;
            }
            if (s.key == key) {
                if (live(s)) return false;
                s = Slot{key, val, gens_[val]};
                ++live_;
                return true;
            }
        }
    }

    // Removes a live entry at once (an insert rolled back); released nodes go through `forget` instead.
    void erase(uint64_t key) {
        size_t mask = slots_.size() - 1;
        size_t i = mix(key) & mask;
        while (slots_[i].key != key || slots_[i].val == VACANT) {
            if (slots_[i].val == VACANT) return;
            i = (i + 1) & mask;
        }
        if (live(slots_[i])) --live_;
        for (size_t j = (i + 1) & mask; slots_[j].val != VACANT; j = (j + 1) & mask) {
            size_t home = mix(slots_[j].key) & mask;
            // Move j into the hole at i unless its home lies cyclically in (i, j].
            bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
            if (!stays) {
                slots_[i] = slots_[j];
                i = j;
            }
        }
        slots_[i].val = VACANT;
        --size_;
    }

    // A node was released (its generation already bumped): its `count` entries are stale from now on.
    void forget(size_t count) { live_ -= count; }

    // Points a live entry at another node (a tail's chunk that became its own node).
    void assign(uint64_t key, uint32_t val) {
        size_t mask = slots_.size() - 1;
        for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
            Slot& s = slots_[i];
            if (s.val == VACANT) return;
            if (s.key == key) {
                s.val = val;
                s.gen = gens_[val];
                return;
            }
        }
    }

    size_t size() const { return live_; }

    void clear() {
        ZeroedArray<Slot> fresh(64);
        fresh.swap(slots_);
        size_ = live_ = 0;
    }

    size_t count_live() const {
        size_t n = 0;
        for (const Slot& s : slots_) n += s.val != VACANT && live(s);
        return n;
    }

    void prefetch(uint64_t key) const { FEATHER_PREFETCH(&slots_[mix(key) & (slots_.size() - 1)]); }

  private:
    static constexpr uint32_t VACANT = ROOT;  // the value of an empty slot: the root has no hash
    struct Slot {
        uint64_t key;
        uint32_t val;
        uint32_t gen;
    };
    bool live(const Slot& s) const { return gens_[s.val] == s.gen; }
    static uint64_t mix(uint64_t x) {
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdULL;
        x ^= x >> 33;
        x *= 0xc4ceb9fe1a85ec53ULL;
        x ^= x >> 33;
        return x;
    }
    // Live entries only, into `capacity` slots; each entry's new slot is prefetched a few entries ahead so the
    // misses overlap. Growing 4x rehashes a third as many entries over a tree's growth as doubling.
    void rebuild(size_t capacity) {
        ZeroedArray<Slot> old(capacity);
        old.swap(slots_);
        size_ = 0;
        size_t mask = capacity - 1;
        constexpr size_t AHEAD = 16;
        auto kept = [&](size_t i) { return old[i].val != VACANT && live(old[i]); };
        for (size_t i = 0; i < std::min(AHEAD, old.size()); ++i)
            if (kept(i)) FEATHER_PREFETCH(&slots_[mix(old[i].key) & mask], 1);
        for (size_t i = 0; i < old.size(); ++i) {
            if (i + AHEAD < old.size() && kept(i + AHEAD)) FEATHER_PREFETCH(&slots_[mix(old[i + AHEAD].key) & mask], 1);
            if (!kept(i)) continue;
            const Slot& s = old[i];
            for (size_t j = mix(s.key) & mask;; j = (j + 1) & mask) {
                if (slots_[j].val == VACANT) {
                    slots_[j] = s;
                    ++size_;
                    break;
                }
            }
        }
    }
    const std::vector<uint32_t>& gens_;  // the tree's node generations, by node id
    ZeroedArray<Slot> slots_;  // all-zero slots are empty (VACANT)
    size_t size_ = 0;  // live and stale entries
    size_t live_ = 0;
};

// ------------------------------------------------------------------------------------------- slab

// Items in fixed blocks of 2**SHIFT: an id indexes them directly, growth never moves an item (a doubling
// vector of 168-byte nodes copied ~1x its final size, and faulted in twice as much fresh memory, while a tree
// of 10K-token prompts grew). Node blocks are one huge page.
template <typename T, size_t SHIFT>
class Slab {
  public:
    Slab() = default;
    Slab(const Slab&) = delete;
    Slab& operator=(const Slab&) = delete;
    ~Slab() {
        for (size_t i = 0; i < size_; ++i) (*this)[i].~T();
        for (T* block : blocks_) free_bytes(block, (MASK + 1) * sizeof(T));
    }
    T& operator[](size_t i) { return blocks_[i >> SHIFT][i & MASK]; }
    const T& operator[](size_t i) const { return blocks_[i >> SHIFT][i & MASK]; }
    size_t size() const { return size_; }
    void emplace_back() {  // items are constructed one by one as they are used, never a whole block ahead
        if ((size_ & MASK) == 0) blocks_.push_back(static_cast<T*>(alloc_bytes((MASK + 1) * sizeof(T))));
        new (&(*this)[size_]) T();
        ++size_;
    }

  private:
    static constexpr size_t MASK = (size_t{1} << SHIFT) - 1;
    std::vector<T*> blocks_;
    size_t size_ = 0;
};

}  // namespace
