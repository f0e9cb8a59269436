// Memory for large arrays in the compiled tree (tree.cpp, containers.h): huge-page
// mappings where Linux offers them (mmap + madvise MADV_HUGEPAGE), the aligned allocator elsewhere, and an
// array that starts all zero without writing it; and a prefetch hint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#if defined(__linux__) && defined(__has_include)
#if __has_include(<sys/mman.h>)
#include <sys/mman.h>
#endif
#endif
#if defined(MADV_HUGEPAGE) && defined(MAP_ANONYMOUS)
#define FEATHER_HUGE_PAGES 1
#else
#define FEATHER_HUGE_PAGES 0
#endif
#if defined(_MSC_VER)
#include <malloc.h>
#endif

#if defined(__GNUC__) || defined(__clang__)
#define FEATHER_PREFETCH(...) __builtin_prefetch(__VA_ARGS__)
#else
#define FEATHER_PREFETCH(...) ((void)0)
#endif

namespace {

// Large arrays (the hash index, node slab blocks) ask for transparent huge pages: a tree of long prompts holds
// tens of MB, and faulting it in 4 KiB pages cost more than the inserts' own work (measured: ~4.6 page
// faults per 10K-token insert into a growing tree, each several µs here). Where THP is off this is a no-op.
constexpr size_t HUGE_PAGE = size_t{1} << 21;

// Cache-line aligned memory from the system allocator (`aligned_alloc` needs macOS 10.15, so POSIX systems use
// posix_memalign; MSVC has its own pair).
inline void* alloc_aligned(size_t bytes) {
    size_t size = (bytes + 63) & ~size_t{63};
#if defined(_MSC_VER)
    void* p = _aligned_malloc(size, 64);
#else
    void* p = nullptr;
    if (posix_memalign(&p, 64, size) != 0) p = nullptr;
#endif
    if (p == nullptr) throw std::bad_alloc();
    return p;
}

inline void free_aligned(void* p) {
#if defined(_MSC_VER)
    _aligned_free(p);
#else
    std::free(p);
#endif
}

// Where huge pages exist, arrays of a huge page or more are their own 2 MiB-aligned mappings (returned to the
// system when freed); smaller ones, and every array elsewhere, come from the aligned allocator.
inline void* alloc_bytes(size_t bytes) {
#if FEATHER_HUGE_PAGES
    if (bytes >= HUGE_PAGE) {
        size_t size = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
        void* raw = mmap(nullptr, size + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED) throw std::bad_alloc();
        uintptr_t start = reinterpret_cast<uintptr_t>(raw);
        uintptr_t aligned = (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
        if (aligned > start) munmap(raw, aligned - start);
        if (aligned + size < start + size + HUGE_PAGE)
            munmap(reinterpret_cast<void*>(aligned + size), start + HUGE_PAGE - aligned);
        void* p = reinterpret_cast<void*>(aligned);
        madvise(p, size, MADV_HUGEPAGE);
        return p;
    }
#endif
    return alloc_aligned(bytes);
}

inline void free_bytes(void* p, size_t bytes) {
#if FEATHER_HUGE_PAGES
    if (bytes >= HUGE_PAGE) {
        munmap(p, (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
        return;
    }
#endif
    (void)bytes;
    free_aligned(p);
}

// A fixed-size array of trivially copyable items that starts all zero. Mappings of a huge page or more come
// zeroed from the kernel, so a new array costs no write of its own (growing the hash index to 16 MB wrote
// every slot once before moving the entries in).
template <typename T>
class ZeroedArray {
  public:
    explicit ZeroedArray(size_t n) : n_(n), p_(static_cast<T*>(alloc_bytes(n * sizeof(T)))) {
        static_assert(std::is_trivially_copyable_v<T>);
        if (n * sizeof(T) < HUGE_PAGE) std::memset(static_cast<void*>(p_), 0, n * sizeof(T));
    }
    ~ZeroedArray() { free_bytes(p_, n_ * sizeof(T)); }
    ZeroedArray(const ZeroedArray&) = delete;
    ZeroedArray& operator=(const ZeroedArray&) = delete;
    void swap(ZeroedArray& other) noexcept {
        std::swap(n_, other.n_);
        std::swap(p_, other.p_);
    }
    size_t size() const { return n_; }
    T& operator[](size_t i) { return p_[i]; }
    const T& operator[](size_t i) const { return p_[i]; }
    const T* begin() const { return p_; }
    const T* end() const { return p_ + n_; }

  private:
    size_t n_;
    T* p_;
};

}  // namespace
