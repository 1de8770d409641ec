#pragma once
// Values of the Jinja interpreter, with Python's semantics for printing, comparison and
// truthiness (chat templates are Python code in disguise). Internal to engine/hf/chat.
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace tessera::hf::jinja {

struct Value;
struct CallArgs;
using ValueList = std::vector<Value>;
struct ValueDict;
struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> fn;
};

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

struct Value {
  Kind kind = Kind::Undefined;
  bool boolean = false;
  bool is_tuple = false;  // a List written as a tuple literal; only printing differs
  std::int64_t integer = 0;
  double number = 0.0;
  std::string text;  // String; for Undefined, the name that was missing (for messages)
  std::shared_ptr<ValueList> list;
  std::shared_ptr<ValueDict> dict;  // Dict and Namespace
  std::shared_ptr<Callable> callable;

  static Value undefined(std::string name = {});
  static Value none();
  static Value from_bool(bool b);
  static Value from_int(std::int64_t i);
  static Value from_float(double d);
  static Value from_string(std::string s);
  static Value from_list(ValueList items);
  static Value new_dict();
  static Value new_namespace();
  static Value function(std::string name, std::function<Value(CallArgs&)> fn);
  static Value from_json(const nlohmann::ordered_json& json);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_mapping() const { return kind == Kind::Dict; }
  bool is_list() const { return kind == Kind::List; }
};

struct ValueDict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  void set(const Value& key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // Parameter binding: the `index`-th positional argument or the keyword `name`.
  const Value* get(std::size_t index, const std::string& name) const;
  Value get_or(std::size_t index, const std::string& name, Value fallback) const;
  // Rejects arguments beyond `max_positional` and keywords not in `names`.
  void check(const std::string& what, std::size_t max_positional,
             const std::vector<std::string>& names) const;
};

// Raised for runtime faults inside the interpreter; the renderer adds template and line.
struct RuntimeFault {
  std::string message;
  bool from_raise_exception = false;
};
[[noreturn]] void fault(std::string message);

const char* type_name(const Value& v);
bool truthy(const Value& v);
std::string to_str(const Value& v);  // Python str()
std::string repr(const Value& v);    // Python repr()
std::string float_repr(double d);    // Python repr(float)
bool equals(const Value& a, const Value& b);
// Numbers as Python sees them: a bool is an int (True == 1).
bool is_int_like(const Value& v);
std::int64_t as_int(const Value& v);
double as_double(const Value& v);
// Faults with the undefined value's own message (it names what was missing).
[[noreturn]] void undefined_fault(const Value& v);
int compare(const Value& a, const Value& b);  // <0, 0, >0; faults when unordered
std::string to_json(const Value& v, int indent, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys, bool ensure_ascii);
std::size_t length(const Value& v);  // faults for values without a length
ValueList iterate(const Value& v);   // faults for values that are not iterable

// Unicode-aware string helpers (Python semantics).
std::u32string utf8_to_u32(const std::string& s);
std::string u32_to_utf8(const std::u32string& s);
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
bool py_isspace(char32_t c);
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);

}  // namespace tessera::hf::jinja
