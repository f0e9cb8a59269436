// The aging guard in compiled code: policy/aging.py's `AgingGuard`, the same state and results to the last bit.
//
// How it works: see policy/aging.py, whose algorithm this is, step for step (the Python class is the reference
// model; tests/cht/test_compiled_guard.py runs both side by side). The window of recent waits and the delays
// that set the lead are fixed rings of LEAD_WINDOW doubles, and `ordered` the recent waits kept sorted, so a
// copy (a planned pass's stand-in guard) is one struct copy with no allocation. A planned pass in core.cpp
// reads and feeds it without a Python frame; `bind_guard` gives Python the same API as the Python class.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>

namespace feather {

constexpr int LEAD_WINDOW = 16;     // policy/aging.py LEAD_WINDOW
constexpr int EARLY_EVERY = 12;     // policy/aging.py EARLY_EVERY

// The last `size()` (at most LEAD_WINDOW) values appended, oldest first.
class Ring {
  public:
    int size() const { return size_; }
    bool full() const { return size_ == LEAD_WINDOW; }
    double operator[](int i) const { return values_[(head_ + i) % LEAD_WINDOW]; }
    // Appends `v`, dropping the oldest value when full (a deque with maxlen).
    void push(double v) {
        if (full()) {
            values_[head_] = v;
            head_ = (head_ + 1) % LEAD_WINDOW;
        } else {
            values_[(head_ + size_) % LEAD_WINDOW] = v;
            ++size_;
        }
    }
    double max() const {
        double m = (*this)[0];
        for (int i = 1; i < size_; ++i) m = std::max(m, (*this)[i]);
        return m;
    }

  private:
    std::array<double, LEAD_WINDOW> values_{};
    int head_ = 0, size_ = 0;
};

class Guard {
  public:
    Guard(std::optional<double> max_wait_s, bool when_overtaken)
        : max_wait_s_(max_wait_s), when_overtaken_(when_overtaken) {
        update_due();
    }

    std::optional<double> max_wait_s() const { return max_wait_s_; }
    bool when_overtaken() const { return when_overtaken_; }
    bool enabled() const { return max_wait_s_.has_value(); }
    double lead_s() const { return lead_s_; }
    std::optional<double> due_wait_s() const { return due_s_; }
    std::optional<double> bound_wait_s() const {
        if (!max_wait_s_) return std::nullopt;
        return *max_wait_s_ - lead_s_;
    }

    // Any request was admitted after waiting `wait_s`.
    void served(double wait_s) {
        ++num_since_early_;
        if (!when_overtaken_) return;
        keep(wait_s);
        update_due();
    }

    // `served` for each of `n` waits in order (the due wait is worked out once).
    void served_all(const double* waits, size_t n) {
        num_since_early_ += static_cast<int64_t>(n);
        if (!when_overtaken_ || n == 0) return;
        for (size_t i = 0; i < n; ++i) keep(waits[i]);
        update_due();
    }

    bool serves_early() const { return num_since_early_ >= EARLY_EVERY; }
    int64_t num_until_early(int64_t limit) const {
        return std::min(limit, std::max<int64_t>(0, EARLY_EVERY - num_since_early_));
    }

    // Callers check for NaN first (the Python API raises ValueError).
    bool is_starved(double wait_s) const { return due_s_ && wait_s >= *due_s_; }
    bool reached_bound(double wait_s) const {
        auto bound = bound_wait_s();
        return bound && wait_s >= *bound;
    }

    // AgingGuard.num_not_due, step for step.
    int64_t num_not_due(double wait_s, int64_t limit) const {
        if (!due_s_) return limit;
        if (wait_s >= *due_s_) return 0;
        if (!when_overtaken_) return limit;
        const double bound = *bound_wait_s();
        const int64_t mid = LEAD_WINDOW / 2, num_recent = recent_.size();
        const int64_t first_open =
            std::max<int64_t>({1, LEAD_WINDOW - num_recent, EARLY_EVERY - num_since_early_});
        std::array<double, LEAD_WINDOW> kept = ordered_;
        int64_t num_kept = num_recent, num_dropped = 0;
        for (int64_t num_served = first_open; num_served < std::min(limit, mid); ++num_served) {
            // The window then holds num_served new waits (all below `kept`) and the newest of the old ones.
            for (; num_dropped < num_recent + num_served - LEAD_WINDOW; ++num_dropped) {
                double old = recent_[static_cast<int>(num_dropped)];
                auto* at = std::lower_bound(kept.begin(), kept.begin() + num_kept, old);
                std::copy(at + 1, kept.begin() + num_kept, at);
                --num_kept;
            }
            double median = (kept[mid - 1 - num_served] + kept[mid - num_served]) / 2;
            if (wait_s >= std::min(bound, median)) return num_served;
        }
        return std::min(limit, std::max(first_open, mid));
    }

    // A due request was admitted after waiting `wait_s` (see AgingGuard.admitted); callers skip NaN.
    void admitted(double wait_s, bool stranger) {
        auto due = stranger ? due_s_ : bound_wait_s();
        if (!due || std::isnan(wait_s)) return;
        num_since_early_ = 0;
        delays_.push(std::max(0.0, wait_s - *due));
        lead_s_ = std::min(delays_.max(), *max_wait_s_ / 2);
        update_due();
    }

  private:
    void keep(double wait_s) {
        int n = recent_.size();
        if (recent_.full()) {  // `ordered.remove(recent[0])`: the first equal value
            auto* at = std::find(ordered_.begin(), ordered_.begin() + n, recent_[0]);
            std::copy(at + 1, ordered_.begin() + n, at);
            --n;
        }
        recent_.push(wait_s);
        auto* at = std::upper_bound(ordered_.begin(), ordered_.begin() + n, wait_s);  // `insort`
        std::copy_backward(at, ordered_.begin() + n, ordered_.begin() + n + 1);
        *at = wait_s;
    }

    double median() const {
        int n = recent_.size(), mid = n / 2;
        return n % 2 ? ordered_[mid] : (ordered_[mid - 1] + ordered_[mid]) / 2;
    }

    void update_due() {
        if (!max_wait_s_) {
            due_s_.reset();
            return;
        }
        double due = *bound_wait_s();
        if (when_overtaken_ && recent_.full() && serves_early())
            due = std::min(due, median());
        due_s_ = due;
    }

    std::optional<double> max_wait_s_;
    bool when_overtaken_;
    double lead_s_ = 0.0;
    Ring delays_;   // delays since falling due of the last aged admissions (they set the lead)
    Ring recent_;   // waits of the last admitted requests
    std::array<double, LEAD_WINDOW> ordered_{};  // recent_ sorted
    int64_t num_since_early_ = EARLY_EVERY;  // admissions since the guard served one (the budget starts open)
    std::optional<double> due_s_;
};

}  // namespace feather
