// Value rules for config fields: what a value must satisfy, and how to say what was expected.
// A rule may also canonicalize the value (one_of matches case-insensitively and stores the
// canonical spelling, so "adamw" becomes "AdamW").
#pragma once

#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

namespace tessera {

template <class T>
struct Rule {
  std::function<bool(T&)> accept;  // may rewrite the value into its canonical form
  std::string expected;            // "an integer in [0, 3]", "one of \"none\", \"cpu\""
};

struct NoRule {};

template <class T>
std::string rule_number(T x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

template <class T>
Rule<T> at_least(T lo) {
  return {[lo](T& x) { return x >= lo; }, "a value >= " + rule_number(lo)};
}

template <class T>
Rule<T> greater_than(T lo) {
  return {[lo](T& x) { return x > lo; }, "a value > " + rule_number(lo)};
}

template <class T>
Rule<T> in_range(T lo, T hi) {
  return {[lo, hi](T& x) { return x >= lo && x <= hi; },
          "a value in [" + rule_number(lo) + ", " + rule_number(hi) + "]"};
}

bool equals_ignoring_case(const std::string& a, const std::string& b);

inline Rule<std::string> one_of(std::initializer_list<const char*> choices) {
  std::vector<std::string> names(choices.begin(), choices.end());
  std::string expected = "one of";
  for (size_t i = 0; i < names.size(); ++i) expected += (i ? ", \"" : " \"") + names[i] + "\"";
  return {[names](std::string& x) {
            for (const auto& n : names)
              if (equals_ignoring_case(n, x)) {
                x = n;
                return true;
              }
            return false;
          },
          expected};
}

inline Rule<std::vector<double>> pair_in_unit_interval() {
  return {[](std::vector<double>& b) {
            return b.size() == 2 && b[0] >= 0 && b[0] < 1 && b[1] >= 0 && b[1] < 1;
          },
          "two numbers in [0, 1), like [0.9, 0.999]"};
}

inline Rule<std::string> partition_method_rule() {
  return {[](std::string& m) {
            return m == "parameters" || m == "uniform" || (m.rfind("type:", 0) == 0 && m.size() > 5);
          },
          "\"parameters\", \"uniform\" or \"type:<regex>\""};
}

}  // namespace tessera
