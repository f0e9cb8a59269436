// An engine's KV-cache pages as the CHT's chunks: the compiled twin of sglang_feather/sglang/page_runs.py.
//
// How it works. An engine that pages its KV cache reports a stored chain of pages (below a parent page, with
// their token ids) and the pages it evicts, each page named by the engine's own opaque 64-bit hash. The
// cache tier wants chunk hashes instead (the xxh64 of every token up to a chunk boundary), so each stored
// chain becomes a *run*: its start offset, the xxh64 accumulators over the whole 8-token stripes before it,
// its token ids from that stripe on, and, for every chunk that ends inside it, that chunk's hash and the
// accumulators at the chunk end's stripe. A page hash maps to (run, index) in one open-addressing table. A
// chain stored below a page of an earlier run resumes that run's accumulators at the last chunk end at or
// before the page's end and folds in fewer than a chunk of tokens, so an event costs O(its pages + tokens +
// one chunk), never a re-hash of its prefix. A chunk is cached once the page holding its last token is;
// evicting a page uncaches the chunk its first token belongs to, if that chunk ends in the page's run (the
// cache tier drops whatever extends it). A run is freed with its last mapped page, so memory follows the
// engine's cache. Malformed events (tokens that do not fill the pages, a page named twice, a parent page
// never seen or past its run's tokens, ids outside [0, 2**32), hashes outside int64) are refused whole and
// change nothing, exactly as the Python twin refuses them; tests hold the two equal.

#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "memory.h"
#include "xxh64.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

constexpr size_t STRIPE = 8;  // tokens per xxh64 stripe (32 bytes)
constexpr size_t AHEAD = 16;  // how many pages ahead a batch of map updates prefetches their slots
// How many list items ahead the readers prefetch the int objects: an engine's ints live wherever Python's
// allocator put them, so reading a fresh event's 10K page hashes one after another missed the cache on most.
constexpr Py_ssize_t AHEAD_ITEMS = 16;

inline uint64_t floor_stripe(uint64_t x) { return x & ~uint64_t{STRIPE - 1}; }

// A Python int in int64 as its two's-complement bits (an engine's page hash); false for anything else. On
// CPython 3.11 an int of up to 63 bits is read from its 30-bit digits directly: the API's overflow-checked
// loop was the largest single cost of a page-size-1 event (each page is a 3-digit int).
bool read_page(PyObject* o, uint64_t& out) {
    if (!PyLong_CheckExact(o)) return false;
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30 && !defined(Py_LIMITED_API)
    Py_ssize_t size = Py_SIZE(o);
    Py_ssize_t n = size < 0 ? -size : size;
    const digit* d = reinterpret_cast<PyLongObject*>(o)->ob_digit;
    if (n < 3 || (n == 3 && d[2] < 8)) {  // magnitude below 2**63
        uint64_t mag = 0;
        for (Py_ssize_t i = n; i-- > 0;) mag = (mag << 30) | d[i];
        out = size < 0 ? uint64_t{0} - mag : mag;
        return true;
    }
#endif
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow != 0) return false;
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
    }
    out = static_cast<uint64_t>(v);
    return true;
}

// A token id in [0, 2**32): a Python int or anything with __index__ (numpy scalars), as struct.pack reads it.
// One-digit ints (ids below 2**30: every vocabulary) are read in place on CPython 3.11, as pages are.
bool read_token(PyObject* o, uint32_t& out) {
    long long v;
    if (PyLong_CheckExact(o)) {
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30 && !defined(Py_LIMITED_API)
        Py_ssize_t size = Py_SIZE(o);
        if (size == 0 || size == 1) {
            out = size ? static_cast<uint32_t>(reinterpret_cast<PyLongObject*>(o)->ob_digit[0]) : 0;
            return true;
        }
#endif
        int overflow = 0;
        v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow != 0) return false;
    } else {
        PyObject* index = PyNumber_Index(o);
        if (index == nullptr) {
            PyErr_Clear();
            return false;
        }
        int overflow = 0;
        v = PyLong_AsLongLongAndOverflow(index, &overflow);
        Py_DECREF(index);
        if (overflow != 0) return false;
    }
    if (v < 0 || v > 0xFFFFFFFFll) return false;
    out = static_cast<uint32_t>(v);
    return true;
}

// A list or tuple (anything else is copied into a list first, as PySequence_Fast does); null if not iterable.
nb::object fast_sequence(nb::handle o) {
    PyObject* seq = PySequence_Fast(o.ptr(), "expected a sequence");
    if (seq == nullptr) {
        PyErr_Clear();
        return nb::object();
    }
    return nb::steal(seq);
}

struct Place {  // where a page lives: run id (0: nowhere) and its index in the run's pages
    uint32_t run = 0;
    uint32_t index = 0;
};

// Page hash -> place: linear probing over a power-of-two table at most half full, backward-shift deletion
// (so there are no tombstones), keys mixed so that small or sequential test hashes spread too. The table is a
// `ZeroedArray` (an all-zero slot is empty), so a large one is huge pages that the kernel zeroes: the 8 MiB
// table of 200K pages (page size 1) faulted in 4 KiB pages cost ~5x the stores themselves.
class PageMap {
  public:
    PageMap() : slots_(64) {}

    size_t size() const { return size_; }

    Place find(uint64_t key) const {
        size_t mask = slots_.size() - 1;
        for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
            const Slot& s = slots_[i];
            if (s.place.run == 0) return Place{};
            if (s.key == key) return s.place;
        }
    }

    // Room for `n` more keys with no growth in between (so prefetched slots stay where they are).
    void reserve(size_t n) {
        while ((size_ + n) * 2 > slots_.size()) grow();
    }

    // The key's home slot and the line after it (a probe or a deletion's backward shift runs into it).
    void prefetch(uint64_t key) const {
        size_t i = mix(key) & (slots_.size() - 1);
        FEATHER_PREFETCH(&slots_[i], 1);
        FEATHER_PREFETCH(&slots_[(i + SLOTS_PER_LINE) & (slots_.size() - 1)], 1);
    }

    // Maps `key` to `place`; returns the place it had (run 0: none).
    Place put(uint64_t key, Place place) {
        if ((size_ + 1) * 2 > slots_.size()) grow();
        size_t mask = slots_.size() - 1;
        for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
            Slot& s = slots_[i];
            if (s.place.run == 0) {
                s = Slot{key, place};
                ++size_;
                return Place{};
            }
            if (s.key == key) return std::exchange(s.place, place);
        }
    }

    // Unmaps `key`; returns the place it had (run 0: none).
    Place take(uint64_t key) {
        size_t mask = slots_.size() - 1;
        size_t i = mix(key) & mask;
        for (;; i = (i + 1) & mask) {
            if (slots_[i].place.run == 0) return Place{};
            if (slots_[i].key == key) break;
        }
        Place had = slots_[i].place;
        for (size_t j = (i + 1) & mask; slots_[j].place.run != 0; j = (j + 1) & mask) {
            size_t home = mix(slots_[j].key) & mask;
            // Move j into the hole at i unless its home lies cyclically in (i, j].
            bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
            if (!stays) {
                slots_[i] = slots_[j];
                i = j;
            }
        }
        slots_[i].place = Place{};
        --size_;
        return had;
    }

    void clear() {
        ZeroedArray<Slot> fresh(64);
        fresh.swap(slots_);
        size_ = 0;
    }

    template <typename F>
    void for_each(F&& f) const {
        for (const Slot& s : slots_)
            if (s.place.run != 0) f(s.key, s.place);
    }

  private:
    struct Slot {
        uint64_t key = 0;
        Place place;
    };
    static constexpr size_t SLOTS_PER_LINE = 64 / sizeof(Slot);
    static uint64_t mix(uint64_t x) {
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdULL;
        x ^= x >> 33;
        return x;
    }
    void grow() {
        ZeroedArray<Slot> old(slots_.size() * 2);
        old.swap(slots_);
        size_t mask = slots_.size() - 1;
        for (const Slot& s : old) {
            if (s.place.run == 0) continue;
            size_t i = mix(s.key) & mask;
            while (slots_[i].place.run != 0) i = (i + 1) & mask;
            slots_[i] = s;
        }
    }
    ZeroedArray<Slot> slots_;
    size_t size_ = 0;
};

// Token ids from `data`, whose first id is token `base` of the prompt (finish() reads absolute offsets).
struct RunTokens {
    const uint32_t* data;
    uint64_t base;
    uint64_t word(size_t k) const { return read64(reinterpret_cast<const unsigned char*>(data + (k - base))); }
    uint32_t one(size_t k) const { return data[k - base]; }
};

// Folds tokens [from, to) (both stripe-aligned) of `src` into `lanes`.
inline void advance(Lanes& l, const RunTokens& src, uint64_t from, uint64_t to) {
    for (uint64_t k = from; k < to; k += STRIPE) {
        l.v1 = round64(l.v1, src.word(k));
        l.v2 = round64(l.v2, src.word(k + 2));
        l.v3 = round64(l.v3, src.word(k + 4));
        l.v4 = round64(l.v4, src.word(k + 6));
    }
}

struct Run {
    uint64_t start = 0;  // token offset of its first page
    uint64_t base = 0;   // `start` rounded down to a stripe: tokens[0] is token `base`
    Lanes lanes{};       // xxh64 accumulators over tokens [0, base)
    std::vector<uint32_t> tokens;  // tokens [base, end): those before `start` are the parent run's
    std::vector<uint64_t> pages;
    std::vector<uint64_t> chunks;      // hash of each chunk ending in (start, end], in order
    std::vector<Lanes> chunk_lanes;    // accumulators at each of those chunk ends rounded down to a stripe
    uint64_t chunk_before = 0;         // the chunk ending at or before `start`, if `has_chunk_before`
    bool has_chunk_before = false;
    bool used = false;
    uint32_t page_size = 0;
    uint32_t num_live = 0;  // pages the map places in this run

    uint64_t end() const { return base + tokens.size(); }
    uint64_t first_end(uint64_t chunk) const { return start - start % chunk + chunk; }
    RunTokens reader() const { return RunTokens{tokens.data(), base}; }
};

class PageRuns {
  public:
    explicit PageRuns(int64_t chunk_size) {
        if (chunk_size < 1) throw nb::value_error("chunk_size must be >= 1");
        chunk_ = static_cast<uint64_t>(chunk_size);
        while ((uint64_t{1} << chunk_shift_) < chunk_) ++chunk_shift_;
        if ((uint64_t{1} << chunk_shift_) != chunk_) chunk_shift_ = -1;
        runs_.emplace_back();  // id 0 is "nowhere"
    }

    size_t num_pages() const { return map_.size(); }
    size_t num_runs() const { return runs_.size() - 1 - free_.size(); }

    // store(parent, pages, tokens, page_size) -> (chunk hashes ending in the chain, the chunk before it or
    // None), or None when the event is refused (nothing changes then).
    nb::object store(nb::handle parent, nb::handle pages, nb::handle tokens, int64_t page_size) {
        if (page_size < 1 || page_size > 0xFFFFFFFFll) return nb::none();
        if (!read_pages(pages)) return nb::none();
        size_t num_pages = pages_.size();
        if (!read_tokens(tokens) || num_pages == 0 || num_pages > 0xFFFFFFFFull) return nb::none();
        uint64_t size = static_cast<uint64_t>(page_size), num_tokens = tokens_.size();
        if (num_tokens <= (num_pages - 1) * size || num_tokens > num_pages * size) return nb::none();

        Run fresh;
        fresh.page_size = static_cast<uint32_t>(size);
        if (parent.is_none()) {
            fresh.lanes = initial_lanes(0);
        } else {
            uint64_t key;
            if (!read_page(parent.ptr(), key)) return nb::none();
            Place at = map_.find(key);
            if (at.run == 0) return nb::none();
            const Run& above = runs_[at.run];
            uint64_t resume_at = above.start + (uint64_t{at.index} + 1) * above.page_size;
            if (resume_at > above.end()) return nb::none();
            resume(above, resume_at, fresh);
        }
        fresh.tokens.insert(fresh.tokens.end(), tokens_.begin(), tokens_.end());
        fresh.pages = pages_;
        hash_chunks(fresh, fresh.chunks, fresh.chunk_lanes);

        uint32_t id = new_run();
        if (!place_pages(id)) {
            release(id);
            return nb::none();
        }
        Run& run = runs_[id];
        run = std::move(fresh);
        run.used = true;
        run.num_live = static_cast<uint32_t>(num_pages);
        nb::list chain;
        for (uint64_t h : run.chunks) chain.append(nb::steal(PyLong_FromUnsignedLongLong(h)));
        nb::object before = run.has_chunk_before ? nb::steal(PyLong_FromUnsignedLongLong(run.chunk_before)) : nb::none();
        return nb::make_tuple(chain, before);
    }

    // remove(pages) -> the chunk hashes those pages' eviction uncaches (each once, in first-seen order). Pages
    // not placed (never stored, evicted already, not int64) are ignored.
    nb::list remove(nb::handle pages) {
        nb::list result;
        nb::object seq = fast_sequence(pages);
        if (!seq.is_valid()) return result;
        gone_.clear();
        pages_.clear();
        Py_ssize_t num_items = PySequence_Fast_GET_SIZE(seq.ptr());
        PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
        for (Py_ssize_t i = 0; i < num_items; ++i) {
            uint64_t key;
            if (i + AHEAD_ITEMS < num_items) FEATHER_PREFETCH(items[i + AHEAD_ITEMS]);
            if (read_page(items[i], key)) pages_.push_back(key);
        }
        size_t n = pages_.size();
        for (size_t i = 0; i < std::min(n, AHEAD); ++i) map_.prefetch(pages_[i]);
        for (size_t i = 0; i < n; ++i) {
            if (i + AHEAD < n) map_.prefetch(pages_[i + AHEAD]);
            Place at = map_.take(pages_[i]);
            if (at.run == 0) continue;
            Run& run = runs_[at.run];
            uint64_t k = chunks_in(run.start + uint64_t{at.index} * run.page_size) - chunks_in(run.start);
            if (k < run.chunks.size() && (gone_.empty() || gone_.back() != run.chunks[k])) gone_.push_back(run.chunks[k]);
            if (--run.num_live == 0) release(at.run);
        }
        drop_repeats(gone_);
        for (uint64_t h : gone_) result.append(nb::steal(PyLong_FromUnsignedLongLong(h)));
        return result;
    }

    void clear() {
        runs_.resize(1);
        free_.clear();
        map_.clear();
    }

    // Empty if every invariant holds, else the first one broken: each placed page is its run's page at that
    // index, each run's live count is the pages placed in it and is positive, and each run's chunk hashes and
    // accumulators are what hashing its tokens from its own accumulators gives.
    std::string check() const {
        std::vector<uint32_t> placed(runs_.size(), 0);
        std::string problem;
        map_.for_each([&](uint64_t key, Place at) {
            if (!problem.empty()) return;
            if (at.run >= runs_.size() || !runs_[at.run].used) problem = "a page is placed in a run that is not used";
            else if (at.index >= runs_[at.run].pages.size() || runs_[at.run].pages[at.index] != key)
                problem = "a page is placed at an index of its run that holds another page";
            else ++placed[at.run];
        });
        if (!problem.empty()) return problem;
        size_t num_free = 0;
        for (uint32_t id = 1; id < runs_.size(); ++id) {
            const Run& run = runs_[id];
            if (!run.used) {
                ++num_free;
                continue;
            }
            if (run.num_live == 0 || run.num_live != placed[id]) return "a run's live count is not its placed pages";
            if (run.base != floor_stripe(run.start) || run.end() <= run.start) return "a run's offsets are wrong";
            uint64_t spanned = run.end() - run.start, n = run.pages.size();
            if (spanned <= (n - 1) * run.page_size || spanned > n * run.page_size)
                return "a run's tokens do not fill its pages";
            std::vector<uint64_t> chunks;
            std::vector<Lanes> lanes;
            hash_chunks(run, chunks, lanes);
            if (chunks != run.chunks) return "a run's chunk hashes are not its tokens'";
            if (lanes != run.chunk_lanes) return "a run's accumulators at its chunk ends are not its tokens'";
        }
        if (num_free != free_.size()) return "the free list is not the unused runs";
        return "";
    }

  private:
    bool read_pages(nb::handle pages) { return read_all(pages, pages_, read_page); }
    bool read_tokens(nb::handle tokens) { return read_all(tokens, tokens_, read_token); }

    // Every item of a sequence through `read` into `out`; false (out garbage) at the first it refuses.
    template <typename T, typename Read>
    static bool read_all(nb::handle sequence, std::vector<T>& out, Read read) {
        out.clear();
        nb::object seq = fast_sequence(sequence);
        if (!seq.is_valid()) return false;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
        PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
        out.resize(static_cast<size_t>(n));
        for (Py_ssize_t i = 0; i < n; ++i) {
            if (i + AHEAD_ITEMS < n) FEATHER_PREFETCH(items[i + AHEAD_ITEMS]);
            if (!read(items[i], out[static_cast<size_t>(i)])) return false;
        }
        return true;
    }

    // `fresh` starts at token `at` of `above` (a page end inside it): its accumulators there, the ids of the
    // stripe `at` falls in, and the chunk ending at or before `at`.
    void resume(const Run& above, uint64_t at, Run& fresh) const {
        uint64_t first_end = above.first_end(chunk_), from;
        if (at >= first_end) {
            size_t k = static_cast<size_t>((at - first_end) / chunk_);
            fresh.lanes = above.chunk_lanes[k];
            from = floor_stripe(first_end + k * chunk_);
            fresh.chunk_before = above.chunks[k];
            fresh.has_chunk_before = true;
        } else {
            fresh.lanes = above.lanes;
            from = above.base;
            fresh.chunk_before = above.chunk_before;
            fresh.has_chunk_before = above.has_chunk_before;
        }
        fresh.start = at;
        fresh.base = floor_stripe(at);
        advance(fresh.lanes, above.reader(), from, fresh.base);
        const uint32_t* ids = above.tokens.data() - above.base;
        fresh.tokens.assign(ids + fresh.base, ids + at);
    }

    // The hash of every chunk ending in `run` and the accumulators at each one's end rounded down to a stripe,
    // from the run's own accumulators and tokens (what a store records, and what `check` recomputes).
    void hash_chunks(const Run& run, std::vector<uint64_t>& chunks, std::vector<Lanes>& lanes) const {
        Lanes acc = run.lanes;
        RunTokens src = run.reader();
        uint64_t at = run.base, end = run.end();
        for (uint64_t e = run.first_end(chunk_); e <= end; e += chunk_) {
            advance(acc, src, at, floor_stripe(e));
            at = floor_stripe(e);
            lanes.push_back(acc);
            chunks.push_back(finish(acc, e, 0, src));
        }
    }

    // Places `pages_` in run `id`; false (and the map as it was) if a page is named twice. A page that was
    // placed in an older run moves here, and that run is released with its last page.
    bool place_pages(uint32_t id) {
        undo_.clear();
        size_t n = pages_.size();
        map_.reserve(n);
        for (size_t i = 0; i < std::min(n, AHEAD); ++i) map_.prefetch(pages_[i]);
        for (size_t i = 0; i < n; ++i) {
            if (i + AHEAD < n) map_.prefetch(pages_[i + AHEAD]);
            Place had = map_.put(pages_[i], Place{id, static_cast<uint32_t>(i)});
            undo_.push_back(had);
            if (had.run == id) {
                for (size_t j = undo_.size(); j-- > 0;) {
                    if (undo_[j].run == 0) map_.take(pages_[j]);
                    else map_.put(pages_[j], undo_[j]);
                }
                return false;
            }
        }
        for (const Place& had : undo_)
            if (had.run != 0 && --runs_[had.run].num_live == 0) release(had.run);
        return true;
    }

    uint32_t new_run() {
        if (!free_.empty()) {
            uint32_t id = free_.back();
            free_.pop_back();
            return id;
        }
        runs_.emplace_back();
        return static_cast<uint32_t>(runs_.size() - 1);
    }

    void release(uint32_t id) {
        runs_[id] = Run{};
        free_.push_back(id);
    }

    // Keeps the first of equal hashes, in order (repeats are rare: an event's pages come run by run).
    void drop_repeats(std::vector<uint64_t>& hashes) {
        if (hashes.size() < 2) return;
        order_.resize(hashes.size());
        for (size_t i = 0; i < hashes.size(); ++i) order_[i] = {hashes[i], i};
        std::sort(order_.begin(), order_.end());
        bool repeats = false;
        for (size_t i = 1; i < order_.size(); ++i) repeats |= order_[i].first == order_[i - 1].first;
        if (!repeats) return;
        std::vector<bool> keep(hashes.size(), true);
        for (size_t i = 1; i < order_.size(); ++i)
            if (order_[i].first == order_[i - 1].first) keep[order_[i].second] = false;
        size_t w = 0;
        for (size_t i = 0; i < hashes.size(); ++i)
            if (keep[i]) hashes[w++] = hashes[i];
        hashes.resize(w);
    }

    // Whole chunks in the first `tokens` tokens (a shift for power-of-two chunk sizes: a division per page was
    // a third of an eviction's cost at page size 1).
    uint64_t chunks_in(uint64_t tokens) const { return chunk_shift_ >= 0 ? tokens >> chunk_shift_ : tokens / chunk_; }

    uint64_t chunk_ = 0;
    int chunk_shift_ = 0;  // log2(chunk_), or -1 when chunk_ is not a power of two
    std::vector<Run> runs_;
    std::vector<uint32_t> free_;
    PageMap map_;
    std::vector<uint64_t> pages_, gone_;  // scratch
    std::vector<uint32_t> tokens_;
    std::vector<Place> undo_;
    std::vector<std::pair<uint64_t, size_t>> order_;
};

}  // namespace

void bind_page_runs(nb::module_& m) {
    nb::class_<PageRuns>(m, "PageRuns")
        .def(nb::init<int64_t>(), "chunk_size"_a)
        .def_prop_ro("num_pages", &PageRuns::num_pages)
        .def_prop_ro("num_runs", &PageRuns::num_runs)
        .def("store", &PageRuns::store, "parent"_a.none(), "pages"_a.none(), "tokens"_a.none(), "page_size"_a)
        .def("remove", &PageRuns::remove, "pages"_a.none())
        .def("clear", &PageRuns::clear)
        .def("_check", &PageRuns::check);
}
