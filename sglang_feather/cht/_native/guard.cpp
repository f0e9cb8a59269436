// Python's view of the compiled aging guard (guard.h): the API of policy/aging.py's `AgingGuard`, with its
// checks and error messages.

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <string>
#include <vector>

#include "guard.h"

namespace nb = nanobind;
using namespace nb::literals;
using feather::Guard;

namespace {

std::optional<double> checked_max_wait(nb::handle max_wait_s) {
    if (max_wait_s.is_none()) return std::nullopt;
    bool number = PyLong_Check(max_wait_s.ptr()) || PyFloat_Check(max_wait_s.ptr());
    double value = number ? PyFloat_AsDouble(max_wait_s.ptr()) : 0.0;
    if (number && value == -1.0 && PyErr_Occurred()) PyErr_Clear();  // an int too large for a double
    else if (number && std::isfinite(value) && value > 0) return value;
    std::string shown = nb::cast<std::string>(nb::repr(max_wait_s));
    throw nb::value_error(("AgingGuard max_wait_s must be a finite number > 0 or None, got " + shown).c_str());
}

double not_nan(double wait_s, const char* where) {
    if (std::isnan(wait_s)) throw nb::value_error((std::string("AgingGuard.") + where + ": wait_s is NaN").c_str());
    return wait_s;
}

}  // namespace

void bind_guard(nb::module_& m) {
    nb::class_<Guard>(m, "AgingGuard")
        .def("__init__",
             [](Guard* self, nb::handle max_wait_s, bool when_overtaken) {
                 new (self) Guard(checked_max_wait(max_wait_s), when_overtaken);
             },
             "max_wait_s"_a.none() = 300.0, "when_overtaken"_a = true)
        .def_prop_ro("max_wait_s", &Guard::max_wait_s)
        .def_prop_ro("when_overtaken", &Guard::when_overtaken)
        .def_prop_ro("enabled", &Guard::enabled)
        .def_prop_ro("lead_s", &Guard::lead_s)
        .def_prop_ro("due_wait_s", &Guard::due_wait_s)
        .def_prop_ro("bound_wait_s", &Guard::bound_wait_s)
        .def("served", &Guard::served, "wait_s"_a)
        .def("served_all", [](Guard& g, const std::vector<double>& waits) { g.served_all(waits.data(), waits.size()); },
             "waits_s"_a)
        .def("is_starved", [](const Guard& g, double w) { return g.is_starved(not_nan(w, "is_starved")); }, "wait_s"_a)
        .def("reached_bound", [](const Guard& g, double w) { return g.reached_bound(not_nan(w, "reached_bound")); },
             "wait_s"_a)
        .def_prop_ro("serves_early", &Guard::serves_early)
        .def("num_until_early", &Guard::num_until_early, "limit"_a)
        .def("num_not_due", &Guard::num_not_due, "wait_s"_a, "limit"_a)
        .def("admitted", &Guard::admitted, "wait_s"_a, "stranger"_a = true)
        .def("clone", [](const Guard& g) { return Guard(g); })
        .def("__repr__", [](const Guard& g) {
            std::string bound = g.max_wait_s() ? nb::cast<std::string>(nb::repr(nb::float_(*g.max_wait_s()))) : "None";
            char lead[32];
            std::snprintf(lead, sizeof lead, "%.3g", g.lead_s());
            return "AgingGuard(max_wait_s=" + bound + ", lead_s=" + lead + ")";
        });
}
