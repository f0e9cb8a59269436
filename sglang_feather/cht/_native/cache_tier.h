// tree.cpp's part: the cache tier, what the engine's KV cache holds as its store / remove / clear events tell it.
#pragma once

#include <cstdint>
#include <vector>

#include "containers.h"
#include "tree_status.h"

namespace {

// What the engine's KV cache holds, as its store / remove / clear events tell it: chunk hash -> the entry of its
// parent prefix (none for a prompt's first chunk), closed under prefixes, independent of the tree (tree.py's
// `_cache` and `_cache_children`). Each entry lists its children (intrusive and doubly linked), so an
// eviction cascades to every cached prefix that extends it with no lookup per child and unlinks in O(1).
// Entries sit in a dense array with a free list (u32 ids; id 0 is never used, as the index reads a slot
// holding 0 as empty) behind a `HashIndex` whose generations never change, so every entry is live and a
// removal erases its slot at once.
class CacheTier {
  public:
    struct Entry {
        uint64_t hash = 0;
        uint32_t parent = NIL;  // NIL: a prompt's first chunk
        uint32_t first_child = NIL, next = NIL, prev = NIL;  // `next` / `prev`: siblings under `parent`
        bool used = false;
    };

    CacheTier() : index_(gens_) {
        entries_.emplace_back();
        gens_.push_back(0);
    }
    CacheTier(const CacheTier&) = delete;
    CacheTier& operator=(const CacheTier&) = delete;

    size_t size() const { return index_.size(); }
    uint32_t find(uint64_t hash) const { return index_.find(hash); }
    const Entry& operator[](uint32_t id) const { return entries_[id]; }

    // Whether entry `id`'s parent prefix is `above` (has_above false: none, it is a first chunk).
    bool parent_is(uint32_t id, bool has_above, uint64_t above) const {
        uint32_t p = entries_[id].parent;
        return p == NIL ? !has_above : has_above && entries_[p].hash == above;
    }

    // A new entry for `hash` (not held) below entry `parent` (NIL: none); its id.
    uint32_t add(uint64_t hash, uint32_t parent) {
        uint32_t id;
        if (!free_.empty()) {
            id = free_.back();
            free_.pop_back();
        } else {
            id = static_cast<uint32_t>(entries_.size());
            entries_.emplace_back();
            gens_.push_back(0);
        }
        Entry& e = entries_[id];
        e = Entry{hash, parent, NIL, NIL, NIL, true};
        if (parent != NIL) {
            Entry& p = entries_[parent];
            e.next = p.first_child;
            if (p.first_child != NIL) entries_[p.first_child].prev = id;
            p.first_child = id;
        }
        index_.insert(hash, id);
        return id;
    }

    // Drops entry `id` and every entry below it; appends their hashes to `gone`.
    void remove_subtree(uint32_t id, std::vector<uint64_t>& gone) {
        Entry& e = entries_[id];
        if (e.prev != NIL) entries_[e.prev].next = e.next;
        else if (e.parent != NIL) entries_[e.parent].first_child = e.next;
        if (e.next != NIL) entries_[e.next].prev = e.prev;
        stack_.assign(1, id);
        while (!stack_.empty()) {
            uint32_t top = stack_.back();
            stack_.pop_back();
            Entry& t = entries_[top];
            for (uint32_t c = t.first_child; c != NIL; c = entries_[c].next) stack_.push_back(c);
            gone.push_back(t.hash);
            index_.erase(t.hash);
            t.used = false;
            free_.push_back(top);
        }
    }

    // Drops every entry; appends their hashes to `gone`.
    void clear(std::vector<uint64_t>& gone) {
        for (const Entry& e : entries_)
            if (e.used) gone.push_back(e.hash);
        entries_.resize(1);
        gens_.resize(1);
        free_.clear();
        index_.clear();
    }

    // The tier's own invariants: every entry indexed under its hash, closed under prefixes, child lists
    // that are exactly the entries naming each parent. Empty if they hold.
    std::string check() const {
        size_t used = 0;
        std::vector<uint32_t> listed(entries_.size(), 0);
        for (uint32_t id = 1; id < entries_.size(); ++id) {
            const Entry& e = entries_[id];
            if (!e.used) continue;
            ++used;
            if (index_.find(e.hash) != id) return "a cached hash is not indexed under its entry";
            if (e.parent != NIL && (e.parent >= entries_.size() || !entries_[e.parent].used))
                return "a cached hash has an uncached parent";
            uint32_t prev = NIL;
            for (uint32_t c = e.first_child; c != NIL; prev = c, c = entries_[c].next) {
                if (!entries_[c].used || entries_[c].parent != id || entries_[c].prev != prev || ++listed[c] > 1)
                    return "the cache tier's child lists disagree with its parents";
            }
        }
        for (uint32_t id = 1; id < entries_.size(); ++id) {
            const Entry& e = entries_[id];
            if (e.used && e.parent != NIL && listed[id] != 1)
                return "a cached hash is missing from its parent's children";
        }
        if (used != index_.size() || index_.count_live() != used) return "the cache tier's index size is wrong";
        return "";
    }

  private:
    std::vector<Entry> entries_;
    std::vector<uint32_t> free_, stack_;
    std::vector<uint32_t> gens_;  // all zero: the index's generations (tier entries are never stale)
    HashIndex index_;
};

}  // namespace
