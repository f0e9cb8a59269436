// The compiled Chunked Hash Tree: the same algorithm as sglang_feather/cht/tree.py, on a slab.
//
// How it works. Nodes live in a slab (u32 ids, slot 0 is the root) with a generation counter per slot, so a
// lazy heap entry that names a released slot is recognised as stale, exactly like an entry that names a dead
// Python object. Chunk hashes map to node ids through an open-addressing table (linear probing, backward-shift
// deletion, keys mixed so that small or sequential hashes spread). Requests live in a second slab; the Python
// wrapper keeps the mapping from any hashable request id to the u32 handle. The ranking, the lazy lower-bound
// heaps, the stranger heap, suspension, compaction thresholds and the invariant checker mirror tree.py (same
// names), so the two trees give identical results; tests run both against the reference model. One
// difference in representation: the chunks only one request holds, at the end of its path, are one *tail*
// node here until another prompt shares them (see `Node`), where tree.py has a node per chunk.
// The cache tier (`CacheTier`, cache_tier.h) mirrors tree.py's: the chunk hashes the engine's KV cache holds, each with
// its parent, fed by store / remove / clear events and independent of the tree (a hash no tracked request
// holds costs one table slot and one entry, no node). A node is *covered* while a running request holds it or
// it is `cached` (the tier holds its prefix); ranking is by the deepest covered prefix, then the number of
// requests through it, then arrival (tree.py's "how it works"). Cached chunks are always ordinary nodes,
// never part of a tail: an insert ends its cached chunks' run of nodes before the tail starts, and a store
// that names chunks inside a live tail splits the tail there first.
// Prompts are hashed here (xxh64 over 4-byte little-endian token ids, one digest per chunk boundary, the same
// digests as the xxhash package) straight from the caller's buffer.

#include <Python.h>
#include <structmember.h>  // T_OBJECT_EX, READONLY: a slotted Candidate's member descriptors
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "memory.h"
#include "xxh64.h"

#include "cache_tier.h"
#include "containers.h"
#include "tree_status.h"
#include "prompt_hashing.h"

// Portability: GCC and Clang on Linux, Apple Clang, MSVC (memory.h says where huge pages are used). Token ids are hashed
// as little-endian words: a compiler that names the byte order is checked here, any other at import
// (`little_endian()` in the module init), so a big-endian build never yields wrong digests.
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token ids are hashed as little-endian words");
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// ------------------------------------------------------------------------------------------- the tree

// Two cache lines: the first holds what path walks and a parent's heap touch (counters, flags, hash, cached
// best), the second the node's own candidate heap and global key; the tier-2 fields only first-level nodes
// use live in a side slab (`FirstLevel`), so the many deep nodes of long prompts carry none of them.
//
// Private tails. The chunks of a new prompt below what the tree already knows belong to that one request
// until another prompt shares them, so an insert makes them a single *tail* node: `span` chunks ending at
// `depth`, always the last node of its owner's path (which repeats the tail's id once per chunk, so every
// depth-indexed read of a path stays as it is), its first chunk's hash in the index under the tail's id (the
// later ones too once `tails_indexed_`), the hashes themselves in a `Tail` side slot. A tail behaves as one
// node of the logical tree: its counts are its owner's, its candidate heap holds its owner's leaf entries,
// its parent keys it by its cached best, and it is covered by no one but its owner (never cached: an insert
// gives the chunks the cache tier holds ordinary nodes and starts the tail below them, and `cache_store`
// splits a tail before it flags any of its chunks), so it carries no global or stranger key. When another
// insert (or a store) matches k of its chunks, `split_tail` gives those k chunks ordinary nodes (the first
// keeps the tail's id, so its parent's entry stays valid) and the rest stays one tail; each chunk is split off
// at most once. A tail starts at depth 2 or deeper, so first-level nodes stay ordinary. Node counts, serials
// and every result are those of the uncompressed tree (the Python tree), which tests check.
struct alignas(64) Node {
    uint32_t parent = NIL;
    uint32_t depth = 0;
    uint32_t num_active = 0;
    uint32_t num_waiting = 0;
    uint32_t gen = 0;
    bool alive = false;
    bool has_best = false;
    bool has_global = false;
    bool has_stranger = false;
    bool cached = false;  // the cache tier holds this prefix, and the parent's (tree.py's `cached`); never a tail
    uint64_t hash = 0;
    uint32_t best_req = NIL;
    uint32_t best_gen = 0;
    AKey best{};  // with the fields above, all a parent's heap reads of a child (`live_child`): one cache line
    Candidates candidates;
    Key global_key{};
    uint64_t serial = 0;
    uint32_t side = NIL;  // first-level nodes: their `FirstLevel` slot; tails: their `Tail` slot
    uint32_t span = 1;    // chunks this node stands for: > 1 for a private tail
};
static_assert(sizeof(Node) == 128, "a node is two cache lines");

struct FirstLevel {
    Key stranger_key{};  // (0, arrival, seq)
    std::vector<AEntry> arrivals;
};

struct Tail {
    uint32_t owner = NIL;          // the one request whose path holds the tail
    std::vector<uint64_t> hashes;  // its chunks' hashes, shallowest first (hashes[0] is the node's `hash`)
};

struct Req {
    std::vector<uint32_t> path;
    double arrival = 0;
    uint64_t seq = 0;
    uint32_t gen = 0;
    State state = FREE;
    bool suspended = false;
    uint32_t prev = NIL, next = NIL;          // all live requests, insertion order
    uint32_t prev_act = NIL, next_act = NIL;  // running requests, activation order
    uint32_t suspended_at = NIL;
    AKey key() const { return AKey{arrival, seq}; }
};

struct List {
    uint32_t head = NIL, tail = NIL;
};

class Tree {
  public:
    explicit Tree(int64_t chunk_size) : chunk_size_(chunk_size), index_(node_gens_) {
        nodes_.emplace_back();
        node_gens_.push_back(0);
        nodes_[ROOT].alive = true;
    }
    Tree(const Tree&) = delete;
    Tree& operator=(const Tree&) = delete;

    // ------------------------------------------------------------------ queries

    size_t num_requests() const { return num_requests_; }
    size_t num_active() const { return num_active_; }
    size_t num_waiting() const { return num_requests_ - num_active_; }
    size_t num_running_groups() const { return num_running_groups_; }
    size_t num_suspended() const { return suspended_.size(); }
    size_t num_nodes() const { return num_nodes_; }
    size_t num_tails() const { return tails_.size() - free_tails_.size(); }
    bool tails_indexed() const { return tails_indexed_; }
    size_t num_index_entries() const {
        size_t total = global_.size() + strangers_.size() + by_arrival_.size();
        for (size_t id = 0; id < nodes_.size(); ++id) {
            const Node& n = nodes_[id];
            if (n.alive) total += n.candidates.size() + (n.depth == 1 ? levels_[n.side].arrivals.size() : 0);
        }
        return total;
    }
    int64_t shared_depth() const { return shared_ == NIL ? 0 : nodes_[shared_].depth; }
    int state(uint32_t h) const { return reqs_[h].state; }
    bool is_suspended(uint32_t h) const { return reqs_[h].suspended; }
    int64_t num_chunks(uint32_t h) const { return static_cast<int64_t>(reqs_[h].path.size()); }

    std::vector<uint64_t> path_hashes(uint32_t h) const {
        const auto& path = reqs_[h].path;
        std::vector<uint64_t> out(path.size());
        for (size_t d = 0; d < path.size(); ++d) out[d] = chunk_hash(path, d);
        return out;
    }

    // The hash naming the request's first `depth` chunks (1 <= depth <= its chunks; the wrapper checks).
    // The depth-indexed queries check their depth again (native.NativeTree raises `InvalidDepth` first), so
    // no call reads outside a path.
    void check_depth(uint32_t h, int64_t depth, int64_t lowest) const {
        if (depth < lowest || depth > num_chunks(h)) throw nb::index_error("depth outside the request's chunks");
    }

    uint64_t prefix_hash(uint32_t h, int64_t depth) const {
        check_depth(h, depth, 1);
        return chunk_hash(reqs_[h].path, static_cast<size_t>(depth - 1));
    }

    double arrival(uint32_t h) const { return reqs_[h].arrival; }

    int64_t num_missing(uint32_t h) const {
        const auto& path = reqs_[h].path;
        return static_cast<int64_t>(path.size()) - covered_depth(path);
    }

    int64_t num_holding(uint32_t h, int64_t depth) const {
        check_depth(h, depth, 0);
        return depth > 0 ? nodes_[reqs_[h].path[static_cast<size_t>(depth - 1)]].num_active
                         : static_cast<int64_t>(num_active_);
    }

    int64_t num_waiting_holding(uint32_t h, int64_t depth) const {
        check_depth(h, depth, 0);
        return depth > 0 ? nodes_[reqs_[h].path[static_cast<size_t>(depth - 1)]].num_waiting
                         : static_cast<int64_t>(num_waiting());
    }

    bool shares_prefix(uint32_t a, uint32_t b, int64_t depth) const {
        const auto &p = reqs_[a].path, &q = reqs_[b].path;
        if (depth < 0) throw nb::index_error("negative depth");
        if (depth == 0) return true;
        size_t d = static_cast<size_t>(depth);
        return p.size() >= d && q.size() >= d && p[d - 1] == q[d - 1];
    }

    std::vector<uint32_t> waiting() const {
        std::vector<uint32_t> out;
        for (uint32_t h = all_.head; h != NIL; h = reqs_[h].next)
            if (reqs_[h].state == WAITING) out.push_back(h);
        return out;
    }

    std::vector<uint32_t> active() const {
        std::vector<uint32_t> out;
        for (uint32_t h = running_.head; h != NIL; h = reqs_[h].next_act) out.push_back(h);
        return out;
    }

    std::vector<uint32_t> suspended() const { return suspended_; }

    // The wrapper's id maps (request id -> handle dict, handle -> request id list), the `Candidate` class and
    // the error classes, so that the per-step calls (best, activate, finish, ...) run here with no Python
    // frame: they look the id up, build the `Candidate` (what the frozen dataclass's own __init__ does,
    // through object.__setattr__) and raise the same exceptions as the Python tree.
    void bind(nb::dict handles, nb::list ids, nb::handle candidate_cls, nb::handle unknown, nb::handle transition) {
        handles_ = handles;
        ids_ = ids;
        candidate_cls_ = nb::borrow(candidate_cls);
        unknown_error_ = nb::borrow(unknown);
        transition_error_ = nb::borrow(transition);
        static const char* names[] = {"request_id",   "num_chunks",  "num_missing", "depth_running", "depth_cached",
                                      "depth_before", "depth_after", "num_sharing", "arrival"};
        for (int i = 0; i < NUM_FIELDS; ++i) field_names_[i] = nb::steal(PyUnicode_InternFromString(names[i]));
        // A slotted `Candidate` (the dataclass's slots=True) keeps each field at a fixed offset: store there, as
        // its member descriptors do, instead of looking each descriptor up again per field and candidate.
        num_slots_ = 0;
        auto* type = reinterpret_cast<PyTypeObject*>(candidate_cls_.ptr());
        for (int i = 0; i < NUM_FIELDS; ++i) {
            PyObject* descr = _PyType_Lookup(type, field_names_[i].ptr());
            if (descr == nullptr || Py_TYPE(descr) != &PyMemberDescr_Type) return;
            PyMemberDef* member = reinterpret_cast<PyMemberDescrObject*>(descr)->d_member;
            if (member->type != T_OBJECT_EX || (member->flags & READONLY)) return;
            slot_offsets_[i] = member->offset;
        }
        num_slots_ = NUM_FIELDS;
    }

    // best(): the next waiting request's `Candidate`, or None; cached until the next mutation.
    nb::object best() {
        if (!best_valid_) {
            // A sharer comes with its covered depth (its global node's), a stranger has none: the searches
            // along its path stop there.
            int64_t covered = -1;
            uint32_t h = pop_sharing(covered);
            if (h == NIL) {
                h = pop_stranger();
                covered = 0;
            }
            best_handle_ = h;
            if (h == NIL) {
                best_cache_ = nb::none();
            } else {
                describe_into(h, best_values_, covered);
                best_cache_ = make_candidate(h, best_values_);
            }
            best_valid_ = true;
        }
        return best_cache_;
    }

    // take_picks(max_picks, skip_running_uncached, max_missing, first) -> (candidates, skipped, skip_ends,
    // is_exhausted): candidate.py's `take_picks_stepwise` (best / suspend / activate, the Python tree's path and
    // the reference model), with no Python frame per pick; it ends at the pick whose missing chunks bring the
    // picks' sum to `max_missing`. `first` (a waiting request id, or None) is taken before the ranking's picks,
    // or suspended alone when its prefix runs uncached.
    nb::tuple take_picks(int64_t max_picks, bool skip_running_uncached, int64_t max_missing, nb::handle first) {
        if (max_picks < 0) throw nb::value_error("max_picks must be >= 0");
        if (max_missing < 1) throw nb::value_error("max_missing must be >= 1");
        nb::list picks, skipped, ends;
        size_t num_skipped = 0;
        auto skip = [&](uint32_t h) {
            checked(suspend(h));
            skipped.append(nb::borrow(PyList_GET_ITEM(ids_.ptr(), h)));
            ++num_skipped;
        };
        auto take = [&](nb::handle candidate) {
            picks.append(candidate);
            ends.append(nb::steal(PyLong_FromSize_t(num_skipped)));
        };
        uint32_t last = NIL;
        int64_t num_missing = 0, i = 0;
        if (!first.is_none()) {
            uint32_t head = handle_of(first);
            if (reqs_[head].state != WAITING) raise_state(first, head, nullptr);
            if (reqs_[head].suspended) transition(first, ALREADY_SUSPENDED, WAITING);
            if (max_picks > 0) {
                int64_t values[NUM_COUNTS];
                describe_into(head, values);
                if (skip_running_uncached && runs_uncached(values)) {
                    skip(head);
                    return nb::make_tuple(picks, skipped, ends, false);
                }
                take(make_candidate(head, values));
                num_missing = values[1];
                last = head;
                i = 1;
            }
        }
        for (; i < max_picks && num_missing < max_missing; ++i) {
            if (last != NIL) checked(activate(last));
            best();
            while (best_handle_ != NIL && skip_running_uncached && runs_uncached(best_values_)) {
                skip(best_handle_);
                best();
            }
            if (best_handle_ == NIL) return nb::make_tuple(picks, skipped, ends, true);
            last = best_handle_;
            take(best_cache_);
            num_missing += best_values_[1];
        }
        return nb::make_tuple(picks, skipped, ends, false);
    }

    nb::object candidate_of(nb::handle rid) {
        uint32_t h = handle_of(rid);
        if (reqs_[h].state != WAITING) raise_state(rid, h, nullptr);
        return candidate(h);
    }

    void activate_id(nb::handle rid) { transition(rid, activate(handle_of(rid)), WAITING); }
    void deactivate_id(nb::handle rid) { transition(rid, deactivate(handle_of(rid)), ACTIVE); }
    void suspend_id(nb::handle rid) { transition(rid, suspend(handle_of(rid)), WAITING); }
    void resume_id(nb::handle rid) { transition(rid, resume(handle_of(rid)), WAITING); }

    void finish_id(nb::handle rid) {
        uint32_t h = handle_of(rid);
        transition(rid, finish(h), ACTIVE);
        forget(rid, h);
    }

    void remove_id(nb::handle rid) {
        uint32_t h = handle_of(rid);
        transition(rid, remove(h), WAITING);
        forget(rid, h);
    }

    bool discard_id(nb::handle rid) {
        PyObject* value = PyDict_GetItemWithError(handles_.ptr(), rid.ptr());
        if (value == nullptr) {
            if (PyErr_Occurred()) throw nb::python_error();
            return false;
        }
        uint32_t h = static_cast<uint32_t>(PyLong_AsUnsignedLong(value));
        int64_t code = reqs_[h].state == ACTIVE ? finish(h) : remove(h);
        transition(rid, code, reqs_[h].state);
        forget(rid, h);
        return true;
    }


    // What `insert` needs from Python: the buffer types read in place (others are packed by `token_bytes`
    // first, as the Python tree does), `namespace_seed`, and the error classes it raises.
    void bind_insert(nb::handle buffers, nb::handle token_bytes, nb::handle namespace_seed, nb::handle duplicate,
                     nb::handle empty, nb::handle invalid_tokens, nb::handle hash_chain, nb::handle invalid_arrival) {
        buffer_types_ = nb::borrow(buffers);
        token_bytes_ = nb::borrow(token_bytes);
        namespace_seed_ = nb::borrow(namespace_seed);
        duplicate_error_ = nb::borrow(duplicate);
        empty_error_ = nb::borrow(empty);
        invalid_tokens_error_ = nb::borrow(invalid_tokens);
        hash_chain_error_ = nb::borrow(hash_chain);
        invalid_arrival_error_ = nb::borrow(invalid_arrival);
    }

    // insert(request_id, token_ids, *, namespace=None, arrival=None) -> num_chunks: the whole insert, id map
    // included, with no Python frame.
    int64_t insert_id(nb::handle rid, nb::handle tokens, nb::handle ns, nb::handle arrival) {
        // The Python tree's order of checks: the id, the namespace, the arrival, then the token ids.
        refuse_duplicate(rid);
        uint64_t seed = read_seed(ns);
        double when = 0.0;
        bool has_arrival = read_arrival(rid, arrival, when);
        PyObject* source = tokens.ptr();
        int is_buffer = PyObject_IsInstance(source, buffer_types_.ptr());
        if (is_buffer < 0) throw nb::python_error();
        // Ids that are not read in place are packed (and checked) before hashing: lists and tuples of ints
        // here, any other sequence by `token_bytes`.
        nb::object packed;
        int64_t listed = is_buffer ? NOT_IN_PLACE : pack_list(source, scratch_.ids);
        if (listed == INVALID_TOKENS || listed == EMPTY) return added(rid, listed);
        if (!is_buffer && listed == NOT_IN_PLACE) packed = pack_tokens(source);
        size_t chunk = static_cast<size_t>(chunk_size_);
        int64_t status = is_buffer ? hash_tokens(source, chunk, seed, scratch_, hashes_) : OK;
        if (status == NOT_IN_PLACE) packed = pack_tokens(source);  // another byte order, dtype or shape
        if (packed.is_valid()) {
            status = hash_packed(packed.ptr(), chunk, seed);
        } else if (listed == OK) {
            U32Tokens ids{reinterpret_cast<const unsigned char*>(scratch_.ids.data())};
            cumulative_xxh64(ids, scratch_.ids.size(), chunk, seed, scratch_.lanes, hashes_);
        }
        if (status == OK) status = insert(hashes_, when, has_arrival);
        return added(rid, status);
    }

    // insert_hashes(request_id, hashes, *, arrival=None) -> num_chunks. An integer array.array or numpy array
    // is read in place; any other sequence item by item.
    int64_t insert_hashes_id(nb::handle rid, nb::handle hashes, nb::handle arrival) {
        return insert_hashes_as(rid, hashes, arrival, true);
    }

    // Tests only: `insert_hashes` of digests taken as this tree's own (the tree keeps not indexing tails'
    // later chunks), to reach the digest-collision paths that no real pair of prompts can.
    int64_t insert_digests_id(nb::handle rid, nb::handle hashes, nb::handle arrival) {
        return insert_hashes_as(rid, hashes, arrival, false);
    }

    int64_t insert_hashes_as(nb::handle rid, nb::handle hashes, nb::handle arrival, bool from_engine) {
        refuse_duplicate(rid);
        double when = 0.0;
        bool has_arrival = read_arrival(rid, arrival, when);
        int is_buffer = PyObject_IsInstance(hashes.ptr(), buffer_types_.ptr());
        if (is_buffer < 0) throw nb::python_error();
        int64_t status = is_buffer ? read_hash_buffer(hashes.ptr(), hashes_) : NOT_IN_PLACE;
        if (status == NOT_IN_PLACE) status = read_hashes(hashes.ptr(), hashes_);
        if (status == OK && from_engine && !tails_indexed_ && !index_tail_chunks()) status = HASH_CHAIN;
        if (status == OK) status = insert(hashes_, when, has_arrival);
        return added(rid, status);
    }

    // tree.py's `cached_frontier`: of the first `limit` ids of an iterable (the engine's queue order), the first
    // waiting request of each distinct deepest cached node that no running request holds, in the ranking's
    // order of those nodes (deepest, then the most requests through it, then queue order). Reads no id while no
    // cached node that no running request holds has a waiting request.
    nb::list cached_frontier(nb::handle ids, size_t limit) const {
        struct Found {
            int64_t depth, num_waiting;
            size_t position;
            uint32_t node;
            nb::object rid;
        };
        std::vector<Found> found;
        nb::object it = nb::steal(PyObject_GetIter(ids.ptr()));
        if (!it.is_valid()) throw nb::python_error();
        if (num_idle_cached_ == 0) return nb::list();
        for (size_t i = 0; i < limit; ++i) {
            nb::object rid = nb::steal(PyIter_Next(it.ptr()));
            if (!rid.is_valid()) {
                if (PyErr_Occurred()) throw nb::python_error();
                break;
            }
            PyObject* value = PyDict_GetItemWithError(handles_.ptr(), rid.ptr());
            if (value == nullptr) {
                if (PyErr_Occurred()) throw nb::python_error();
                continue;
            }
            const Req& r = reqs_[static_cast<uint32_t>(PyLong_AsUnsignedLong(value))];
            if (r.state != WAITING) continue;
            int64_t depth = last_cached(r.path, r.path.size());
            if (depth == 0) continue;
            uint32_t node = r.path[static_cast<size_t>(depth - 1)];
            const Node& n = nodes_[node];
            if (n.num_active > 0) continue;
            if (std::any_of(found.begin(), found.end(), [node](const Found& f) { return f.node == node; })) continue;
            found.push_back(Found{depth, static_cast<int64_t>(n.num_waiting), i, node, rid});
        }
        std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
            if (a.depth != b.depth) return a.depth > b.depth;
            if (a.num_waiting != b.num_waiting) return a.num_waiting > b.num_waiting;
            return a.position < b.position;
        });
        nb::list out;
        for (const Found& f : found) out.append(f.rid);
        return out;
    }

    nb::object candidate(uint32_t h, int64_t covered = -1) const {
        int64_t values[NUM_COUNTS];
        describe_into(h, values, covered);
        return make_candidate(h, values);
    }

    nb::object make_candidate(uint32_t h, const int64_t* values) const {
        PyObject* empty = PyTuple_New(0);
        PyObject* obj = PyBaseObject_Type.tp_new(reinterpret_cast<PyTypeObject*>(candidate_cls_.ptr()), empty, nullptr);
        Py_DECREF(empty);
        if (obj == nullptr) throw nb::python_error();
        nb::object result = nb::steal(obj);
        if (num_slots_ == NUM_FIELDS) {
            PyObject* id = PyList_GET_ITEM(ids_.ptr(), h);
            Py_INCREF(id);
            *slot_of(obj, 0) = id;
            for (int i = 0; i < NUM_COUNTS; ++i) {
                PyObject* v = PyLong_FromLongLong(values[i]);
                if (v == nullptr) throw nb::python_error();
                *slot_of(obj, i + 1) = v;
            }
            PyObject* arrival = PyFloat_FromDouble(reqs_[h].arrival);
            if (arrival == nullptr) throw nb::python_error();
            *slot_of(obj, NUM_FIELDS - 1) = arrival;
            return result;
        }
        if (PyObject_GenericSetAttr(obj, field_names_[0].ptr(), PyList_GET_ITEM(ids_.ptr(), h)) != 0)
            throw nb::python_error();
        for (int i = 0; i <= NUM_COUNTS; ++i) {
            PyObject* v = i < NUM_COUNTS ? PyLong_FromLongLong(values[i]) : PyFloat_FromDouble(reqs_[h].arrival);
            if (v == nullptr) throw nb::python_error();
            int rc = PyObject_GenericSetAttr(obj, field_names_[i + 1].ptr(), v);
            Py_DECREF(v);
            if (rc != 0) throw nb::python_error();
        }
        return result;
    }

    // (num_chunks, num_missing, depth_running, depth_cached, depth_before, depth_after, num_sharing) of a
    // waiting request. `covered` >= 0: its covered depth is known (best() pops its global node), so the searches
    // for its running and cached depths stop there, and usually need none (that node runs or is cached).
    void describe_into(uint32_t h, int64_t* out, int64_t covered = -1) const {
        const auto& path = reqs_[h].path;
        int64_t len = static_cast<int64_t>(path.size());
        size_t limit = covered >= 0 ? static_cast<size_t>(covered) : path.size();
        const Node* top = covered > 0 ? &nodes_[path[limit - 1]] : nullptr;
        int64_t cached = top != nullptr && top->cached ? covered : last_cached(path, limit);
        int64_t before, after, running = 0;
        if (num_active_ == 0) {
            before = after = len;
        } else {
            running = top != nullptr && top->num_active > 0 ? covered : last_depth(path, limit, 1);
            int64_t shared = shared_depth(), capped = std::min(running, shared);
            // Usually the candidate's path holds the whole capped prefix (it shares the batch's prefix, or
            // the batch's shared prefix lies on it): one read instead of a binary search.
            bool whole = capped > 0 && nodes_[path[static_cast<size_t>(capped - 1)]].num_active >= num_active_;
            after = whole ? capped
                          : last_depth(path, static_cast<size_t>(std::max<int64_t>(capped - 1, 0)), num_active_);
            before = num_active_ > 1 ? shared : after;
        }
        int64_t sharing = after ? static_cast<int64_t>(nodes_[path[static_cast<size_t>(after - 1)]].num_waiting) - 1 : 0;
        out[0] = len;
        out[1] = len - std::max(running, cached);
        out[2] = running;
        out[3] = cached;
        out[4] = before;
        out[5] = after;
        out[6] = sharing;
    }

    int64_t oldest() {
        while (!by_arrival_.empty()) {
            const AEntry& e = by_arrival_.front();
            if (live_waiting(e.req, e.gen)) return e.req;
            heap_pop<AEntry, AAfter>(by_arrival_);
        }
        return -1;
    }

    int64_t oldest_stranger() {
        uint32_t h = pop_stranger();
        return h == NIL ? -1 : static_cast<int64_t>(h);
    }

    std::vector<uint32_t> prefix_order(const std::vector<uint32_t>& handles) const {
        std::vector<uint32_t> order;
        order.reserve(handles.size());
        if (handles.empty()) return order;
        std::vector<std::pair<std::vector<uint32_t>, size_t>> stack;
        stack.emplace_back(handles, 0);
        while (!stack.empty()) {
            auto [group, depth] = std::move(stack.back());
            stack.pop_back();
            if (group.size() == 1) {
                order.push_back(group[0]);
                continue;
            }
            const auto& first = reqs_[group[0]].path;
            size_t common = first.size();
            for (uint32_t h : group) {
                const auto& path = reqs_[h].path;
                size_t limit = std::min(common, path.size());
                if (limit > depth && path[limit - 1] != first[limit - 1]) {
                    size_t lo = depth, hi = limit - 1;
                    while (lo < hi) {
                        size_t mid = (lo + hi + 1) / 2;
                        if (path[mid - 1] == first[mid - 1]) lo = mid;
                        else hi = mid - 1;
                    }
                    limit = lo;
                }
                common = limit;
            }
            std::vector<std::pair<uint64_t, std::vector<uint32_t>>> branches;  // by serial, first seen first
            for (uint32_t h : group) {
                const auto& path = reqs_[h].path;
                if (path.size() == common) {
                    order.push_back(h);
                    continue;
                }
                uint64_t serial = chunk_serial(path, common);
                auto it = std::find_if(branches.begin(), branches.end(),
                                       [serial](const auto& b) { return b.first == serial; });
                if (it == branches.end()) branches.emplace_back(serial, std::vector<uint32_t>{h});
                else it->second.push_back(h);
            }
            std::sort(branches.begin(), branches.end(),
                      [](const auto& x, const auto& y) { return x.first > y.first; });
            for (auto& b : branches) stack.emplace_back(std::move(b.second), common + 1);
        }
        return order;
    }

    // ------------------------------------------------------------------ mutations

    int64_t activate(uint32_t h) {
        Req& r = reqs_[h];
        if (r.state != WAITING) return BAD_STATE;
        prefetch_path(r.path);
        if (r.suspended) unsuspend(h);
        r.state = ACTIVE;
        link_active(h);
        ++num_active_;
        const auto& path = r.path;
        size_t len = num_distinct(path), first_entered = len;
        for (size_t d = 0; d < len; ++d) {
            Node& n = nodes_[path[d]];
            --n.num_waiting;
            if (++n.num_active == 1) {
                if (!n.cached && d < first_entered) first_entered = d;
                num_idle_cached_ -= n.cached;  // this request waited through it
            }
        }
        if (len > 0 && nodes_[path[0]].num_active == 1) ++num_running_groups_;
        // A node that enters coverage needs a global entry only if some waiting request leaves coverage right
        // there (the others are counted at a deeper node of this path).
        for (size_t d = first_entered; d < len; ++d) {
            uint32_t below = d + 1 < len ? nodes_[path[d + 1]].num_waiting : 0;
            if (nodes_[path[d]].num_waiting > below) push_global(path[d]);
        }
        // A cached node its first running request reaches ranks higher now (its key fell): re-push its entry.
        for (size_t d = 0; d < len && nodes_[path[d]].cached; ++d) {
            const Node& n = nodes_[path[d]];
            if (n.num_active == 1 && n.has_global) push_global(path[d]);
        }
        update_shared_after_activate(h);
        best_valid_ = false;
        return OK;
    }

    int64_t deactivate(uint32_t h) {
        Req& r = reqs_[h];
        if (r.state != ACTIVE) return BAD_STATE;
        prefetch_path(r.path);
        for (size_t d = 0, len = num_distinct(r.path); d < len; ++d) ++nodes_[r.path[d]].num_waiting;
        r.state = WAITING;
        uint32_t leaf = r.path.back();
        push(leaf, r.key(), h, r.gen, true);
        push_arrival(h);
        leave_working_set(h);
        if (covered(nodes_[leaf])) push_global(leaf);
        // Its leaf and first node took an entry while it counted as waiting and running: keep their heaps
        // within the bound of the count it has now.
        Node& l = nodes_[leaf];
        if (l.candidates.size() > 4 * (l.num_waiting + l.num_active) + COMPACT_MIN) compact_candidates(l.candidates);
        Node& first = nodes_[r.path[0]];
        auto& arrivals = levels_[first.side].arrivals;
        if (arrivals.size() > 4 * (first.num_waiting + first.num_active) + COMPACT_MIN) compact_arrivals(arrivals);
        best_valid_ = false;
        return OK;
    }

    int64_t finish(uint32_t h) {
        Req& r = reqs_[h];
        if (r.state != ACTIVE) return BAD_STATE;
        prefetch_path(r.path);
        leave_working_set(h);
        drop_request(h);
        best_valid_ = false;
        return OK;
    }

    int64_t remove(uint32_t h) {
        Req& r = reqs_[h];
        if (r.state != WAITING) return BAD_STATE;
        prefetch_path(r.path);
        if (r.suspended) unsuspend(h);
        for (size_t d = 0, len = num_distinct(r.path); d < len; ++d) {
            Node& n = nodes_[r.path[d]];
            if (--n.num_waiting == 0 && n.cached && n.num_active == 0) --num_idle_cached_;
        }
        drop_request(h);
        best_valid_ = false;
        return OK;
    }

    int64_t suspend(uint32_t h) {
        Req& r = reqs_[h];
        if (r.state != WAITING) return BAD_STATE;
        if (r.suspended) return ALREADY_SUSPENDED;
        r.suspended = true;
        r.suspended_at = static_cast<uint32_t>(suspended_.size());
        suspended_.push_back(h);
        best_valid_ = false;
        return OK;
    }

    int64_t resume(uint32_t h) {
        Req& r = reqs_[h];
        if (!r.suspended) return NOT_SUSPENDED;
        unsuspend(h);
        publish(h, r.path.size());
        best_valid_ = false;
        return OK;
    }

    void resume_all() {
        std::vector<uint32_t> handles = suspended_;
        for (uint32_t h : handles) resume(h);
    }

    // ------------------------------------------------------------------ the cache tier

    size_t num_cached() const { return tier_.size(); }

    // is_cached(chunk_hash): whether the tier holds the prefix `chunk_hash` names.
    bool is_cached_id(nb::handle chunk_hash) const {
        uint64_t v;
        return lookup_hash(chunk_hash.ptr(), v) && tier_.find(v) != NIL;
    }

    // cache_store(hashes, parent=None) -> chunks newly cached (tree.py's `cache_store`): hashes are read like
    // insert_hashes' (a buffer in place, any other sequence item by item); a chain below a parent the tier does
    // not hold is ignored; HashChainError, with nothing changed, for a malformed list or parent, or a chain
    // `cache_store` refuses.
    int64_t cache_store_id(nb::handle hashes, nb::handle parent) {
        int is_buffer = PyObject_IsInstance(hashes.ptr(), buffer_types_.ptr());
        if (is_buffer < 0) throw nb::python_error();
        int64_t status = is_buffer ? read_hash_buffer(hashes.ptr(), chain_) : NOT_IN_PLACE;
        if (status == NOT_IN_PLACE) status = read_hashes(hashes.ptr(), chain_);
        if (status == EMPTY) {
            chain_.clear();
            status = OK;
        }
        if (status != OK) raise_hash_chain("chunk hashes must be integers in [0, 2**64)");
        uint64_t above = 0;
        bool has_parent = !parent.is_none();
        if (has_parent) {
            if (!read_hash(parent.ptr(), above)) raise_hash_chain("the parent hash must be an integer in [0, 2**64)");
            if (tier_.find(above) == NIL) return 0;
        }
        int64_t stored = cache_store(chain_, has_parent, above);
        if (stored < 0)
            raise_hash_chain("a hash repeats within the chain, or is cached or in the tree under another prefix: "
                             "hashes are not cumulative or two prefixes collide");
        return stored;
    }

    // cache_remove(hashes) -> chunks uncached: the named prefixes and every cached one that extends them; hashes
    // the tier does not hold are ignored. The whole iterable is read before anything changes.
    int64_t cache_remove_id(nb::handle hashes) {
        nb::object it = nb::steal(PyObject_GetIter(hashes.ptr()));
        if (!it.is_valid()) {
            PyErr_Clear();
            raise_hash_chain("chunk hashes must be an iterable of integers");
        }
        chain_.clear();
        while (PyObject* item = PyIter_Next(it.ptr())) {
            nb::object held = nb::steal(item);
            uint64_t v;
            if (lookup_hash(item, v)) chain_.push_back(v);
        }
        if (PyErr_Occurred()) throw nb::python_error();
        uncached_.clear();
        for (uint64_t h : chain_) {
            uint32_t e = tier_.find(h);
            if (e != NIL) tier_.remove_subtree(e, uncached_);
        }
        leave_cache(uncached_);
        return static_cast<int64_t>(uncached_.size());
    }

    void cache_clear() {
        uncached_.clear();
        tier_.clear(uncached_);
        leave_cache(uncached_);
    }

    // ------------------------------------------------------------------ invariants

    std::string check() const;

  private:
    // ------------------------------------------------------------------ request ids

    uint32_t handle_of(nb::handle rid) const {
        PyObject* value = PyDict_GetItemWithError(handles_.ptr(), rid.ptr());
        if (value == nullptr) {
            if (!PyErr_Occurred()) PyErr_Format(unknown_error_.ptr(), "request %R is not in the tree", rid.ptr());
            throw nb::python_error();
        }
        return static_cast<uint32_t>(PyLong_AsUnsignedLong(value));
    }

    [[noreturn]] void raise_hash_chain(const char* message) const {
        PyErr_SetString(hash_chain_error_.ptr(), message);
        throw nb::python_error();
    }

    // Raises the Python tree's `InvalidTransition` for a refused call (`code` != OK).
    void transition(nb::handle rid, int64_t code, int expected) const {
        if (code == OK) return;
        if (code == ALREADY_SUSPENDED)
            PyErr_Format(transition_error_.ptr(), "request %R is already suspended", rid.ptr());
        else if (code == NOT_SUSPENDED)
            PyErr_Format(transition_error_.ptr(), "request %R is not suspended", rid.ptr());
        else
            raise_state(rid, handle_of(rid), expected == ACTIVE ? "active" : "waiting");
        throw nb::python_error();
    }

    [[noreturn]] void raise_state(nb::handle rid, uint32_t h, const char* expected) const {
        const char* state = reqs_[h].state == ACTIVE ? "active" : "waiting";
        if (expected == nullptr)
            PyErr_Format(transition_error_.ptr(), "request %R is %s, not waiting", rid.ptr(), state);
        else
            PyErr_Format(transition_error_.ptr(), "request %R is %s, expected %s", rid.ptr(), state, expected);
        throw nb::python_error();
    }

    void refuse_duplicate(nb::handle rid) const {
        int present = PyDict_Contains(handles_.ptr(), rid.ptr());
        if (present < 0) throw nb::python_error();
        if (present) {
            PyErr_Format(duplicate_error_.ptr(), "request %R is already in the tree", rid.ptr());
            throw nb::python_error();
        }
    }

    // An arrival as a double (false for None); `InvalidArrival`, raised here, for NaN and for anything float()
    // refuses (an int too large for a double included), as tree.py's `checked_arrival`.
    bool read_arrival(nb::handle rid, nb::handle arrival, double& out) const {
        if (arrival.is_none()) return false;
        if (PyFloat_CheckExact(arrival.ptr())) {
            out = PyFloat_AS_DOUBLE(arrival.ptr());
        } else {
            nb::object value = nb::steal(PyNumber_Float(arrival.ptr()));
            if (!value.is_valid()) {
                PyErr_Clear();
                PyErr_Format(invalid_arrival_error_.ptr(), "request %R has arrival %R, not a number", rid.ptr(),
                             arrival.ptr());
                throw nb::python_error();
            }
            out = PyFloat_AS_DOUBLE(value.ptr());
        }
        if (std::isnan(out)) {
            PyErr_Format(invalid_arrival_error_.ptr(), "request %R has arrival NaN", rid.ptr());
            throw nb::python_error();
        }
        return true;
    }

    nb::object pack_tokens(PyObject* source) const {
        nb::object packed = nb::steal(PyObject_CallOneArg(token_bytes_.ptr(), source));
        if (!packed.is_valid()) throw nb::python_error();
        return packed;
    }

    uint64_t read_seed(nb::handle ns) const {
        if (ns.is_none()) return 0;
        nb::object value = nb::steal(PyObject_CallOneArg(namespace_seed_.ptr(), ns.ptr()));
        if (!value.is_valid()) throw nb::python_error();
        uint64_t seed = PyLong_AsUnsignedLongLong(value.ptr());
        if (PyErr_Occurred()) throw nb::python_error();
        return seed;
    }

    // Digests of ids `token_bytes` already packed (and checked) as 4-byte little-endian words.
    int64_t hash_packed(PyObject* packed, size_t chunk, uint64_t seed) {
        char* data;
        Py_ssize_t size;
        if (PyBytes_AsStringAndSize(packed, &data, &size) != 0) throw nb::python_error();
        if (size == 0) return EMPTY;
        U32Tokens src{reinterpret_cast<const unsigned char*>(data)};
        cumulative_xxh64(src, static_cast<size_t>(size) / 4, chunk, seed, scratch_.lanes, hashes_);
        return OK;
    }

    // Records an inserted request's handle under its id; raises the Python tree's error for a refused one.
    int64_t added(nb::handle rid, int64_t code) {
        if (code < 0) {
            PyObject* rp = rid.ptr();
            switch (code) {
                case EMPTY:
                    PyErr_Format(empty_error_.ptr(), "request %R has no chunks", rp);
                    break;
                case INVALID_TOKENS:
                    PyErr_Format(invalid_tokens_error_.ptr(),
                                 "request %R: token ids must be a 1-D integer sequence in [0, 2**32)", rp);
                    break;
                case HASH_CHAIN:
                    PyErr_Format(hash_chain_error_.ptr(),
                                 "request %R: a hash repeats, skips a level or sits under another prefix: hashes "
                                 "are not cumulative or two prefixes collide",
                                 rp);
                    break;
                case BAD_HASH:
                    PyErr_Format(hash_chain_error_.ptr(), "request %R: chunk hashes must be integers in [0, 2**64)",
                                 rp);
                    break;
                default:
                    PyErr_Format(invalid_arrival_error_.ptr(), "request %R has arrival NaN", rp);
            }
            throw nb::python_error();
        }
        uint32_t h = static_cast<uint32_t>(code & 0xFFFFFFFF);
        PyObject* ids = ids_.ptr();
        if (static_cast<Py_ssize_t>(h) == PyList_GET_SIZE(ids)) {
            if (PyList_Append(ids, rid.ptr()) != 0) throw nb::python_error();
        } else if (PyList_SetItem(ids, h, Py_NewRef(rid.ptr())) != 0) {
            throw nb::python_error();
        }
        nb::object handle = nb::steal(PyLong_FromUnsignedLong(h));
        if (PyDict_SetItem(handles_.ptr(), rid.ptr(), handle.ptr()) != 0) throw nb::python_error();
        return code >> 32;
    }

    void forget(nb::handle rid, uint32_t h) {
        if (PyDict_DelItem(handles_.ptr(), rid.ptr()) != 0) throw nb::python_error();
        if (PyList_SetItem(ids_.ptr(), h, Py_NewRef(Py_None)) != 0) throw nb::python_error();
    }

    // ------------------------------------------------------------------ paths and counts

    // Three sweeps: match the known prefix, give every new chunk a node and an index entry (the only step that
    // can fail: a known hash after a new one, or a repeat, is rolled back), then commit the request and its new
    // nodes in one pass from the leaf up, which also does what `offer` does for them (each new node's heap
    // holds the one entry below it). `offer` then handles the known prefix.
    // Encoded result: (num_chunks << 32) | handle, or a negative status.
    int64_t insert(const std::vector<uint64_t>& hashes, double arrival, bool has_arrival) {
        if (hashes.empty()) return EMPTY;
        if (has_arrival && std::isnan(arrival)) return BAD_ARRIVAL;
        std::vector<uint32_t> path;
        size_t num_existing;
        int64_t status = build_path(hashes, path, num_existing);
        if (status != OK) return status;
        uint32_t h = alloc_request();
        Req& r = reqs_[h];
        uint64_t seq = next_seq_++;
        r.path = std::move(path);
        r.seq = seq;
        r.arrival = has_arrival ? arrival : static_cast<double>(seq);
        r.state = WAITING;
        r.suspended = false;
        link_all(h);
        ++num_requests_;
        for (size_t d = 0; d < num_existing; ++d) {
            Node& n = nodes_[r.path[d]];
            if (n.num_waiting++ == 0 && n.cached && n.num_active == 0) ++num_idle_cached_;
        }
        adopt_new_nodes(h, num_existing);
        publish(h, num_existing);
        reweigh(h);
        best_valid_ = false;
        return (static_cast<int64_t>(r.path.size()) << 32) | h;
    }

    // The new nodes of request `h`'s path (depths num_existing + 1 ..): alive, numbered in depth order, held
    // by `h` alone, each with the one candidate below it (pushed leaf first, as `offer` numbers them): a
    // first-level node when nothing was known, one node per chunk the cache tier holds, and the rest as one
    // tail (or one ordinary node).
    void adopt_new_nodes(uint32_t h, size_t num_existing) {
        const Req& r = reqs_[h];
        const auto& path = r.path;
        size_t len = path.size();
        if (num_existing == len) return;
        AKey key = r.key();
        uint64_t base = next_serial_;
        next_serial_ += len - num_existing;
        uint32_t below = h, below_gen = r.gen;
        bool below_is_req = true;
        for (size_t i = len; i > num_existing;) {
            Node& n = nodes_[path[i - 1]];
            size_t first = first_index(n);
            n.alive = true;
            n.serial = base + (first - num_existing);
            if (n.depth == 1) n.side = alloc_level();
            else if (n.span > 1) tails_[n.side].owner = h;
            n.num_waiting = 1;
            num_idle_cached_ += n.cached;  // new: no running request holds it
            n.candidates.push_back(CEntry{key, next_push_++, below, below_gen, below_is_req});
            n.has_best = true;
            n.best = key;
            n.best_req = h;
            n.best_gen = r.gen;
            below = path[i - 1];
            below_gen = n.gen;
            below_is_req = false;
            i = first;
        }
        num_nodes_ += len - num_existing;
    }

    // Paths are walked node by node; issuing every load first lets the misses overlap (nodes of one
    // request are scattered over the slab once requests come and go).
    void prefetch_path(const std::vector<uint32_t>& path) const {
        for (size_t d = 0, len = num_distinct(path); d < len; ++d) FEATHER_PREFETCH(&nodes_[path[d]]);
    }

    // Nodes on a path, counting a tail (which repeats over its chunks at the path's end) once: the walks that
    // update counts visit path[0 .. num_distinct).
    size_t num_distinct(const std::vector<uint32_t>& path) const {
        return path.size() - nodes_[path.back()].span + 1;
    }

    // Path index of a node's first chunk (a tail's chunks run from there to its depth).
    static size_t first_index(const Node& n) { return n.depth - n.span; }

    // The hash and the creation serial of the chunk at path[d] (a tail's chunks are numbered from its first).
    uint64_t chunk_hash(const std::vector<uint32_t>& path, size_t d) const {
        const Node& n = nodes_[path[d]];
        return n.span > 1 ? tails_[n.side].hashes[d - first_index(n)] : n.hash;
    }
    uint64_t chunk_serial(const std::vector<uint32_t>& path, size_t d) const {
        const Node& n = nodes_[path[d]];
        return n.serial + (d - first_index(n));
    }

    // Index slots are prefetched a window ahead of the walk, so their misses overlap. Three phases, so that a
    // refused chain changes nothing: match the known prefix (into a tail by comparing its stored hashes),
    // register every new hash (a known one after a new one, or a repeat, rolls the new entries back), then
    // commit: split a matched tail and set up the new nodes, which `adopt_new_nodes` makes alive. The new chunks
    // that are cached (the tier holds them below a cached parent, tree.py's `_build_path`) get a node each.
    int64_t build_path(const std::vector<uint64_t>& hashes, std::vector<uint32_t>& path, size_t& num_existing) {
        constexpr size_t AHEAD = 12;
        size_t len = hashes.size();
        path.resize(len);
        for (size_t k = 0; k < std::min(AHEAD, len); ++k) index_.prefetch(hashes[k]);
        uint32_t parent = ROOT, tail = NIL;
        size_t i = 0, num_in_tail = 0;
        for (; i < len; ++i) {
            if (i + AHEAD < len) index_.prefetch(hashes[i + AHEAD]);
            uint32_t id = index_.find(hashes[i]);
            if (id == NIL) break;
            const Node& n = nodes_[id];
            if (n.parent != parent) return HASH_CHAIN;
            if (n.span > 1) {  // the tail's first chunk (a parent match puts it at this depth) and what follows
                const auto& known = tails_[n.side].hashes;
                if (known[0] != hashes[i]) return HASH_CHAIN;
                num_in_tail = 1;
                while (num_in_tail < known.size() && i + num_in_tail < len &&
                       hashes[i + num_in_tail] == known[num_in_tail])
                    ++num_in_tail;
                tail = id;
                i += num_in_tail;
                break;
            }
            path[i] = id;
            parent = id;
        }
        num_existing = i;
        // The new nodes: a first-level one when nothing matched, one per cached chunk, then the rest as one.
        size_t num_cached = tail == NIL ? cached_run(hashes, i, parent) : 0;
        auto& fresh = fresh_;
        fresh.clear();
        auto starts_node = [i, num_cached](size_t j) { return j <= i + num_cached || j == 1; };
        auto indexed = [&](size_t j) { return tails_indexed_ || starts_node(j); };
        auto roll_back = [&](size_t end) {
            for (size_t k = end; k-- > i;)
                if (indexed(k)) index_.erase(hashes[k]);
            for (uint32_t id : fresh) free_slot(id);
        };
        for (size_t j = i; j < len; ++j) {
            if (starts_node(j)) fresh.push_back(alloc_node());
            if (!indexed(j)) continue;
            if (j + AHEAD < len) index_.prefetch(hashes[j + AHEAD]);
            if (!index_.insert(hashes[j], fresh.back())) {  // a known hash after a new one, or a repeat
                roll_back(j);
                return HASH_CHAIN;
            }
        }
        if (tail != NIL) {
            size_t at = i - num_in_tail;
            const auto& owner_path = reqs_[tails_[nodes_[tail].side].owner].path;
            if (!prepare_split(tail, num_in_tail)) {
                roll_back(len);
                return HASH_CHAIN;
            }
            split_tail(tail, num_in_tail);
            std::copy(owner_path.begin() + at, owner_path.begin() + i, path.begin() + at);
            parent = path[i - 1];
        }
        for (size_t k = 0, j = i; k < fresh.size(); ++k) {
            uint32_t id = fresh[k];
            size_t end = k + 1 < fresh.size() ? j + 1 : len;
            Node& n = nodes_[id];
            n.cached = j < i + num_cached;
            n.hash = hashes[j];
            n.parent = parent;
            n.depth = static_cast<uint32_t>(end);
            n.span = static_cast<uint32_t>(end - j);
            if (n.span > 1) {
                n.side = alloc_tail();
                tails_[n.side].hashes.assign(hashes.begin() + j, hashes.end());
            }
            std::fill(path.begin() + j, path.begin() + end, id);
            parent = id;
            j = end;
        }
        return OK;
    }

    // How many of hashes[i ..] the cache tier holds as one chain below `parent` (the last known node, or the
    // root), counting none unless `parent` is cached itself: the new nodes that start out cached.
    size_t cached_run(const std::vector<uint64_t>& hashes, size_t i, uint32_t parent) const {
        if (tier_.size() == 0 || (parent != ROOT && !nodes_[parent].cached)) return 0;
        uint32_t above = parent == ROOT ? NIL : tier_.find(nodes_[parent].hash);
        size_t run = 0;
        for (; i + run < hashes.size(); ++run) {
            uint32_t e = tier_.find(hashes[i + run]);
            if (e == NIL || tier_[e].parent != above) break;
            above = e;
        }
        return run;
    }

    // Gives the first `k` chunks of tail `id` (another prompt shares them, or the cache tier holds them)
    // ordinary nodes: the first keeps the id (its parent's entry for it stays valid), the rest stays one node
    // (a tail if it holds two chunks or more) holding the tail's leaf entries. Each new node copies the tail's
    // counts and cached best and sits in its parent's heap under that best, which is what the uncompressed
    // tree's chain holds. The new nodes are uncached (a store flags them after the split).
    //
    // `prepare_split` allocates the new nodes first (and, while a tail's later chunks are not indexed, gives each
    // new node's first chunk its index entry), so that the one step of a split that can fail runs before
    // anything changes: false (nothing changed) if such a chunk's hash is already indexed, which only a digest
    // collision can cause (see `tails_indexed_`).
    bool prepare_split(uint32_t id, size_t k) {
        const Node& t = nodes_[id];
        const auto& hashes = tails_[t.side].hashes;
        size_t count = std::min<size_t>(k, t.span - 1);
        split_ids_.resize(count);
        for (size_t c = 1; c <= count; ++c) split_ids_[c - 1] = alloc_node();
        if (tails_indexed_) return true;
        for (size_t c = 1; c <= count; ++c) {
            if (!index_.insert(hashes[c], split_ids_[c - 1])) {
                for (size_t b = c; --b >= 1;) index_.erase(hashes[b]);
                for (uint32_t u : split_ids_) free_slot(u);
                return false;
            }
        }
        return true;
    }

    void split_tail(uint32_t id, size_t k) {
        Node& t = nodes_[id];
        uint32_t side = t.side, owner = tails_[side].owner, span = t.span, end = t.depth;
        size_t at = first_index(t);
        auto& path = reqs_[owner].path;
        Candidates leaf_entries;
        leaf_entries.swap(t.candidates);
        t.span = 1;
        t.depth = static_cast<uint32_t>(at + 1);
        t.side = NIL;
        uint32_t prev = id;
        for (size_t c = 1; c <= k && c < span; ++c) {
            bool rest = c == k;  // offsets [k, span): one node
            uint32_t u = split_ids_[c - 1];
            const Node& src = nodes_[id];
            Node& n = nodes_[u];
            n.alive = true;
            n.parent = prev;
            n.depth = static_cast<uint32_t>(rest ? end : at + c + 1);
            n.span = rest ? span - static_cast<uint32_t>(k) : 1;
            n.num_active = src.num_active;
            n.num_waiting = src.num_waiting;
            n.cached = false;  // as the tail's chunks (a store flags them after the split)
            n.has_best = src.has_best;
            n.best = src.best;
            n.best_req = src.best_req;
            n.best_gen = src.best_gen;
            n.serial = src.serial + c;
            n.hash = tails_[side].hashes[c];
            size_t last = rest ? span : c + 1;
            if (tails_indexed_)
                for (size_t o = c; o < last; ++o) index_.assign(tails_[side].hashes[o], u);
            std::fill(path.begin() + at + c, path.begin() + at + last, u);
            if (src.has_best) nodes_[prev].candidates.push_back(CEntry{src.best, next_push_++, u, n.gen, false});
            prev = u;
            if (rest) break;
        }
        nodes_[prev].candidates.swap(leaf_entries);
        Node& leaf = nodes_[prev];
        if (leaf.span > 1) {
            leaf.side = side;
            auto& hashes = tails_[side].hashes;
            hashes.erase(hashes.begin(), hashes.begin() + static_cast<std::ptrdiff_t>(k));
        } else {
            free_tail(side);
        }
        if (shared_ == id) shared_ = path.back();
    }

    // The switch `tails_indexed_` describes: every live tail's later chunks get their index entries. False, with
    // nothing changed, if one of them is already indexed (two token prompts whose digests collide).
    bool index_tail_chunks() {
        std::vector<uint64_t> added;
        for (uint32_t side = 0; side < tails_.size(); ++side) {
            const Tail& t = tails_[side];
            if (t.owner == NIL) continue;
            uint32_t id = reqs_[t.owner].path.back();
            for (size_t k = 1; k < t.hashes.size(); ++k) {
                if (!index_.insert(t.hashes[k], id)) {
                    for (uint64_t h : added) index_.erase(h);
                    return false;
                }
                added.push_back(t.hashes[k]);
            }
        }
        tails_indexed_ = true;
        return true;
    }

    // A released slot of `slab` if there is one, else a new one at its end.
    template <typename S>
    static uint32_t take_slot(S& slab, std::vector<uint32_t>& free) {
        if (!free.empty()) {
            uint32_t id = free.back();
            free.pop_back();
            return id;
        }
        slab.emplace_back();
        return static_cast<uint32_t>(slab.size() - 1);
    }

    uint32_t alloc_node() {
        uint32_t id = take_slot(nodes_, free_nodes_);
        if (id == node_gens_.size()) node_gens_.push_back(0);
        return id;
    }

    uint32_t alloc_level() { return take_slot(levels_, free_levels_); }

    uint32_t alloc_tail() { return take_slot(tails_, free_tails_); }

    void free_tail(uint32_t slot) {
        Tail& t = tails_[slot];
        t.owner = NIL;
        release(t.hashes);
        free_tails_.push_back(slot);
    }

    void free_slot(uint32_t id) {  // a slot never made alive (build_path rollback)
        free_nodes_.push_back(id);
    }

    void release_node(uint32_t id) {
        Node& n = nodes_[id];
        n.alive = false;
        node_gens_[id] = ++n.gen;
        index_.forget(tails_indexed_ ? n.span : 1);
        n.has_best = n.has_global = n.has_stranger = n.cached = false;
        n.num_active = n.num_waiting = 0;
        release(n.candidates);
        if (n.depth == 1) {
            release(levels_[n.side].arrivals);
            free_levels_.push_back(n.side);
        } else if (n.span > 1) {
            free_tail(n.side);
        }
        n.side = NIL;
        num_nodes_ -= n.span;
        n.span = 1;
        free_nodes_.push_back(id);
    }

    template <typename V>
    static void release(V& v) {
        if (v.capacity() > 16) V().swap(v);
        else v.clear();
    }

    uint32_t alloc_request() { return take_slot(reqs_, free_reqs_); }

    void drop_request(uint32_t h) {
        Req& r = reqs_[h];
        unlink_all(h);
        --num_requests_;
        r.state = FREE;
        ++r.gen;
        std::vector<uint32_t> path;
        path.swap(r.path);
        release_nodes(path);
        trim_roots();
        free_reqs_.push_back(h);
    }

    void release_nodes(const std::vector<uint32_t>& path) {
        size_t len = num_distinct(path);
        for (size_t i = len; i-- > 0;) {
            const Node& n = nodes_[path[i]];
            if (n.num_active || n.num_waiting) break;
            release_node(path[i]);
        }
        for (size_t i = 0; i < len; ++i) {
            Node& n = nodes_[path[i]];
            if (!n.alive) break;
            size_t live = n.num_waiting + n.num_active;
            if (n.candidates.size() > 4 * live + COMPACT_MIN) compact_candidates(n.candidates);
            if (n.depth == 1 && levels_[n.side].arrivals.size() > 4 * live + COMPACT_MIN)
                compact_arrivals(levels_[n.side].arrivals);
        }
    }

    void trim_roots() {
        if (global_.size() > 2 * num_nodes_ + COMPACT_MIN) compact_global();
        if (strangers_.size() > 2 * num_nodes_ + COMPACT_MIN) compact_strangers();
        if (by_arrival_.size() > 2 * num_requests_ + COMPACT_MIN) compact_arrivals(by_arrival_);
    }

    void unsuspend(uint32_t h) {
        Req& r = reqs_[h];
        r.suspended = false;
        uint32_t at = r.suspended_at, last = suspended_.back();
        suspended_[at] = last;
        reqs_[last].suspended_at = at;
        suspended_.pop_back();
        r.suspended_at = NIL;
    }

    void link_all(uint32_t h) {
        Req& r = reqs_[h];
        r.prev = all_.tail;
        r.next = NIL;
        if (all_.tail != NIL) reqs_[all_.tail].next = h;
        else all_.head = h;
        all_.tail = h;
    }
    void unlink_all(uint32_t h) {
        Req& r = reqs_[h];
        if (r.prev != NIL) reqs_[r.prev].next = r.next;
        else all_.head = r.next;
        if (r.next != NIL) reqs_[r.next].prev = r.prev;
        else all_.tail = r.prev;
    }
    void link_active(uint32_t h) {
        Req& r = reqs_[h];
        r.prev_act = running_.tail;
        r.next_act = NIL;
        if (running_.tail != NIL) reqs_[running_.tail].next_act = h;
        else running_.head = h;
        running_.tail = h;
    }
    void unlink_active(uint32_t h) {
        Req& r = reqs_[h];
        if (r.prev_act != NIL) reqs_[r.prev_act].next_act = r.next_act;
        else running_.head = r.next_act;
        if (r.next_act != NIL) reqs_[r.next_act].prev_act = r.prev_act;
        else running_.tail = r.prev_act;
    }

    // Largest d <= limit with pred(path[d-1]) (0 if none), for a predicate that holds on a prefix of the path.
    template <typename Pred>
    int64_t last_where(const std::vector<uint32_t>& path, size_t limit, Pred pred) const {
        size_t lo = 0, hi = limit;
        while (lo < hi) {
            size_t mid = (lo + hi + 1) / 2;
            if (pred(nodes_[path[mid - 1]])) lo = mid;
            else hi = mid - 1;
        }
        return static_cast<int64_t>(lo);
    }

    // `num_active` falls with depth along a path.
    int64_t last_depth(const std::vector<uint32_t>& path, size_t limit, size_t threshold) const {
        return last_where(path, limit, [threshold](const Node& n) { return n.num_active >= threshold; });
    }

    // The cached nodes, and so the covered ones, are a prefix of every path.
    int64_t last_cached(const std::vector<uint32_t>& path, size_t limit) const {
        return last_where(path, limit, [](const Node& n) { return n.cached; });
    }
    int64_t covered_depth(const std::vector<uint32_t>& path) const { return last_where(path, path.size(), covered); }

    // tree.py's `is_covered`: a running request holds the prefix, or the engine's cache does.
    static bool covered(const Node& n) { return n.num_active > 0 || n.cached; }

    void update_shared_after_activate(uint32_t h) {
        const auto& path = reqs_[h].path;
        if (num_active_ == 1) {
            shared_ = path.back();
            return;
        }
        size_t limit = std::min(path.size(), static_cast<size_t>(shared_depth()));
        int64_t d = last_depth(path, limit, num_active_);
        shared_ = d ? path[static_cast<size_t>(d - 1)] : ROOT;
    }

    void update_shared_after_leave() {
        if (num_active_ == 0) {
            shared_ = NIL;
            return;
        }
        const auto& path = reqs_[running_.head].path;
        int64_t d = last_depth(path, path.size(), num_active_);
        shared_ = d ? path[static_cast<size_t>(d - 1)] : ROOT;
    }

    void leave_working_set(uint32_t h) {
        unlink_active(h);
        --num_active_;
        left_.clear();
        const auto& path = reqs_[h].path;
        for (size_t d = 0, len = num_distinct(path); d < len; ++d) {
            Node& n = nodes_[path[d]];
            if (--n.num_active != 0) continue;
            if (!n.cached) left_.push_back(path[d]);
            else if (n.num_waiting > 0) ++num_idle_cached_;
        }
        if (!path.empty() && nodes_[path[0]].num_active == 0) --num_running_groups_;
        std::reverse(left_.begin(), left_.end());
        reoffer(left_);
        update_shared_after_leave();
    }

    // Nodes that just left coverage, deepest first: each re-offers its subtree's best to its parent, which
    // gets a global entry when it is still covered (a first-level node gets a stranger entry instead).
    void reoffer(const std::vector<uint32_t>& left) {
        for (uint32_t id : left) {
            Node& n = nodes_[id];
            if (n.num_waiting == 0) {
                n.has_best = false;
                continue;
            }
            bool has_best = refresh(id);
            if (n.depth == 1) {
                push_stranger(id);
                continue;
            }
            if (has_best) push(n.parent, n.best, id, n.gen, false);
            if (covered(nodes_[n.parent])) push_global(n.parent);
        }
    }

    // The covered nodes of request `h`'s path gained a request: their global keys (which count the requests
    // through them) fell, so the ones that have an entry push it again.
    void reweigh(uint32_t h) {
        const auto& path = reqs_[h].path;
        for (size_t d = 0, len = num_distinct(path); d < len; ++d) {
            const Node& n = nodes_[path[d]];
            if (!covered(n)) return;
            if (n.has_global) push_global(path[d]);
        }
    }

    // ------------------------------------------------------------------ cache events

    // The chain `chain` below `parent` (none: from the start; cached if given) is now cached: the chunks newly
    // cached, or HASH_CHAIN with nothing changed (tree.py's `cache_store`). Tree nodes whose parent is cached
    // (or that are first-level) are flagged as their hash enters the tier; a flagged node that is not running
    // enters coverage and gets a global entry if requests wait below it. A store that reaches a tail's first
    // chunk below a cached node caches the run of the chain that follows it into the tail: that run is split
    // off first (`split_tail`), so cached chunks are ordinary nodes. Every tail chunk is indexed from the first
    // store on (`tails_indexed_`), so the checks see every chunk of the tree, as tree.py's do.
    int64_t cache_store(const std::vector<uint64_t>& chain, bool has_parent, uint64_t parent) {
        if (chain.empty()) return 0;
        if (!tails_indexed_ && !index_tail_chunks()) return HASH_CHAIN;
        if (!chain_fits(chain, has_parent, parent)) return HASH_CHAIN;
        uint32_t above = has_parent ? tier_.find(parent) : NIL;
        entered_.clear();
        bool flagged = false;
        int64_t stored = 0;
        for (size_t k = 0; k < chain.size(); ++k) {
            uint64_t h = chain[k];
            uint32_t known = tier_.find(h);
            if (known != NIL) {
                above = known;
                continue;
            }
            above = tier_.add(h, above);
            ++stored;
            uint32_t id = index_.find(h);
            if (id == NIL) continue;
            const Node& n = nodes_[id];
            if (n.span == 1) {
                if (n.depth == 1 || nodes_[n.parent].cached) flagged |= flag_cached(id);
                continue;
            }
            // A tail: only its first chunk can become cached (each later one's parent is the tail's chunk before
            // it, uncached), and the chain's next hashes are new to the tier (their parents were not cached).
            if (n.hash != h || !nodes_[n.parent].cached) continue;
            const auto& hashes = tails_[n.side].hashes;
            size_t run = 1;
            while (k + run < chain.size() && run < hashes.size() && chain[k + run] == hashes[run]) ++run;
            const auto& path = reqs_[tails_[n.side].owner].path;
            size_t at = first_index(n);
            prepare_split(id, run);  // cannot fail: every tail chunk is indexed
            split_tail(id, run);
            for (size_t j = 0; j < run; ++j) {
                if (j > 0) {
                    above = tier_.add(chain[k + j], above);
                    ++stored;
                }
                flagged |= flag_cached(path[at + j]);
            }
            k += run - 1;
        }
        for (uint32_t id : entered_)
            if (nodes_[id].num_waiting) push_global(id);
        if (flagged) best_valid_ = false;
        return stored;
    }

    bool flag_cached(uint32_t id) {
        Node& n = nodes_[id];
        n.cached = true;
        if (n.num_active == 0) {
            entered_.push_back(id);
            num_idle_cached_ += n.num_waiting > 0;
        }
        return true;
    }

    // tree.py's `_check_chain`: no hash repeats within the chain, and none is cached, or a chunk of the tree,
    // under a parent other than the hash before it in the chain (`above` for the first). A chunk inside a
    // tail has the tail's chunk before it as its parent: the walk follows a chain through a tail by offset,
    // searching the tail's hashes only for a first hash below a `parent` inside one.
    bool chain_fits(const std::vector<uint64_t>& chain, bool has_above, uint64_t above) {
        chain_sorted_.assign(chain.begin(), chain.end());
        std::sort(chain_sorted_.begin(), chain_sorted_.end());
        if (std::adjacent_find(chain_sorted_.begin(), chain_sorted_.end()) != chain_sorted_.end()) return false;
        uint32_t tail = NIL;  // the tail holding the chain's previous hash, at `offset`, if one does
        size_t offset = 0;
        for (size_t k = 0; k < chain.size(); ++k) {
            uint64_t h = chain[k];
            uint32_t known = tier_.find(h);
            if (known != NIL && !tier_.parent_is(known, has_above, above)) return false;
            uint32_t id = index_.find(h);
            if (id == NIL) {
                tail = NIL;
            } else if (nodes_[id].span == 1) {
                const Node& n = nodes_[id];
                if (n.depth == 1 ? has_above : !has_above || nodes_[n.parent].hash != above) return false;
                tail = NIL;
            } else {
                const Node& n = nodes_[id];
                const auto& hashes = tails_[n.side].hashes;
                size_t at;
                if (tail == id && offset + 1 < hashes.size() && hashes[offset + 1] == h) {
                    at = offset + 1;
                } else if (hashes[0] == h) {
                    at = 0;
                } else if (k == 0 && has_above) {
                    at = static_cast<size_t>(std::find(hashes.begin(), hashes.end(), h) - hashes.begin());
                    if (at == hashes.size()) return false;
                } else {
                    return false;  // its parent, the tail's chunk before it, is not the chain's previous hash
                }
                uint64_t parent_hash = at == 0 ? nodes_[n.parent].hash : hashes[at - 1];
                if (!has_above || parent_hash != above) return false;
                tail = id;
                offset = at;
            }
            has_above = true;
            above = h;
        }
        return true;
    }

    // Tree nodes of hashes the tier dropped lose their flag; those that leave coverage re-offer their subtree,
    // deepest first (tree.py's `_leave_cache`). A tail's chunks were never flagged.
    void leave_cache(const std::vector<uint64_t>& gone) {
        left_.clear();
        for (uint64_t h : gone) {
            uint32_t id = index_.find(h);
            if (id == NIL || !nodes_[id].cached) continue;
            Node& n = nodes_[id];
            n.cached = false;
            best_valid_ = false;
            if (n.num_active == 0) {
                left_.push_back(id);
                num_idle_cached_ -= n.num_waiting > 0;
            }
        }
        std::stable_sort(left_.begin(), left_.end(),
                         [this](uint32_t a, uint32_t b) { return nodes_[a].depth > nodes_[b].depth; });
        reoffer(left_);
    }

    // ------------------------------------------------------------------ the lazy heaps

    bool live_waiting(uint32_t h, uint32_t gen) const {
        const Req& r = reqs_[h];
        return r.gen == gen && r.state == WAITING && !r.suspended;
    }

    bool live_child(const CEntry& e) const {
        const Node& c = nodes_[e.item];
        return c.gen == e.gen && c.alive && !covered(c) && c.has_best && c.best == e.k;
    }

    void push(uint32_t node, const AKey& key, uint32_t item, uint32_t gen, bool is_req) {
        Node& n = nodes_[node];
        heap_push<CEntry, CAfter>(n.candidates, CEntry{key, next_push_++, item, gen, is_req});
        if (n.candidates.size() > 4 * (n.num_waiting + n.num_active) + COMPACT_MIN) compact_candidates(n.candidates);
    }

    void publish(uint32_t h, size_t num_existing) {
        offer(h, num_existing);
        push_arrival(h);
        const Req& r = reqs_[h];
        Node& first = nodes_[r.path[0]];
        if (!covered(first)) {
            Key key{0, r.arrival, r.seq};
            if (!first.has_stranger || key < levels_[first.side].stranger_key) push_stranger_key(r.path[0], key);
        }
    }

    // Publishes a waiting request for tier 1 (tree.py's `_offer`): its leaf entry, then cached bests upwards
    // until a node's cached best already bounds it, a covered node (which gets a global entry) or the first
    // level. The new nodes below `num_existing` are set up already (`adopt_new_nodes`); when the first of them
    // is cached (the tier held the prompt's prefix), the deepest cached one gets the global entry.
    void offer(uint32_t h, size_t num_existing) {
        const Req& r = reqs_[h];
        AKey key = r.key();
        const auto& path = r.path;
        uint32_t node;
        if (num_existing < path.size()) {
            uint32_t below = path[num_existing];
            if (num_existing) push(path[num_existing - 1], key, below, nodes_[below].gen, false);
            if (nodes_[below].cached) {
                push_global(path[static_cast<size_t>(covered_depth(path)) - 1]);
                return;
            }
            if (num_existing == 0) return;
            node = path[num_existing - 1];
        } else {
            node = path.back();
            push(node, key, h, r.gen, true);
        }
        while (!covered(nodes_[node])) {
            Node& n = nodes_[node];
            if (n.has_best && n.best <= key) return;
            n.has_best = true;
            n.best = key;
            n.best_req = h;
            n.best_gen = r.gen;
            if (n.depth == 1) return;
            uint32_t parent = n.parent;
            push(parent, key, node, n.gen, false);
            node = parent;
        }
        push_global(node);
    }

    // Tier-1 rank of the waiting requests leaving coverage right below `n` (tree.py's `_global_key`): deepest
    // first, then a node running requests hold before one only the cache holds, then the most requests through
    // it (waiting or running), then the earliest of them (`top`). The first three are one int64:
    // -(depth << 33 | runs << 32 | requests).
    static Key global_key(const Node& n, const AKey& top) {
        uint64_t runs = n.num_active > 0 ? 1 : 0;
        uint64_t weight = (static_cast<uint64_t>(n.depth) << 33) | (runs << 32) | (n.num_waiting + n.num_active);
        return Key{-static_cast<int64_t>(weight), top.a, top.s};
    }

    void push_global(uint32_t node) {
        const CEntry* top = settle(node);
        if (top == nullptr) return;
        Node& n = nodes_[node];
        Key key = global_key(n, top->k);
        if (n.has_global && n.global_key <= key) return;
        n.has_global = true;
        n.global_key = key;
        heap_push<GEntry, GAfter>(global_, GEntry{key, next_push_++, node, n.gen});
        if (global_.size() > 2 * num_nodes_ + COMPACT_MIN) compact_global();
    }

    void push_arrival(uint32_t h) {
        const Req& r = reqs_[h];
        AEntry e{AKey{r.arrival, r.seq}, h, r.gen};
        Node& first = nodes_[r.path[0]];
        auto& arrivals = levels_[first.side].arrivals;
        heap_push<AEntry, AAfter>(arrivals, e);
        if (arrivals.size() > 4 * (first.num_waiting + first.num_active) + COMPACT_MIN) compact_arrivals(arrivals);
        heap_push<AEntry, AAfter>(by_arrival_, e);
        if (by_arrival_.size() > 2 * num_requests_ + COMPACT_MIN) compact_arrivals(by_arrival_);
    }

    void push_stranger(uint32_t first) {
        const AEntry* top = settle_arrivals(first);
        if (top == nullptr) return;
        Key key{0, top->k.a, top->k.s};
        const Node& n = nodes_[first];
        if (!n.has_stranger || key < levels_[n.side].stranger_key) push_stranger_key(first, key);
    }

    void push_stranger_key(uint32_t first, const Key& key) {
        Node& n = nodes_[first];
        n.has_stranger = true;
        levels_[n.side].stranger_key = key;
        heap_push<GEntry, GAfter>(strangers_, GEntry{key, next_push_++, first, n.gen});
        if (strangers_.size() > 2 * num_nodes_ + COMPACT_MIN) compact_strangers();
    }

    const AEntry* settle_arrivals(uint32_t first) {
        auto& heap = levels_[nodes_[first].side].arrivals;
        while (!heap.empty()) {
            const AEntry& e = heap.front();
            if (live_waiting(e.req, e.gen)) return &heap.front();
            heap_pop<AEntry, AAfter>(heap);
        }
        return nullptr;
    }

    // The valid top entry of `node`'s candidates (stale entries dropped, blocked children recomputed).
    const CEntry* settle(uint32_t node) {
        auto& stack = settle_stack_;
        stack.clear();
        stack.push_back(node);
        while (true) {
            uint32_t current = stack.back();
            auto& heap = nodes_[current].candidates;
            uint32_t blocked = NIL;
            while (!heap.empty()) {
                const CEntry& e = heap.front();
                if (e.is_req) {
                    if (live_waiting(e.item, e.gen)) break;
                } else if (live_child(e)) {
                    const Node& c = nodes_[e.item];
                    if (live_waiting(c.best_req, c.best_gen)) break;
                    blocked = e.item;
                }
                heap_pop<CEntry, CAfter>(heap);
                if (blocked != NIL) break;
            }
            if (blocked != NIL) {
                stack.push_back(blocked);
                continue;
            }
            stack.pop_back();
            const CEntry* top = heap.empty() ? nullptr : &heap.front();
            if (stack.empty()) return top;
            set_best(current, top);
            const Node& n = nodes_[current];
            if (n.has_best) push(stack.back(), n.best, current, n.gen, false);
        }
    }

    void set_best(uint32_t node, const CEntry* top) {
        Node& n = nodes_[node];
        if (top == nullptr) {
            n.has_best = false;
            return;
        }
        n.has_best = true;
        n.best = top->k;
        if (top->is_req) {
            n.best_req = top->item;
            n.best_gen = top->gen;
        } else {
            const Node& c = nodes_[top->item];
            n.best_req = c.best_req;
            n.best_gen = c.best_gen;
        }
    }

    bool refresh(uint32_t node) {
        set_best(node, settle(node));
        return nodes_[node].has_best;
    }

    // The best sharer, and its covered depth (its global node's).
    uint32_t pop_sharing(int64_t& covered_at) {
        while (!global_.empty()) {
            GEntry e = global_.front();
            Node& n = nodes_[e.node];
            if (n.gen != e.gen || !n.has_global || n.global_key != e.k) {
                heap_pop<GEntry, GAfter>(global_);
                continue;
            }
            if (!n.alive || !covered(n)) {
                n.has_global = false;
                heap_pop<GEntry, GAfter>(global_);
                continue;
            }
            const CEntry* top = settle(e.node);
            if (top == nullptr) {
                n.has_global = false;
                heap_pop<GEntry, GAfter>(global_);
                continue;
            }
            Key key = global_key(n, top->k);
            if (key != n.global_key) {
                n.global_key = key;
                heap_pop<GEntry, GAfter>(global_);
                heap_push<GEntry, GAfter>(global_, GEntry{key, next_push_++, e.node, n.gen});
                continue;
            }
            covered_at = n.depth;
            return top->is_req ? top->item : nodes_[top->item].best_req;
        }
        return NIL;
    }

    uint32_t pop_stranger() {
        while (!strangers_.empty()) {
            GEntry e = strangers_.front();
            Node& n = nodes_[e.node];
            if (n.gen != e.gen || !n.has_stranger || levels_[n.side].stranger_key != e.k) {
                heap_pop<GEntry, GAfter>(strangers_);
                continue;
            }
            if (!n.alive || covered(n)) {
                n.has_stranger = false;
                heap_pop<GEntry, GAfter>(strangers_);
                continue;
            }
            const AEntry* top = settle_arrivals(e.node);
            if (top == nullptr) {
                n.has_stranger = false;
                heap_pop<GEntry, GAfter>(strangers_);
                continue;
            }
            Key key{0, top->k.a, top->k.s};
            if (key != levels_[n.side].stranger_key) {
                levels_[n.side].stranger_key = key;
                heap_pop<GEntry, GAfter>(strangers_);
                heap_push<GEntry, GAfter>(strangers_, GEntry{key, next_push_++, e.node, n.gen});
                continue;
            }
            return top->req;
        }
        return NIL;
    }

    // ------------------------------------------------------------------ compaction

    void compact_candidates(Candidates& heap) {
        Candidates kept;
        kept.reserve(heap.size() / 2);
        for (const CEntry& e : heap)
            if (e.is_req ? live_waiting(e.item, e.gen) : live_child(e)) kept.push_back(e);
        std::sort(kept.begin(), kept.end(), [](const CEntry& x, const CEntry& y) {
            return std::tie(x.is_req, x.item) < std::tie(y.is_req, y.item) ||
                   (std::tie(x.is_req, x.item) == std::tie(y.is_req, y.item) && CAfter()(y, x));
        });
        kept.erase(std::unique(kept.begin(), kept.end(),
                               [](const CEntry& x, const CEntry& y) { return x.is_req == y.is_req && x.item == y.item; }),
                   kept.end());
        std::make_heap(kept.begin(), kept.end(), CAfter());
        heap.swap(kept);
    }

    void compact_arrivals(std::vector<AEntry>& heap) {
        std::vector<AEntry> kept;
        kept.reserve(heap.size() / 2);
        for (const AEntry& e : heap)
            if (live_waiting(e.req, e.gen)) kept.push_back(e);
        std::sort(kept.begin(), kept.end(), [](const AEntry& x, const AEntry& y) { return x.req < y.req; });
        kept.erase(std::unique(kept.begin(), kept.end(), [](const AEntry& x, const AEntry& y) { return x.req == y.req; }),
                   kept.end());
        std::make_heap(kept.begin(), kept.end(), AAfter());
        heap.swap(kept);
    }

    // The live entry per node (the one matching its recorded key); `in_working_set` selects global vs stranger.
    void compact_roots(std::vector<GEntry>& heap, bool global) {
        std::vector<GEntry> kept;
        for (const GEntry& e : heap) {
            const Node& n = nodes_[e.node];
            if (n.gen != e.gen || !n.alive) continue;
            bool has = global ? n.has_global : n.has_stranger;
            const Key& key = global ? n.global_key : levels_[n.side].stranger_key;
            bool placed = global == covered(n);
            if (has && key == e.k && placed) kept.push_back(e);
        }
        std::sort(kept.begin(), kept.end(), [](const GEntry& x, const GEntry& y) { return x.node < y.node; });
        kept.erase(std::unique(kept.begin(), kept.end(), [](const GEntry& x, const GEntry& y) { return x.node == y.node; }),
                   kept.end());
        for (const GEntry& e : heap) {
            Node& n = nodes_[e.node];
            if (n.gen != e.gen) continue;
            (global ? n.has_global : n.has_stranger) = false;
        }
        for (const GEntry& e : kept) {
            Node& n = nodes_[e.node];
            (global ? n.has_global : n.has_stranger) = true;
        }
        std::make_heap(kept.begin(), kept.end(), GAfter());
        heap.swap(kept);
    }
    void compact_global() { compact_roots(global_, true); }
    void compact_strangers() { compact_roots(strangers_, false); }

    int64_t chunk_size_;
    nb::dict handles_;
    nb::list ids_;
    nb::object candidate_cls_, unknown_error_, transition_error_;
    nb::object best_cache_;
    nb::object buffer_types_, token_bytes_, namespace_seed_;
    nb::object duplicate_error_, empty_error_, invalid_tokens_error_, hash_chain_error_, invalid_arrival_error_;
    bool best_valid_ = false;
    static constexpr int NUM_FIELDS = 9;  // `Candidate`'s: the request id, NUM_COUNTS counts, its arrival
    static constexpr int NUM_COUNTS = 7;  // what `describe_into` writes
    uint32_t best_handle_ = NIL;             // the request `best_cache_` describes (NIL: none)
    int64_t best_values_[NUM_COUNTS] = {};  // its `describe_into` values
    nb::object field_names_[NUM_FIELDS];
    Py_ssize_t slot_offsets_[NUM_FIELDS] = {};
    int num_slots_ = 0;  // NUM_FIELDS once every field's slot offset is known (`bind`), else 0

    PyObject** slot_of(PyObject* obj, int field) const {
        return reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + slot_offsets_[field]);
    }

    // `Candidate.runs_uncached` from `describe_into`'s values: running requests hold chunks of its prompt
    // that the cache does not (a prompt held whole counts one chunk less: its last token is always computed).
    static bool runs_uncached(const int64_t* values) { return std::min(values[2], values[0] - 1) > values[3]; }

    void checked(int64_t code) const {
        if (code != OK) throw std::runtime_error("take_picks: a pick changed state during the call");
    }

    Slab<Node, 14> nodes_;  // 16384 x 128 bytes: one huge page per block
    std::vector<uint32_t> free_nodes_;
    Slab<FirstLevel, 8> levels_;
    std::vector<uint32_t> free_levels_;
    Slab<Tail, 10> tails_;
    std::vector<uint32_t> free_tails_;
    Slab<Req, 10> reqs_;
    std::vector<uint32_t> free_reqs_;
    std::vector<uint32_t> node_gens_;  // nodes' generations by id, dense, for the hash index's stale checks
    HashIndex index_;
    List all_, running_;
    std::vector<uint32_t> suspended_;
    std::vector<GEntry> global_, strangers_;
    std::vector<AEntry> by_arrival_;
    size_t num_requests_ = 0, num_active_ = 0, num_nodes_ = 0;
    size_t num_running_groups_ = 0;  // first-level nodes with a running request
    // Cached nodes no running request holds that a waiting request passes through (tree.py's `_num_idle_cached`):
    // the only nodes `cached_frontier` can name.
    size_t num_idle_cached_ = 0;
    uint32_t shared_ = NIL;
    uint64_t next_seq_ = 0, next_serial_ = 0, next_push_ = 0;
    HashScratch scratch_;
    std::vector<uint64_t> hashes_;
    std::vector<uint32_t> settle_stack_, left_, split_ids_, fresh_, entered_;
    CacheTier tier_;
    std::vector<uint64_t> uncached_;  // hashes a remove or clear event took out of the tier
    std::vector<uint64_t> chain_, chain_sorted_;  // a cache event's hashes; a store's chain, sorted (its repeats)
    // Whether a tail's later chunks are in the index too (its first one always is). A tree fed only token ids
    // leaves them out: the digests are this tree's own cumulative xxh64, so a later chunk of one prompt can
    // reappear in another prompt only where that prompt shares everything before it, and then the walk reaches
    // it through the tail's first chunk. Their index entries (96 random slots per 10K-token prompt, and most
    // of the table's growth) would only catch a 64-bit digest collision. The first `insert_hashes` (an
    // engine's hashes, which may not be one chain) indexes every tail's chunks and keeps doing so, so that a
    // repeated or misplaced engine hash is refused exactly as the Python tree refuses it. What this gives up:
    // a digest collision between two token prompts is refused when the colliding chunk is first indexed (a
    // split, or that switch), not at the insert that brought it, and a prompt whose own digests collide is
    // accepted; the chance is about n**2 / 2**65 for n chunks in the tree.
    bool tails_indexed_ = false;
};

// ------------------------------------------------------------------------------------------- invariants

#define REQUIRE(cond, msg)          \
    do {                            \
        if (!(cond)) return (msg);  \
    } while (0)

std::string Tree::check() const {
    std::vector<uint32_t> num_active(nodes_.size(), 0), num_waiting(nodes_.size(), 0);
    size_t count = 0, active = 0, flagged = 0, num_unindexed = 0;
    for (uint32_t h = all_.head; h != NIL; h = reqs_[h].next) {
        const Req& r = reqs_[h];
        ++count;
        REQUIRE(r.state == WAITING || r.state == ACTIVE, "a listed request has no state");
        REQUIRE(!r.path.empty(), "a request with no chunks");
        active += r.state == ACTIVE;
        flagged += r.suspended;
        REQUIRE(!r.suspended || r.state == WAITING, "a running request is suspended");
        uint32_t parent = ROOT;
        size_t len = r.path.size();
        for (size_t d = 0; d < len;) {
            uint32_t id = r.path[d];
            const Node& n = nodes_[id];
            REQUIRE(n.alive && index_.find(n.hash) == id, "dead/unregistered node on a request's path");
            REQUIRE(n.span >= 1 && n.parent == parent && n.depth == d + n.span, "broken chain on a request's path");
            if (n.span > 1) {
                REQUIRE(d >= 1 && n.depth == len, "a tail that is first-level or does not end its owner's path");
                const Tail& t = tails_[n.side];
                REQUIRE(t.owner == h && t.hashes.size() == n.span && t.hashes[0] == n.hash, "a tail's owner or hashes");
                for (size_t k = 0; k < n.span; ++k) {
                    REQUIRE(r.path[d + k] == id, "a tail's chunks are not one run of its owner's path");
                    REQUIRE(!tails_indexed_ || index_.find(t.hashes[k]) == id, "a tail's chunk is not indexed under it");
                }
                num_unindexed += tails_indexed_ ? 0 : n.span - 1;
            }
            (r.state == ACTIVE ? num_active : num_waiting)[id] += 1;
            parent = id;
            d += n.span;
        }
    }
    REQUIRE(count == num_requests_ && active == num_active_, "request counts disagree with the lists");
    size_t listed_active = 0;
    for (uint32_t h = running_.head; h != NIL; h = reqs_[h].next_act) {
        REQUIRE(reqs_[h].state == ACTIVE, "a waiting request in the running list");
        ++listed_active;
    }
    REQUIRE(listed_active == num_active_, "running list length wrong");
    REQUIRE(flagged == suspended_.size(), "suspended flags disagree with the suspended list");
    for (size_t i = 0; i < suspended_.size(); ++i)
        REQUIRE(reqs_[suspended_[i]].suspended && reqs_[suspended_[i]].suspended_at == i, "suspended list broken");
    size_t alive = 0, running_groups = 0, idle_cached = 0;
    for (uint32_t id = 1; id < nodes_.size(); ++id) {
        const Node& n = nodes_[id];
        if (!n.alive) continue;
        alive += n.span;
        running_groups += n.depth == 1 && n.num_active > 0;
        idle_cached += n.cached && n.num_active == 0 && n.num_waiting > 0;
        REQUIRE(n.num_active == num_active[id], "num_active wrong");
        REQUIRE(n.span == 1 || n.num_active + n.num_waiting == 1, "a tail held by more than its owner");
        REQUIRE(n.span == 1 || (!n.has_global && !n.has_stranger), "a tail with a global or stranger key");
        REQUIRE(n.num_waiting == num_waiting[id], "num_waiting wrong");
        REQUIRE(n.num_active + n.num_waiting > 0, "unreferenced node kept");
        size_t live = n.num_active + n.num_waiting;
        REQUIRE(n.candidates.size() <= 4 * live + COMPACT_MIN, "candidate heap unbounded");
        REQUIRE((n.depth == 1 || n.span > 1) == (n.side != NIL), "first-level or tail slot missing, or misplaced");
        REQUIRE(n.depth == 1 || !n.has_stranger, "a stranger key on a deeper node");
        // The flag follows the tier (invariants.py's `_check_cache`); a tail's first chunk, and so each later
        // one, is uncached.
        uint32_t e = tier_.find(n.hash);
        bool first_level = n.depth == n.span;  // (of the node's first chunk)
        bool expected = e != NIL && tier_.parent_is(e, !first_level, first_level ? 0 : nodes_[n.parent].hash) &&
                        (first_level || nodes_[n.parent].cached);
        REQUIRE(n.cached == expected, "cached flag wrong");
        REQUIRE(n.span == 1 || !n.cached, "a cached chunk in a tail");
        REQUIRE(n.depth != 1 || levels_[n.side].arrivals.size() <= 4 * live + COMPACT_MIN, "arrival heap unbounded");
    }
    REQUIRE(running_groups == num_running_groups_, "running group count wrong");
    REQUIRE(idle_cached == num_idle_cached_, "idle cached node count wrong");
    size_t num_entries = num_nodes_ - num_unindexed;  // every chunk's hash but tails' later ones while unindexed
    REQUIRE(alive == num_nodes_ && index_.size() == num_entries && index_.count_live() == num_entries,
            "node registry size wrong");
    REQUIRE(nodes_[ROOT].candidates.empty(), "the root has candidates");
    std::string tier = tier_.check();
    if (!tier.empty()) return tier;
    REQUIRE(global_.size() <= 2 * num_nodes_ + COMPACT_MIN, "global heap unbounded");
    REQUIRE(strangers_.size() <= 2 * num_nodes_ + COMPACT_MIN, "stranger heap unbounded");
    REQUIRE(by_arrival_.size() <= 2 * num_requests_ + COMPACT_MIN, "arrival order unbounded");

    // Shared prefix.
    if (num_active_ == 0) {
        REQUIRE(shared_ == NIL, "shared prefix set with no running request");
    } else {
        size_t depth = 0;
        while (true) {
            uint32_t node = NIL;
            bool same = true;
            for (uint32_t h = running_.head; h != NIL && same; h = reqs_[h].next_act) {
                const auto& p = reqs_[h].path;
                if (p.size() <= depth) same = false;
                else if (node == NIL) node = p[depth];
                else same = p[depth] == node;
            }
            if (!same) break;
            ++depth;
        }
        REQUIRE(static_cast<size_t>(shared_depth()) == depth, "shared depth disagrees with a recount");
    }

    // Lower bounds (see invariants.py): every waiting, unsuspended request is findable through kept entries.
    std::map<std::tuple<uint32_t, uint32_t, bool>, std::vector<AKey>> entries;
    for (uint32_t id = 0; id < nodes_.size(); ++id) {
        if (!nodes_[id].alive) continue;
        for (const CEntry& e : nodes_[id].candidates) entries[{id, e.item, e.is_req}].push_back(e.k);
    }
    auto has_entry = [&](uint32_t node, uint32_t item, bool is_req, const AKey& key, bool exact) {
        auto it = entries.find({node, item, is_req});
        if (it == entries.end()) return false;
        for (const AKey& k : it->second)
            if (exact ? k == key : k <= key) return true;
        return false;
    };
    std::map<uint32_t, Key> live_global, live_strangers;
    for (const GEntry& e : global_) {
        const Node& n = nodes_[e.node];
        if (n.gen == e.gen && n.has_global && n.global_key == e.k) live_global[e.node] = e.k;
    }
    for (const GEntry& e : strangers_) {
        const Node& n = nodes_[e.node];
        if (n.gen == e.gen && n.has_stranger && levels_[n.side].stranger_key == e.k) live_strangers[e.node] = e.k;
    }
    for (uint32_t id = 1; id < nodes_.size(); ++id) {
        const Node& n = nodes_[id];
        if (!n.alive) continue;
        REQUIRE(!n.has_global || live_global.count(id), "a global key with no entry in the global heap");
        REQUIRE(!n.has_stranger || live_strangers.count(id), "a stranger key with no entry in the stranger heap");
    }
    std::set<uint32_t> in_order;
    for (const AEntry& e : by_arrival_)
        if (reqs_[e.req].gen == e.gen && e.k == AKey{reqs_[e.req].arrival, reqs_[e.req].seq}) in_order.insert(e.req);
    for (uint32_t h = all_.head; h != NIL; h = reqs_[h].next) {
        const Req& r = reqs_[h];
        if (r.state != WAITING || r.suspended) continue;
        REQUIRE(in_order.count(h), "a waiting request is missing from the arrival order");
        AKey key = r.key();
        uint32_t first = r.path[0];
        if (!covered(nodes_[first])) {
            bool found = false;
            for (const AEntry& e : levels_[nodes_[first].side].arrivals) found |= e.req == h && e.gen == r.gen;
            REQUIRE(found, "a stranger is missing from its arrival heap");
            const Node& f = nodes_[first];
            Key arrival_key{0, r.arrival, r.seq};
            REQUIRE(f.has_stranger && levels_[f.side].stranger_key <= arrival_key, "no stranger entry bounds a request");
            continue;
        }
        REQUIRE(has_entry(r.path.back(), h, true, key, true), "no leaf entry for a waiting request");
        uint32_t node = r.path.back();
        while (!covered(nodes_[node])) {
            const Node& n = nodes_[node];
            REQUIRE(n.has_best && n.best <= key, "a cached best does not bound a waiting request");
            REQUIRE(has_entry(n.parent, node, false, n.best, true), "a waiting request is unreachable");
            node = n.parent;
        }
        auto it = live_global.find(node);
        Key bound = global_key(nodes_[node], key);
        REQUIRE(it != live_global.end() && it->second <= bound, "no global entry bounds a waiting request");
    }
    return "";
}

#undef REQUIRE

// The XOR of a contiguous buffer's 8-byte words, read with the hash loop's prefetch: what reading a prompt
// once costs with no hashing, the floor under any insert of it (the overhead benchmark's "prompt read").
uint64_t read_words(nb::handle buffer) {
    Py_buffer view;
    if (PyObject_GetBuffer(buffer.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) throw nb::python_error();
    const auto* p = static_cast<const unsigned char*>(view.buf);
    size_t n = static_cast<size_t>(view.len) / 8;
    uint64_t acc = 0;
    for (size_t i = 0; i < n; i += 8) {
        FEATHER_PREFETCH(p + 8 * (i + PREFETCH_TOKENS));
        for (size_t k = i; k < std::min(i + 8, n); ++k) acc ^= read64(p + 8 * k);
    }
    PyBuffer_Release(&view);
    return acc;
}

nb::list chunk_hashes(nb::handle tokens, int64_t chunk_size, uint64_t seed) {
    if (chunk_size < 1) throw nb::value_error("chunk_size must be >= 1");
    HashScratch scratch;
    std::vector<uint64_t> out;
    int64_t status = hash_tokens(tokens.ptr(), static_cast<size_t>(chunk_size), seed, scratch, out);
    if (status == NOT_IN_PLACE) throw nb::value_error("not a 1-D integer buffer in native byte order");
    if (status != OK) throw nb::value_error(status == EMPTY ? "empty" : "invalid tokens");
    nb::list result;
    for (uint64_t h : out) result.append(h);
    return result;
}

}  // namespace


NB_MODULE(_tree, m) {
    if (!little_endian()) throw nb::import_error("the compiled Chunked Hash Tree hashes little-endian words; this machine is not");
    m.doc() = "The compiled Chunked Hash Tree (see tree.cpp); use it through sglang_feather.cht.";
    m.attr("EMPTY") = static_cast<int64_t>(EMPTY);
    m.attr("INVALID_TOKENS") = static_cast<int64_t>(INVALID_TOKENS);
    m.attr("HASH_CHAIN") = static_cast<int64_t>(HASH_CHAIN);
    m.attr("BAD_HASH") = static_cast<int64_t>(BAD_HASH);
    m.attr("BAD_STATE") = static_cast<int64_t>(BAD_STATE);
    m.attr("ALREADY_SUSPENDED") = static_cast<int64_t>(ALREADY_SUSPENDED);
    m.attr("NOT_SUSPENDED") = static_cast<int64_t>(NOT_SUSPENDED);
    m.attr("BAD_ARRIVAL") = static_cast<int64_t>(BAD_ARRIVAL);
    m.def("chunk_hashes", &chunk_hashes, "tokens"_a, "chunk_size"_a, "seed"_a);
    m.def("read_words", &read_words, "buffer"_a);
    // Public names are the tree's own API (request ids); names with a leading underscore take the u32 handles
    // the Python subclass (native.NativeTree) maps ids to. Every argument accepts None, as the Python tree's do
    // (None is a request id like any hashable; None as hashes is refused as a malformed list). `nb::sig` names
    // the Python types of what a method returns where nanobind cannot see them (the bound `Candidate` class,
    // `ChunkHash`), for the stub the type check generates (scripts/typecheck.sh).
    nb::class_<Tree>(m, "Tree")
        .def(nb::init<int64_t>())
        .def_prop_ro("_num_requests", &Tree::num_requests)
        .def_prop_ro("num_active", &Tree::num_active)
        .def_prop_ro("num_waiting", &Tree::num_waiting)
        .def_prop_ro("num_running_groups", &Tree::num_running_groups)
        .def_prop_ro("num_suspended", &Tree::num_suspended)
        .def_prop_ro("num_nodes", &Tree::num_nodes)
        .def_prop_ro("num_cached", &Tree::num_cached)
        .def_prop_ro("_num_tails", &Tree::num_tails)
        .def_prop_ro("_tails_indexed", &Tree::tails_indexed)
        .def_prop_ro("num_index_entries", &Tree::num_index_entries)
        .def_prop_ro("shared_depth", &Tree::shared_depth)
        .def("_bind", &Tree::bind)
        .def("best", &Tree::best, nb::sig("def best(self) -> sglang_feather.cht.candidate.Candidate | None"))
        .def("_take_picks", &Tree::take_picks, nb::arg("max_picks"), nb::arg("skip_running_uncached"),
             nb::arg("max_missing"), nb::arg("first").none())
        .def("candidate", &Tree::candidate_of, "request_id"_a.none(),
             nb::sig("def candidate(self, request_id: object | None) -> sglang_feather.cht.candidate.Candidate"))
        .def("activate", &Tree::activate_id, "request_id"_a.none())
        .def("deactivate", &Tree::deactivate_id, "request_id"_a.none())
        .def("finish", &Tree::finish_id, "request_id"_a.none())
        .def("remove", &Tree::remove_id, "request_id"_a.none())
        .def("discard", &Tree::discard_id, "request_id"_a.none())
        .def("suspend", &Tree::suspend_id, "request_id"_a.none())
        .def("resume", &Tree::resume_id, "request_id"_a.none())
        .def("resume_all", &Tree::resume_all)
        .def("_state", &Tree::state)
        .def("_is_suspended", &Tree::is_suspended)
        .def("_num_chunks", &Tree::num_chunks)
        .def("_path_hashes", &Tree::path_hashes,
             nb::sig("def _path_hashes(self, handle: int, /) -> list[sglang_feather.types.ChunkHash]"))
        .def("_prefix_hash", &Tree::prefix_hash,
             nb::sig("def _prefix_hash(self, handle: int, depth: int, /) -> sglang_feather.types.ChunkHash"))
        .def("_arrival", &Tree::arrival)
        .def("_num_missing", &Tree::num_missing)
        .def("_num_holding", &Tree::num_holding)
        .def("_num_waiting_holding", &Tree::num_waiting_holding)
        .def("_shares_prefix", &Tree::shares_prefix)
        .def("_waiting", &Tree::waiting)
        .def("_active", &Tree::active)
        .def("_oldest", &Tree::oldest)
        .def("_oldest_stranger", &Tree::oldest_stranger)
        .def("_prefix_order", &Tree::prefix_order)
        .def("_cached_frontier", &Tree::cached_frontier)
        .def("_bind_insert", &Tree::bind_insert)
        .def("insert", &Tree::insert_id, "request_id"_a.none(), "token_ids"_a.none(), nb::kw_only(),
             "namespace"_a = nb::none(), "arrival"_a = nb::none())
        .def("_insert_digests", &Tree::insert_digests_id, "request_id"_a.none(), "hashes"_a.none(), nb::kw_only(),
             "arrival"_a = nb::none())
        .def("insert_hashes", &Tree::insert_hashes_id, "request_id"_a.none(), "hashes"_a.none(), nb::kw_only(),
             "arrival"_a = nb::none())
        .def("cache_store", &Tree::cache_store_id, "hashes"_a.none(), "parent"_a.none() = nb::none())
        .def("cache_remove", &Tree::cache_remove_id, "hashes"_a.none())
        .def("cache_clear", &Tree::cache_clear)
        .def("is_cached", &Tree::is_cached_id, "chunk_hash"_a.none())
        .def("_check", &Tree::check);
}
