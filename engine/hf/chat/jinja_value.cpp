#include "hf/chat/jinja_value.h"

#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace tessera::hf::jinja {

void fault(std::string message) {
  throw RuntimeFault{std::move(message)};
}

Value Value::undefined(std::string name) {
  Value v;
  v.text = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::from_bool(bool b) {
  Value v;
  v.kind = Kind::Bool;
  v.boolean = b;
  return v;
}
Value Value::from_int(std::int64_t i) {
  Value v;
  v.kind = Kind::Int;
  v.integer = i;
  return v;
}
Value Value::from_float(double d) {
  Value v;
  v.kind = Kind::Float;
  v.number = d;
  return v;
}
Value Value::from_string(std::string s) {
  Value v;
  v.kind = Kind::String;
  v.text = std::move(s);
  return v;
}
Value Value::from_list(ValueList items) {
  Value v;
  v.kind = Kind::List;
  v.list = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::new_dict() {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<ValueDict>();
  return v;
}
Value Value::new_namespace() {
  Value v = new_dict();
  v.kind = Kind::Namespace;
  return v;
}
Value Value::function(std::string name, std::function<Value(CallArgs&)> fn) {
  Value v;
  v.kind = Kind::Callable;
  v.callable = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

static Value from_json_at(const nlohmann::ordered_json& json, int depth);

Value Value::from_json(const nlohmann::ordered_json& json) {
  return from_json_at(json, 0);
}

static Value from_json_at(const nlohmann::ordered_json& json, int depth) {
  // Deeper data than any chat needs would only risk the stack in the recursive helpers.
  if (depth > 128) fault("template variables are nested more than 128 levels deep");
  using V = Value;
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return V::none();
    case nlohmann::ordered_json::value_t::boolean:
      return V::from_bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return V::from_int(json.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      auto u = json.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX)) return V::from_float(static_cast<double>(u));
      return V::from_int(static_cast<std::int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return V::from_float(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return V::from_string(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json_at(item, depth + 1));
      return V::from_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = V::new_dict();
      for (const auto& [key, item] : json.items())
        d.dict->set(V::from_string(key), from_json_at(item, depth + 1));
      return d;
    }
    default:
      return V::none();  // binary and discarded values do not occur in parsed JSON
  }
}

const Value* ValueDict::find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}

void ValueDict::set(const Value& key, Value value) {
  for (auto& [k, v] : items)
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  items.emplace_back(key, std::move(value));
}

const Value* CallArgs::get(std::size_t index, const std::string& name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

Value CallArgs::get_or(std::size_t index, const std::string& name, Value fallback) const {
  const Value* v = get(index, name);
  return v ? *v : std::move(fallback);
}

void CallArgs::check(const std::string& what, std::size_t max_positional,
                     const std::vector<std::string>& names) const {
  if (positional.size() > max_positional)
    fault(what + " takes at most " + std::to_string(max_positional) + " positional argument(s), " +
          std::to_string(positional.size()) + " given");
  for (const auto& [k, v] : keyword)
    if (std::find(names.begin(), names.end(), k) == names.end())
      fault(what + " got an unexpected keyword argument '" + k + "'");
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return "list";
    case Kind::Dict:
      return "dict";
    case Kind::Namespace:
      return "Namespace";
    case Kind::Callable:
      return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return v.boolean;
    case Kind::Int:
      return v.integer != 0;
    case Kind::Float:
      return v.number != 0.0;
    case Kind::String:
      return !v.text.empty();
    case Kind::List:
      return !v.list->empty();
    case Kind::Dict:
      return !v.dict->items.empty();
    case Kind::Namespace:
    case Kind::Callable:
      return true;
  }
  return false;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then Python's layout: fixed for 1e-4 <= |d| < 1e16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  auto e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  if (exponent >= -4 && exponent < 16) {
    std::string out;
    if (exponent < 0) {
      out = "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
    } else {
      auto int_len = static_cast<std::size_t>(exponent) + 1;
      if (digits.size() <= int_len) {
        out = digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return sign + out + exp_buf;
}

std::string repr(const Value& v) {
  if (v.kind != Kind::String) return to_str(v);
  bool has_single = v.text.find('\'') != std::string::npos;
  bool has_double = v.text.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : v.text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return v.boolean ? "True" : "False";
    case Kind::Int:
      return std::to_string(v.integer);
    case Kind::Float:
      return float_repr(v.number);
    case Kind::String:
      return v.text;
    case Kind::List: {
      std::string out = v.is_tuple ? "(" : "[";
      for (std::size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += ", ";
        out += repr((*v.list)[i]);
      }
      if (v.is_tuple && v.list->size() == 1) out += ",";
      return out + (v.is_tuple ? ")" : "]");
    }
    case Kind::Dict:
    case Kind::Namespace: {
      std::string out = v.kind == Kind::Namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, item] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr(k) + ": " + repr(item);
      }
      return out + (v.kind == Kind::Namespace ? "}>" : "}");
    }
    case Kind::Callable:
      return "<function " + v.callable->name + ">";
  }
  return "";
}

static bool numeric(const Value& v) {
  return v.kind == Kind::Int || v.kind == Kind::Float || v.kind == Kind::Bool;
}
bool is_int_like(const Value& v) {
  return v.kind == Kind::Int || v.kind == Kind::Bool;
}
double as_double(const Value& v) {
  if (v.kind == Kind::Float) return v.number;
  if (v.kind == Kind::Bool) return v.boolean ? 1.0 : 0.0;
  return static_cast<double>(v.integer);
}
std::int64_t as_int(const Value& v) {
  return v.kind == Kind::Bool ? (v.boolean ? 1 : 0) : v.integer;
}
void undefined_fault(const Value& v) {
  fault(v.text.empty() ? std::string("value is undefined") : v.text);
}

bool equals(const Value& a, const Value& b) {
  if (numeric(a) && numeric(b)) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) return as_double(a) == as_double(b);
    return as_int(a) == as_int(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
      return a.text == b.text;
    case Kind::List: {
      if (a.is_tuple != b.is_tuple || a.list->size() != b.list->size()) return false;
      for (std::size_t i = 0; i < a.list->size(); ++i)
        if (!equals((*a.list)[i], (*b.list)[i])) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* other = b.dict->find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    case Kind::Namespace:
      return a.dict == b.dict;
    case Kind::Callable:
      return a.callable == b.callable;
    default:
      return false;
  }
}

int compare(const Value& a, const Value& b) {
  if (numeric(a) && numeric(b)) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) {
      double x = as_double(a), y = as_double(b);
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    std::int64_t x = as_int(a), y = as_int(b);
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.kind == Kind::String && b.kind == Kind::String) {
    // UTF-8 byte order is code point order, which is Python's order.
    int c = a.text.compare(b.text);
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.kind == Kind::List && b.kind == Kind::List) {
    std::size_t n = std::min(a.list->size(), b.list->size());
    for (std::size_t i = 0; i < n; ++i) {
      if (equals((*a.list)[i], (*b.list)[i])) continue;
      return compare((*a.list)[i], (*b.list)[i]);
    }
    return a.list->size() < b.list->size() ? -1 : (a.list->size() > b.list->size() ? 1 : 0);
  }
  if (a.is_undefined() || b.is_undefined())
    fault("'" + (a.is_undefined() ? a.text : b.text) + "' is undefined");
  fault(std::string("'<' not supported between instances of '") + type_name(a) + "' and '" +
        type_name(b) + "'");
}

static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  std::u32string wide;
  if (ensure_ascii) wide = utf8_to_u32(s);
  auto emit = [&](char32_t c, const char* utf8, std::size_t n) {
    switch (c) {
      case '"':
        out += "\\\"";
        return;
      case '\\':
        out += "\\\\";
        return;
      case '\n':
        out += "\\n";
        return;
      case '\r':
        out += "\\r";
        return;
      case '\t':
        out += "\\t";
        return;
      case '\b':
        out += "\\b";
        return;
      case '\f':
        out += "\\f";
        return;
      default:
        break;
    }
    char buf[16];
    if (c < 0x20 || (ensure_ascii && c > 0x7e)) {
      if (c > 0xffff) {
        char32_t v = c - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xd800 + (v >> 10)),
                      static_cast<unsigned>(0xdc00 + (v & 0x3ff)));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      }
      out += buf;
      return;
    }
    out.append(utf8, n);
  };
  if (ensure_ascii) {
    for (char32_t c : wide) {
      char tmp[1] = {static_cast<char>(c & 0x7f)};
      emit(c, tmp, 1);
    }
  } else {
    for (char c : s) emit(static_cast<unsigned char>(c), &c, 1);
  }
  out += '"';
}

static void json_value(std::string& out, const Value& v, int indent, int depth,
                       const std::string& item_sep, const std::string& key_sep, bool sort_keys,
                       bool ensure_ascii) {
  auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<std::size_t>(indent * d), ' ');
  };
  switch (v.kind) {
    case Kind::None:
      out += "null";
      return;
    case Kind::Bool:
      out += v.boolean ? "true" : "false";
      return;
    case Kind::Int:
      out += std::to_string(v.integer);
      return;
    case Kind::Float:
      if (std::isnan(v.number)) {
        out += "NaN";
      } else if (std::isinf(v.number)) {
        out += v.number > 0 ? "Infinity" : "-Infinity";
      } else {
        out += float_repr(v.number);
      }
      return;
    case Kind::String:
      json_string(out, v.text, ensure_ascii);
      return;
    case Kind::List: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += item_sep;
        if (indent >= 0) newline(depth + 1);
        json_value(out, (*v.list)[i], indent, depth + 1, item_sep, key_sep, sort_keys,
                   ensure_ascii);
      }
      if (indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case Kind::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& entry : v.dict->items) entries.push_back(&entry);
      if (sort_keys)
        std::stable_sort(entries.begin(), entries.end(), [](const auto* a, const auto* b) {
          return compare(a->first, b->first) < 0;
        });
      out += '{';
      bool first = true;
      for (const auto* entry : entries) {
        if (!first) out += item_sep;
        first = false;
        if (indent >= 0) newline(depth + 1);
        const Value& key = entry->first;
        if (key.kind == Kind::String) {
          json_string(out, key.text, ensure_ascii);
        } else if (key.kind == Kind::None) {
          out += "\"null\"";
        } else if (key.kind == Kind::Bool) {
          out += key.boolean ? "\"true\"" : "\"false\"";
        } else if (key.kind == Kind::Int || key.kind == Kind::Float) {
          out += "\"" + to_str(key) + "\"";
        } else {
          fault(std::string("keys must be str, int, float, bool or None, not ") + type_name(key));
        }
        out += key_sep;
        json_value(out, entry->second, indent, depth + 1, item_sep, key_sep, sort_keys,
                   ensure_ascii);
      }
      if (indent >= 0) newline(depth);
      out += '}';
      return;
    }
    default:
      fault(std::string("Object of type ") + type_name(v) + " is not JSON serializable");
  }
}

std::string to_json(const Value& v, int indent, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys, bool ensure_ascii) {
  std::string out;
  json_value(out, v, indent, 0, item_sep, key_sep, sort_keys, ensure_ascii);
  return out;
}

std::size_t length(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return 0;
    case Kind::String:
      return utf8_to_u32(v.text).size();
    case Kind::List:
      return v.list->size();
    case Kind::Dict:
      return v.dict->items.size();
    default:
      fault(std::string("object of type '") + type_name(v) + "' has no len()");
  }
}

ValueList iterate(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return {};
    case Kind::String: {
      ValueList out;
      for (char32_t c : utf8_to_u32(v.text))
        out.push_back(Value::from_string(u32_to_utf8(std::u32string(1, c))));
      return out;
    }
    case Kind::List:
      return *v.list;
    case Kind::Dict: {
      ValueList out;
      for (const auto& [k, item] : v.dict->items) out.push_back(k);
      return out;
    }
    default:
      fault(std::string("'") + type_name(v) + "' object is not iterable");
  }
}

std::u32string utf8_to_u32(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  std::int32_t i = 0;
  const auto n = static_cast<std::int32_t>(std::min<std::size_t>(s.size(), INT32_MAX));
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(s.data());
  while (i < n) {
    UChar32 c;
    U8_NEXT(bytes, i, n, c);
    out.push_back(c < 0 ? U'\uFFFD' : static_cast<char32_t>(c));
  }
  return out;
}

std::string u32_to_utf8(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    std::uint8_t buf[4];
    std::int32_t len = 0;
    UBool error = false;
    U8_APPEND(buf, len, 4, static_cast<UChar32>(c), error);
    if (error) continue;
    out.append(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(len));
  }
  return out;
}

static std::string change_case(const std::string& s, bool upper) {
  bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; });
  if (ascii) {
    std::string out = s;
    for (char& c : out) {
      if (upper && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
      if (!upper && c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    }
    return out;
  }
  // Full case mapping (ß → SS), as Python's str.upper/lower do.
  UErrorCode status = U_ZERO_ERROR;
  std::int32_t len16 = 0;
  u_strFromUTF8(nullptr, 0, &len16, s.data(), static_cast<std::int32_t>(s.size()), &status);
  status = U_ZERO_ERROR;
  std::u16string in(static_cast<std::size_t>(len16), u'\0');
  u_strFromUTF8(in.data(), len16, &len16, s.data(), static_cast<std::int32_t>(s.size()), &status);
  std::u16string mapped(in.size() * 3 + 8, u'\0');
  status = U_ZERO_ERROR;
  std::int32_t out_len = upper
                             ? u_strToUpper(mapped.data(), static_cast<std::int32_t>(mapped.size()),
                                            in.data(), len16, "", &status)
                             : u_strToLower(mapped.data(), static_cast<std::int32_t>(mapped.size()),
                                            in.data(), len16, "", &status);
  if (U_FAILURE(status)) return s;
  std::string out(static_cast<std::size_t>(out_len) * 3 + 4, '\0');
  std::int32_t out8 = 0;
  status = U_ZERO_ERROR;
  u_strToUTF8(out.data(), static_cast<std::int32_t>(out.size()), &out8, mapped.data(), out_len,
              &status);
  if (U_FAILURE(status)) return s;
  out.resize(static_cast<std::size_t>(out8));
  return out;
}

std::string py_upper(const std::string& s) {
  return change_case(s, true);
}
std::string py_lower(const std::string& s) {
  return change_case(s, false);
}

bool py_isspace(char32_t c) {
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return true;
  if (c < 0x80) return false;
  auto uc = static_cast<UChar32>(c);
  if (u_charType(uc) == U_SPACE_SEPARATOR) return true;
  auto dir = u_charDirection(uc);
  return dir == U_WHITE_SPACE_NEUTRAL || dir == U_BLOCK_SEPARATOR || dir == U_SEGMENT_SEPARATOR;
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::u32string wide = utf8_to_u32(s);
  std::u32string set;
  bool use_set = chars.kind == Kind::String;
  if (use_set) set = utf8_to_u32(chars.text);
  auto strip_it = [&](char32_t c) {
    return use_set ? set.find(c) != std::u32string::npos : py_isspace(c);
  };
  std::size_t begin = 0, end = wide.size();
  if (left)
    while (begin < end && strip_it(wide[begin])) ++begin;
  if (right)
    while (end > begin && strip_it(wide[end - 1])) --end;
  return u32_to_utf8(wide.substr(begin, end - begin));
}

}  // namespace tessera::hf::jinja
