// Moving a planned block of requests to the slots SGLang's admission loop reaches next, in one pass.
//
// How it works: `gather_to(queue, slot, reqs, in_order, seqs)` is the SGLang adapter's placement of k planned
// requests (sglang/slots.py `_place`) when the waiting queue's sorted part starts at `slot` and `in_order` holds
// that part's queue numbers (the mirror's array, sglang/mirror.py): request i's number `seqs[i]` is found at
// `in_order[r]` (`find_number`) and the request itself at `slot + r`. Moving them one at a time shifts the
// queue's pointer array twice per request (pop, then insert) and the mirror's array once; here the queue's
// `[slot, slot + max rank]` is rewritten once in place (the k requests in plan order, then the others in their
// order: a permutation, so no reference count changes and no allocation) and the k entries of `in_order` are
// squeezed out in one pass, leaving its last k entries for the caller to drop. Every request is checked first
// (its number is found, and it is where its rank says, by identity); if one is not, nothing changes and it
// returns False (the caller then moves them one at a time).

#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// A writable view of an `array('q')` (released on scope exit).
class Int64Buffer {
  public:
    explicit Int64Buffer(nb::handle array) {
        if (PyObject_GetBuffer(array.ptr(), &view_, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0)
            throw nb::python_error();
        if (view_.itemsize != 8 || view_.format == nullptr || std::strcmp(view_.format, "q") != 0) {
            PyBuffer_Release(&view_);
            throw nb::type_error("in_order must be an array('q')");
        }
    }
    ~Int64Buffer() { PyBuffer_Release(&view_); }
    Int64Buffer(const Int64Buffer&) = delete;
    Int64Buffer& operator=(const Int64Buffer&) = delete;

    int64_t* data() { return static_cast<int64_t*>(view_.buf); }
    Py_ssize_t size() const { return view_.len / 8; }

  private:
    Py_buffer view_{};
};

// Where `seq` is in the ascending `numbers` (n of them), or n when it is not there. Queue numbers are dense but
// for the requests that left, so the first probe is interpolated and the search gallops from it: a few cache
// lines of a cold array, where a bisection reads about log2(n).
Py_ssize_t find_number(const int64_t* numbers, Py_ssize_t n, int64_t seq) {
    if (n == 0 || seq < numbers[0] || seq > numbers[n - 1]) return n;
    double span = static_cast<double>(numbers[n - 1]) - static_cast<double>(numbers[0]);
    Py_ssize_t at = span > 0 ? static_cast<Py_ssize_t>((static_cast<double>(seq) - numbers[0]) / span * (n - 1)) : 0;
    at = std::min(std::max<Py_ssize_t>(at, 0), n - 1);
    Py_ssize_t lo = at, hi = at + 1, step = 1;  // gallop until numbers[lo] <= seq < numbers[hi] (hi may be n)
    while (lo > 0 && numbers[lo] > seq) {
        hi = lo;
        lo = std::max<Py_ssize_t>(lo - step, 0);
        step *= 2;
    }
    while (hi < n && numbers[hi] <= seq) {
        lo = hi;
        hi = std::min(hi + step, n);
        step *= 2;
    }
    Py_ssize_t found = std::upper_bound(numbers + lo, numbers + hi, seq) - numbers - 1;
    return found >= 0 && numbers[found] == seq ? found : n;
}

bool gather_to(nb::list queue, Py_ssize_t slot, nb::list reqs, nb::handle in_order, std::vector<int64_t> seqs) {
    const Py_ssize_t k = PyList_GET_SIZE(reqs.ptr()), n = PyList_GET_SIZE(queue.ptr());
    if (k != static_cast<Py_ssize_t>(seqs.size())) throw nb::value_error("one queue number per request");
    Int64Buffer order(in_order);
    if (k == 0) return true;
    if (slot < 0 || slot > n) return false;
    PyObject** items = reinterpret_cast<PyListObject*>(queue.ptr())->ob_item;
    std::vector<Py_ssize_t> ranks(static_cast<size_t>(k));
    for (Py_ssize_t i = 0; i < k; ++i) {
        Py_ssize_t rank = find_number(order.data(), order.size(), seqs[static_cast<size_t>(i)]);
        if (rank >= order.size() || rank >= n - slot) return false;
        if (items[slot + rank] != PyList_GET_ITEM(reqs.ptr(), i)) return false;
        ranks[static_cast<size_t>(i)] = rank;
    }
    std::vector<Py_ssize_t> sorted = ranks;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return false;

    // The queue, in place: the others in [slot, slot + max rank] shift towards its end past the requests
    // after them (back to front, a memmove per run between two requests), then the requests take its front.
    Py_ssize_t write = slot + sorted.back() + 1;
    for (size_t j = sorted.size(); j-- > 0;) {
        Py_ssize_t from = slot + sorted[j] + 1, to = j + 1 < sorted.size() ? slot + sorted[j + 1] : write;
        write -= to - from;
        std::memmove(items + write, items + from, static_cast<size_t>(to - from) * sizeof(PyObject*));
    }
    std::memmove(items + slot + k, items + slot, static_cast<size_t>(sorted.front()) * sizeof(PyObject*));
    for (Py_ssize_t i = 0; i < k; ++i) items[slot + i] = PyList_GET_ITEM(reqs.ptr(), i);

    // `in_order` less the k ranks, squeezed to its front (the caller drops its last k entries).
    int64_t* numbers = order.data();
    write = sorted.front();
    for (size_t j = 0; j < sorted.size(); ++j) {
        Py_ssize_t from = sorted[j] + 1, to = j + 1 < sorted.size() ? sorted[j + 1] : order.size();
        std::memmove(numbers + write, numbers + from, static_cast<size_t>(to - from) * sizeof(int64_t));
        write += to - from;
    }
    return true;
}

}  // namespace

void bind_queue_moves(nb::module_& m) {
    m.def("gather_to", &gather_to, "queue"_a, "slot"_a, "reqs"_a, "in_order"_a, "seqs"_a);
}
