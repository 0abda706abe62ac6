// The two visitors that walk a config struct's `fields(v)` list: one parses JSON into the struct
// (checking types, rules, unknown keys), one writes the struct back as JSON. Any struct with a
// `fields` list can use them (the training config, the launch config).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/config/config_io.h"
#include "engine/config/config_unsupported.h"

namespace tessera {
namespace config_detail {

using nlohmann::json;

inline std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

inline std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

template <class T> struct is_optional : std::false_type {};
template <class T> struct is_optional<std::optional<T>> : std::true_type {};
template <class T> struct is_vector : std::false_type {};
template <class T> struct is_vector<std::vector<T>> : std::true_type {};
template <class T> struct is_string_map : std::false_type {};
template <> struct is_string_map<std::map<std::string, std::string>> : std::true_type {};

class ParseVisitor {
 public:
  ParseVisitor(const json& object, std::string path, ConfigReport& report, bool unknown_is_error)
      : object_(object), path_(std::move(path)), report_(report), unknown_is_error_(unknown_is_error) {}

  template <class T, class R = NoRule>
  void operator()(const char* key, T& field, R rule = {}) {
    known_.insert(key);
    auto it = object_.find(key);
    if (it != object_.end()) read(*it, field, join_path(path_, key), rule);
  }

  // A key with an accepted second spelling (DeepSpeed's "bfloat16" for "bf16").
  template <class T, class R = NoRule>
  void aliased(const char* key, const char* alias, T& field, R rule = {}) {
    known_.insert(alias);
    bool has_key = object_.contains(key), has_alias = object_.contains(alias);
    if (has_key && has_alias) {
      report_.error(join_path(path_, alias), std::string("both \"") + key + "\" and its alias \"" + alias +
                                                 "\" are set; keep one");
    }
    if (has_alias && !has_key) {
      read(object_.at(alias), field, join_path(path_, alias), rule);
      known_.insert(key);
      return;
    }
    (*this)(key, field, rule);
  }

  // Reports keys that no field asked for.
  void finish() {
    for (const auto& item : object_.items()) {
      const std::string& key = item.key();
      if (known_.count(key)) continue;
      std::string path = join_path(path_, key);
      std::string message;
      if (const UnsupportedKey* u = find_unsupported_key(path)) {
        if (is_deepspeed_default(*u, item.value())) continue;  // DeepSpeed's default changes nothing
        if (u->out_of_scope)
          message = std::string("DeepSpeed's ") + u->out_of_scope + " is outside tessera's scope; remove the key";
        else
          message = "DeepSpeed knows this key but tessera does not implement it";
        if (u->hint && *u->hint) message += std::string(": ") + u->hint;
      } else {
        message = "unknown key";
        std::string best;
        size_t best_distance = std::numeric_limits<size_t>::max();
        for (const auto& k : known_) {
          size_t d = edit_distance(key, k);
          if (d < best_distance) best_distance = d, best = k;
        }
        if (!best.empty() && best_distance <= std::max<size_t>(2, key.size() / 3))
          message += "; did you mean \"" + best + "\"?";
        else if (!known_.empty())
          message += "; known keys here: " + list_known();
      }
      if (unknown_is_error_)
        report_.error(path, message + " (set \"unknown_keys\": \"warn\" to carry on regardless)");
      else
        report_.warning(path, message + "; ignored");
    }
  }

 private:
  size_t error_count() const {
    return std::count_if(report_.issues.begin(), report_.issues.end(),
                         [](const ConfigIssue& i) { return i.severity == ConfigIssue::Severity::Error; });
  }

  static bool auto_resolves(const std::string& path) {
    return path == "train_batch_size" || path == "train_micro_batch_size_per_gpu" || path == "gradient_accumulation_steps";
  }

  std::string list_known() const {
    std::string out;
    for (const auto& k : known_) out += (out.empty() ? "" : ", ") + k;
    return out;
  }

  void type_error(const json& v, const std::string& path, const std::string& expected) {
    if (v.is_string() && v.get<std::string>() == "auto") {
      report_.error(path, "\"auto\" is a placeholder that Hugging Face's Trainer fills in; tessera reads "
                          "the config as written: set " + expected);
    } else {
      report_.error(path, "found " + shown(v) + ", expected " + expected);
    }
  }

  template <class T, class R>
  void check_rule(T& value, const json& v, const std::string& path, const R& rule) {
    if constexpr (std::is_same_v<R, Rule<T>>) {
      if (!rule.accept(value)) report_.error(path, "found " + shown(v) + ", expected " + rule.expected);
    }
  }

  template <class T, class R>
  void read(const json& v, T& field, const std::string& path, const R& rule) {
    if constexpr (is_optional<T>::value) {
      using Inner = typename T::value_type;
      // "auto" (Hugging Face's placeholder) where the value follows from the rest of the config:
      // the batch sizes, resolved from the other two and the data-parallel size (config_resolve.cpp).
      if (v.is_null() || (v == "auto" && auto_resolves(path))) {
        field.reset();
        return;
      }
      Inner inner{};
      size_t errors_before = error_count();
      read(v, inner, path, rule);
      if (error_count() == errors_before) field = std::move(inner);
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) return type_error(v, path, "true or false");
      field = v.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      const char* expected = "an integer";
      if (v.is_number_integer()) {
        if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<T>::max()))
          return type_error(v, path, "an integer that fits in 64 bits");
        int64_t x = v.get<int64_t>();
        if (x < int64_t(std::numeric_limits<T>::min()) || x > int64_t(std::numeric_limits<T>::max()))
          return type_error(v, path, "a smaller integer");
        field = static_cast<T>(x);
      } else if (v.is_number_float()) {  // DeepSpeed configs write sizes as 5e8
        double x = v.get<double>();
        if (std::floor(x) != x || x < double(std::numeric_limits<T>::min()) ||
            x > double(std::numeric_limits<T>::max()))
          return type_error(v, path, expected);
        field = static_cast<T>(x);
      } else {
        return type_error(v, path, expected);
      }
      check_rule(field, v, path, rule);
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number()) return type_error(v, path, "a number");
      field = v.get<T>();
      check_rule(field, v, path, rule);
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) return type_error(v, path, "a string");
      field = v.get<std::string>();
      check_rule(field, v, path, rule);
    } else if constexpr (is_vector<T>::value) {
      using Item = typename T::value_type;
      bool numeric = std::is_arithmetic_v<Item>;
      const char* expected = numeric ? "a list of numbers" : "a list of strings";
      if (!v.is_array()) return type_error(v, path, expected);
      T items;
      for (const auto& e : v) {
        if (numeric ? !e.is_number() : !e.is_string()) return type_error(v, path, expected);
        items.push_back(e.get<Item>());
      }
      field = std::move(items);
      check_rule(field, v, path, rule);
    } else if constexpr (is_string_map<T>::value) {
      if (!v.is_object()) return type_error(v, path, "an object of strings {\"NAME\": \"value\"}");
      T items;
      for (const auto& item : v.items()) {
        if (!item.value().is_string())
          return type_error(item.value(), join_path(path, item.key()), "a string");
        items[item.key()] = item.value().get<std::string>();
      }
      field = std::move(items);
    } else {
      if (!v.is_object()) return type_error(v, path, "an object { ... }");
      ParseVisitor sub(v, path, report_, unknown_is_error_);
      field.fields(sub);
      sub.finish();
    }
  }

  const json& object_;
  std::string path_;
  ConfigReport& report_;
  bool unknown_is_error_;
  std::set<std::string> known_;
};

class JsonWriter {
 public:
  explicit JsonWriter(json& out) : out_(out) {}
  template <class T, class R = NoRule>
  void operator()(const char* key, T& field, R = {}) {
    out_[key] = to_json(field);
  }
  template <class T, class R = NoRule>
  void aliased(const char* key, const char*, T& field, R rule = {}) {
    (*this)(key, field, rule);
  }

 private:
  template <class T>
  static json to_json(T& field) {
    if constexpr (is_optional<T>::value) {
      return field ? to_json(*field) : json(nullptr);
    } else if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, std::string> || is_vector<T>::value ||
                         is_string_map<T>::value) {
      return json(field);
    } else {
      json sub = json::object();
      JsonWriter w(sub);
      field.fields(w);
      return sub;
    }
  }
  json& out_;
};

}  // namespace config_detail

// Parses one section (any struct with a `fields` list) at `path`, reporting into `report`.
template <class T>
T parse_section(const nlohmann::json& j, ConfigReport& report, const std::string& path = "",
                bool unknown_is_error = true) {
  T value;
  if (!j.is_object()) {
    report.error(path, "expected an object { ... }, found " + config_detail::shown(j));
    return value;
  }
  config_detail::ParseVisitor visitor(j, path, report, unknown_is_error);
  value.fields(visitor);
  visitor.finish();
  return value;
}

template <class T>
nlohmann::json section_to_json(const T& value) {
  nlohmann::json out = nlohmann::json::object();
  config_detail::JsonWriter writer(out);
  T copy = value;  // fields() is non-const: it also serves the parser
  copy.fields(writer);
  return out;
}

}  // namespace tessera
