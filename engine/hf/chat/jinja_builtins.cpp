// Filters, tests and the methods of strings and dicts, with Jinja's and Python's semantics.
#include <algorithm>
#include <cfenv>
#include <cmath>
#include <unordered_map>

#include "hf/chat/jinja_ast.h"

namespace tessera::hf::jinja {

namespace {

std::string need_string(const Value& v, const std::string& what) {
  if (v.kind != Kind::String)
    fault(what + " must be a string, not '" + std::string(type_name(v)) + "'");
  return v.text;
}

// ---- string methods ----

ValueList py_split(const std::string& s, const Value& sep, std::int64_t maxsplit) {
  ValueList out;
  if (sep.kind == Kind::None || sep.is_undefined()) {
    std::u32string w = utf8_to_u32(s);
    std::size_t i = 0;
    std::int64_t splits = 0;
    while (i < w.size()) {
      while (i < w.size() && py_isspace(w[i])) ++i;
      if (i >= w.size()) break;
      if (maxsplit >= 0 && splits >= maxsplit) {
        std::size_t end = w.size();
        while (end > i && py_isspace(w[end - 1])) --end;
        out.push_back(Value::from_string(u32_to_utf8(w.substr(i, end - i))));
        break;
      }
      std::size_t j = i;
      while (j < w.size() && !py_isspace(w[j])) ++j;
      out.push_back(Value::from_string(u32_to_utf8(w.substr(i, j - i))));
      ++splits;
      i = j;
    }
    return out;
  }
  std::string d = need_string(sep, "split() separator");
  if (d.empty()) fault("empty separator");
  std::size_t start = 0;
  std::int64_t splits = 0;
  while (true) {
    std::size_t at = (maxsplit >= 0 && splits >= maxsplit) ? std::string::npos : s.find(d, start);
    if (at == std::string::npos) {
      out.push_back(Value::from_string(s.substr(start)));
      return out;
    }
    out.push_back(Value::from_string(s.substr(start, at - start)));
    start = at + d.size();
    ++splits;
  }
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       std::int64_t count) {
  std::string out;
  if (old.empty()) {
    std::u32string w = utf8_to_u32(s);
    std::int64_t done = 0;
    for (char32_t c : w) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      out += u32_to_utf8(std::u32string(1, c));
    }
    if (count < 0 || done < count) out += repl;
    return out;
  }
  std::size_t start = 0;
  std::int64_t done = 0;
  while (count < 0 || done < count) {
    std::size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += repl;
    start = at + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

bool is_cased_letter(char32_t c) {
  std::string one = u32_to_utf8(std::u32string(1, c));
  return py_upper(one) != py_lower(one);
}

// Python's str.title(): a letter after a cased letter is lowered, any other is uppered.
std::string py_title(const std::string& s) {
  std::u32string w = utf8_to_u32(s);
  std::string out;
  bool prev_cased = false;
  for (char32_t c : w) {
    std::string one = u32_to_utf8(std::u32string(1, c));
    bool cased = is_cased_letter(c);
    out += cased ? (prev_cased ? py_lower(one) : py_upper(one)) : one;
    prev_cased = cased;
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::u32string w = utf8_to_u32(s);
  if (w.empty()) return s;
  return py_upper(u32_to_utf8(w.substr(0, 1))) + py_lower(u32_to_utf8(w.substr(1)));
}

bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    std::string x = need_string(a, prefix ? "startswith() argument" : "endswith() argument");
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.kind == Kind::List) {
    for (const auto& a : *affix.list)
      if (one(a)) return true;
    return false;
  }
  return one(affix);
}

Value string_method(const Value& self, const std::string& name) {
  const std::string s = self.text;
  auto method = [&](auto fn) { return Value::function("str." + name, fn); };
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return method([s, name](CallArgs& a) {
      a.check("str." + name, 1, {"chars"});
      return Value::from_string(
          py_strip(s, a.get_or(0, "chars", Value::none()), name != "rstrip", name != "lstrip"));
    });
  if (name == "split")
    return method([s](CallArgs& a) {
      a.check("str.split", 2, {"sep", "maxsplit"});
      Value m = a.get_or(1, "maxsplit", Value::from_int(-1));
      return Value::from_list(py_split(s, a.get_or(0, "sep", Value::none()), as_int(m)));
    });
  if (name == "upper") return method([s](CallArgs&) { return Value::from_string(py_upper(s)); });
  if (name == "lower") return method([s](CallArgs&) { return Value::from_string(py_lower(s)); });
  if (name == "title") return method([s](CallArgs&) { return Value::from_string(py_title(s)); });
  if (name == "capitalize")
    return method([s](CallArgs&) { return Value::from_string(py_capitalize(s)); });
  if (name == "startswith" || name == "endswith")
    return method([s, name](CallArgs& a) {
      a.check("str." + name, 1, {});
      if (a.positional.empty()) fault("str." + name + "() takes at least 1 argument");
      return Value::from_bool(affix_match(s, a.positional[0], name == "startswith"));
    });
  if (name == "replace")
    return method([s](CallArgs& a) {
      a.check("str.replace", 3, {"count"});
      if (a.positional.size() < 2) fault("str.replace() takes at least 2 arguments");
      Value count = a.get_or(2, "count", Value::from_int(-1));
      return Value::from_string(py_replace(s, need_string(a.positional[0], "replace() argument"),
                                           need_string(a.positional[1], "replace() argument"),
                                           as_int(count)));
    });
  if (name == "find" || name == "count")
    return method([s, name](CallArgs& a) {
      a.check("str." + name, 1, {});
      if (a.positional.empty()) fault("str." + name + "() takes at least 1 argument");
      std::string sub = need_string(a.positional[0], name + "() argument");
      if (name == "find") {
        std::size_t at = s.find(sub);
        if (at == std::string::npos) return Value::from_int(-1);
        return Value::from_int(static_cast<std::int64_t>(utf8_to_u32(s.substr(0, at)).size()));
      }
      if (sub.empty()) return Value::from_int(static_cast<std::int64_t>(utf8_to_u32(s).size()) + 1);
      std::int64_t n = 0;
      for (std::size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
        ++n;
      return Value::from_int(n);
    });
  if (name == "join")
    return method([s](CallArgs& a) {
      a.check("str.join", 1, {});
      if (a.positional.empty()) fault("str.join() takes exactly one argument");
      std::string out;
      bool first = true;
      for (const auto& item : iterate(a.positional[0])) {
        if (!first) out += s;
        first = false;
        out += need_string(item, "str.join() item");
      }
      return Value::from_string(std::move(out));
    });
  if (name == "splitlines")
    return method([s](CallArgs&) {
      ValueList out;
      std::size_t start = 0;
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\n' || s[i] == '\r') {
          out.push_back(Value::from_string(s.substr(start, i - start)));
          if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
          start = i + 1;
        }
      }
      if (start < s.size()) out.push_back(Value::from_string(s.substr(start)));
      return Value::from_list(std::move(out));
    });
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isupper" ||
      name == "islower")
    return method([s, name](CallArgs&) {
      std::u32string w = utf8_to_u32(s);
      if (w.empty()) return Value::from_bool(false);
      if (name == "isupper" || name == "islower") {
        bool any_cased = false;
        for (char32_t c : w) {
          if (!is_cased_letter(c)) continue;
          any_cased = true;
          std::string one = u32_to_utf8(std::u32string(1, c));
          if ((name == "isupper") != (py_upper(one) == one)) return Value::from_bool(false);
        }
        return Value::from_bool(any_cased);
      }
      for (char32_t c : w) {
        bool ok = name == "isdigit"   ? (c >= '0' && c <= '9')
                  : name == "isspace" ? py_isspace(c)
                                      : is_cased_letter(c);
        if (!ok) return Value::from_bool(false);
      }
      return Value::from_bool(true);
    });
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

Value dict_method(const Value& self, const std::string& name) {
  auto method = [&](auto fn) { return Value::function("dict." + name, fn); };
  if (name == "items")
    return method([self](CallArgs&) {
      ValueList out;
      for (const auto& [k, v] : self.dict->items) {
        Value pair = Value::from_list({k, v});
        pair.is_tuple = true;
        out.push_back(pair);
      }
      return Value::from_list(std::move(out));
    });
  if (name == "keys")
    return method([self](CallArgs&) {
      ValueList out;
      for (const auto& [k, v] : self.dict->items) out.push_back(k);
      return Value::from_list(std::move(out));
    });
  if (name == "values")
    return method([self](CallArgs&) {
      ValueList out;
      for (const auto& [k, v] : self.dict->items) out.push_back(v);
      return Value::from_list(std::move(out));
    });
  if (name == "get")
    return method([self](CallArgs& a) {
      a.check("dict.get", 2, {});
      if (a.positional.empty()) fault("dict.get() takes at least 1 argument");
      const Value* v = self.dict->find(a.positional[0]);
      return v ? *v : a.get_or(1, "default", Value::none());
    });
  static const char* const unsafe[] = {"pop",   "popitem", "update",  "setdefault",
                                       "clear", "copy",    "fromkeys"};
  for (const char* u : unsafe)
    if (name == u)
      return method([name](CallArgs&) -> Value {
        fault("dict." + name + "() is not available in chat templates (the sandbox is immutable)");
      });
  return Value::undefined();
}

}  // namespace

Value get_attribute(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Kind::Undefined:
      undefined_fault(obj);
    case Kind::String:
      return string_method(obj, name);
    case Kind::Dict: {
      Value m = dict_method(obj, name);
      if (m.kind == Kind::Callable) return m;
      if (const Value* v = obj.dict->find(Value::from_string(name))) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case Kind::Namespace: {
      if (const Value* v = obj.dict->find(Value::from_string(name))) return *v;
      return Value::undefined("'Namespace object' has no attribute '" + name + "'");
    }
    case Kind::List: {
      static const char* const unsafe[] = {"append", "extend", "insert", "pop",
                                           "remove", "clear",  "sort",   "reverse",
                                           "copy",   "index",  "count"};
      for (const char* u : unsafe)
        if (name == u)
          return Value::function("list." + name, [name](CallArgs&) -> Value {
            fault("list." + name + "() is not available in chat templates");
          });
      return Value::undefined("'list object' has no attribute '" + name + "'");
    }
    default:
      return Value::undefined("'" + std::string(type_name(obj)) + " object' has no attribute '" +
                              name + "'");
  }
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Kind::Undefined:
      undefined_fault(obj);
    case Kind::List:
    case Kind::String: {
      if (!is_int_like(key)) {
        if (key.kind == Kind::String) return get_attribute(obj, key.text);
        return Value::undefined(std::string("'") + type_name(obj) + " object' has no element " +
                                repr(key));
      }
      std::int64_t i = as_int(key);
      if (obj.kind == Kind::List) {
        auto n = static_cast<std::int64_t>(obj.list->size());
        if (i < 0) i += n;
        if (i < 0 || i >= n)
          return Value::undefined("'list object' has no element " + std::to_string(as_int(key)));
        return (*obj.list)[static_cast<std::size_t>(i)];
      }
      std::u32string w = utf8_to_u32(obj.text);
      auto n = static_cast<std::int64_t>(w.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n)
        return Value::undefined("'str object' has no element " + std::to_string(as_int(key)));
      return Value::from_string(u32_to_utf8(w.substr(static_cast<std::size_t>(i), 1)));
    }
    case Kind::Dict:
    case Kind::Namespace: {
      if (const Value* v = obj.dict->find(key)) return *v;
      if (key.kind == Kind::String) return get_attribute(obj, key.text);
      return Value::undefined("'dict object' has no element " + repr(key));
    }
    default:
      return Value::undefined(std::string("'") + type_name(obj) + " object' has no element " +
                              repr(key));
  }
}

namespace {

// Looks up `attribute` ("a.b" or "0") in `item`, as Jinja's make_attrgetter does.
Value attribute_path(const Value& item, const Value& attribute) {
  if (is_int_like(attribute)) return get_item(item, attribute);
  std::string path = need_string(attribute, "attribute");
  Value cur = item;
  std::size_t start = 0;
  while (true) {
    std::size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                               [](char c) { return c >= '0' && c <= '9'; });
    cur = digits ? get_item(cur, Value::from_int(std::stoll(part)))
                 : get_item(cur, Value::from_string(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

Value key_for_sort(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.kind == Kind::String) return Value::from_string(py_lower(v.text));
  return v;
}

// ---- filters ----

Value f_default(Context&, const Value& in, CallArgs& a) {
  a.check("default", 2, {"default_value", "boolean"});
  Value fallback = a.get_or(0, "default_value", Value::from_string(""));
  bool boolean = truthy(a.get_or(1, "boolean", Value::from_bool(false)));
  if (in.is_undefined() || (boolean && !truthy(in))) return fallback;
  return in;
}
Value f_length(Context&, const Value& in, CallArgs& a) {
  a.check("length", 0, {});
  return Value::from_int(static_cast<std::int64_t>(length(in)));
}
Value f_trim(Context&, const Value& in, CallArgs& a) {
  a.check("trim", 1, {"chars"});
  return Value::from_string(py_strip(to_str(in), a.get_or(0, "chars", Value::none()), true, true));
}
Value f_upper(Context&, const Value& in, CallArgs&) {
  return Value::from_string(py_upper(to_str(in)));
}
Value f_lower(Context&, const Value& in, CallArgs&) {
  return Value::from_string(py_lower(to_str(in)));
}
Value f_capitalize(Context&, const Value& in, CallArgs&) {
  return Value::from_string(py_capitalize(to_str(in)));
}
// Jinja's title filter: words begin after spaces, '-', '(', '{', '[' or '<'.
Value f_title(Context&, const Value& in, CallArgs&) {
  std::u32string w = utf8_to_u32(to_str(in));
  std::string out;
  bool word_start = true;
  for (char32_t c : w) {
    std::string one = u32_to_utf8(std::u32string(1, c));
    bool sep = py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      out += one;
      word_start = true;
    } else {
      out += word_start ? py_upper(one) : py_lower(one);
      word_start = false;
    }
  }
  return Value::from_string(out);
}
Value f_first(Context&, const Value& in, CallArgs&) {
  ValueList items = iterate(in);
  if (items.empty()) return Value::undefined("no first item, sequence was empty");
  return items.front();
}
Value f_last(Context&, const Value& in, CallArgs&) {
  if (in.kind == Kind::Dict) fault("'dict' object is not reversible");
  ValueList items = iterate(in);
  if (items.empty()) return Value::undefined("no last item, sequence was empty");
  return items.back();
}
Value f_join(Context&, const Value& in, CallArgs& a) {
  a.check("join", 2, {"d", "attribute"});
  std::string sep = to_str(a.get_or(0, "d", Value::from_string("")));
  const Value* attribute = a.get(1, "attribute");
  std::string out;
  bool first = true;
  for (const auto& item : iterate(in)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attribute && !attribute->is_none() ? attribute_path(item, *attribute) : item);
  }
  return Value::from_string(std::move(out));
}
Value f_tojson(Context&, const Value& in, CallArgs& a) {
  a.check("tojson", 5, {"ensure_ascii", "indent", "separators", "sort_keys"});
  bool ensure_ascii = truthy(a.get_or(0, "ensure_ascii", Value::from_bool(false)));
  Value indent_v = a.get_or(1, "indent", Value::none());
  Value seps = a.get_or(2, "separators", Value::none());
  bool sort_keys = truthy(a.get_or(3, "sort_keys", Value::from_bool(false)));
  int indent = -1;
  if (!indent_v.is_none()) {
    if (!is_int_like(indent_v)) fault("tojson indent must be an integer");
    indent = static_cast<int>(std::clamp<std::int64_t>(as_int(indent_v), 0, 64));
  }
  std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
  if (!seps.is_none()) {
    ValueList parts = iterate(seps);
    if (parts.size() != 2) fault("tojson separators must be a pair of strings");
    item_sep = need_string(parts[0], "separator");
    key_sep = need_string(parts[1], "separator");
  }
  if (in.is_undefined()) undefined_fault(in);
  return Value::from_string(to_json(in, indent, item_sep, key_sep, sort_keys, ensure_ascii));
}
Value f_string(Context&, const Value& in, CallArgs&) {
  return Value::from_string(to_str(in));
}
Value f_safe(Context&, const Value& in, CallArgs&) {
  return in;
}
Value f_int(Context&, const Value& in, CallArgs& a) {
  a.check("int", 2, {"default", "base"});
  Value fallback = a.get_or(0, "default", Value::from_int(0));
  if (is_int_like(in)) return Value::from_int(as_int(in));
  if (in.kind == Kind::Float) {
    if (!std::isfinite(in.number) || std::fabs(in.number) >= 9.2e18) return fallback;
    return Value::from_int(static_cast<std::int64_t>(in.number));
  }
  if (in.kind == Kind::String) {
    std::string s = py_strip(in.text, Value::none(), true, true);
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && end && *end == '\0' && errno == 0) return Value::from_int(v);
    // Python's float() takes no hex literals, unlike strtod.
    bool decimal = s.find_first_not_of("0123456789+-.eE") == std::string::npos;
    double d = std::strtod(s.c_str(), &end);
    if (decimal && !s.empty() && end && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18)
      return Value::from_int(static_cast<std::int64_t>(d));
  }
  return fallback;
}
Value f_float(Context&, const Value& in, CallArgs& a) {
  a.check("float", 1, {"default"});
  Value fallback = a.get_or(0, "default", Value::from_float(0.0));
  if (in.is_number()) return Value::from_float(in.kind == Kind::Float ? in.number : as_int(in));
  if (in.kind == Kind::String) {
    std::string s = py_strip(in.text, Value::none(), true, true);
    char* end = nullptr;
    bool hex = s.find_first_of("xXpP") != std::string::npos;
    double d = std::strtod(s.c_str(), &end);
    if (!hex && !s.empty() && end && *end == '\0') return Value::from_float(d);
  }
  return fallback;
}
Value f_list(Context&, const Value& in, CallArgs&) {
  return Value::from_list(iterate(in));
}
Value f_items(Context&, const Value& in, CallArgs&) {
  if (in.is_undefined()) return Value::from_list({});
  if (in.kind != Kind::Dict && in.kind != Kind::Namespace)
    fault(std::string("can only get item pairs from a mapping, not '") + type_name(in) + "'");
  ValueList out;
  for (const auto& [k, v] : in.dict->items) {
    Value pair = Value::from_list({k, v});
    pair.is_tuple = true;
    out.push_back(pair);
  }
  return Value::from_list(std::move(out));
}
Value f_replace(Context&, const Value& in, CallArgs& a) {
  a.check("replace", 3, {"old", "new", "count"});
  const Value* old_v = a.get(0, "old");
  const Value* new_v = a.get(1, "new");
  if (!old_v || !new_v) fault("replace filter needs the old and the new string");
  Value count = a.get_or(2, "count", Value::none());
  return Value::from_string(
      py_replace(to_str(in), to_str(*old_v), to_str(*new_v), count.is_none() ? -1 : as_int(count)));
}
Value f_round(Context&, const Value& in, CallArgs& a) {
  a.check("round", 2, {"precision", "method"});
  std::int64_t precision = as_int(a.get_or(0, "precision", Value::from_int(0)));
  std::string method = to_str(a.get_or(1, "method", Value::from_string("common")));
  if (!in.is_number()) fault(std::string("round needs a number, not '") + type_name(in) + "'");
  double x = in.kind == Kind::Float ? in.number : static_cast<double>(as_int(in));
  double scale =
      std::pow(10.0, static_cast<double>(std::clamp<std::int64_t>(precision, -300, 300)));
  double r;
  if (method == "common") {
    std::fesetround(FE_TONEAREST);
    r = std::nearbyint(x * scale) / scale;  // Python rounds half to even
  } else if (method == "ceil") {
    r = std::ceil(x * scale) / scale;
  } else if (method == "floor") {
    r = std::floor(x * scale) / scale;
  } else {
    fault("round method must be 'common', 'ceil' or 'floor'");
  }
  return Value::from_float(r);
}
Value f_abs(Context&, const Value& in, CallArgs&) {
  if (is_int_like(in)) return Value::from_int(std::llabs(as_int(in)));
  if (in.kind == Kind::Float) return Value::from_float(std::fabs(in.number));
  fault(std::string("bad operand type for abs(): '") + type_name(in) + "'");
}
Value f_reverse(Context&, const Value& in, CallArgs&) {
  if (in.kind == Kind::String) {
    std::u32string w = utf8_to_u32(in.text);
    std::reverse(w.begin(), w.end());
    return Value::from_string(u32_to_utf8(w));
  }
  if (in.kind == Kind::Dict) fault("'dict' object is not reversible");
  ValueList items = iterate(in);
  std::reverse(items.begin(), items.end());
  return Value::from_list(std::move(items));
}
Value f_unique(Context&, const Value& in, CallArgs& a) {
  a.check("unique", 2, {"case_sensitive", "attribute"});
  bool cs = truthy(a.get_or(0, "case_sensitive", Value::from_bool(false)));
  const Value* attribute = a.get(1, "attribute");
  ValueList out, seen;
  for (const auto& item : iterate(in)) {
    Value key = key_for_sort(
        attribute && !attribute->is_none() ? attribute_path(item, *attribute) : item, cs);
    bool dup =
        std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); });
    if (dup) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::from_list(std::move(out));
}
Value f_sort(Context&, const Value& in, CallArgs& a) {
  a.check("sort", 3, {"reverse", "case_sensitive", "attribute"});
  bool reverse = truthy(a.get_or(0, "reverse", Value::from_bool(false)));
  bool cs = truthy(a.get_or(1, "case_sensitive", Value::from_bool(false)));
  const Value* attribute = a.get(2, "attribute");
  ValueList items = iterate(in);
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& item : items)
    keyed.emplace_back(
        key_for_sort(attribute && !attribute->is_none() ? attribute_path(item, *attribute) : item,
                     cs),
        item);
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first) < 0 : compare(x.first, y.first) < 0;
  });
  ValueList out;
  for (auto& [k, v] : keyed) out.push_back(v);
  return Value::from_list(std::move(out));
}
Value min_max(const Value& in, CallArgs& a, bool want_max) {
  a.check(want_max ? "max" : "min", 2, {"case_sensitive", "attribute"});
  bool cs = truthy(a.get_or(0, "case_sensitive", Value::from_bool(false)));
  const Value* attribute = a.get(1, "attribute");
  ValueList items = iterate(in);
  if (items.empty()) return Value::undefined("no aggregated item, sequence was empty");
  std::size_t best = 0;
  auto key = [&](const Value& v) {
    return key_for_sort(attribute && !attribute->is_none() ? attribute_path(v, *attribute) : v, cs);
  };
  for (std::size_t i = 1; i < items.size(); ++i) {
    int c = compare(key(items[i]), key(items[best]));
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}
Value f_max(Context&, const Value& in, CallArgs& a) {
  return min_max(in, a, true);
}
Value f_min(Context&, const Value& in, CallArgs& a) {
  return min_max(in, a, false);
}
Value f_sum(Context&, const Value& in, CallArgs& a) {
  a.check("sum", 2, {"attribute", "start"});
  const Value* attribute = a.get(0, "attribute");
  Value total = a.get_or(1, "start", Value::from_int(0));
  for (const auto& item : iterate(in)) {
    Value v = attribute && !attribute->is_none() ? attribute_path(item, *attribute) : item;
    if (!total.is_number() || !v.is_number())
      fault(std::string("unsupported operand type(s) for +: '") + type_name(total) + "' and '" +
            type_name(v) + "'");
    if (is_int_like(total) && is_int_like(v)) {
      std::int64_t r;
      if (__builtin_add_overflow(as_int(total), as_int(v), &r)) fault("integer overflow in sum");
      total = Value::from_int(r);
    } else {
      double x = total.kind == Kind::Float ? total.number : as_int(total);
      double y = v.kind == Kind::Float ? v.number : as_int(v);
      total = Value::from_float(x + y);
    }
  }
  return total;
}
Value f_indent(Context&, const Value& in, CallArgs& a) {
  a.check("indent", 3, {"width", "first", "blank"});
  Value width = a.get_or(0, "width", Value::from_int(4));
  bool first = truthy(a.get_or(1, "first", Value::from_bool(false)));
  bool blank = truthy(a.get_or(2, "blank", Value::from_bool(false)));
  std::string pad =
      width.kind == Kind::String
          ? width.text
          : std::string(static_cast<std::size_t>(std::clamp<std::int64_t>(as_int(width), 0, 1024)),
                        ' ');
  std::string s = to_str(in) + "\n";  // Jinja appends a newline, splits, then drops it
  std::vector<std::string> lines;
  std::size_t start = 0;
  for (std::size_t i = 0; i < s.size(); ++i)
    if (s[i] == '\n') {
      lines.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  std::string out;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (i) out += "\n";
    bool pad_it =
        (i == 0) ? first : (blank || !py_strip(lines[i], Value::none(), true, true).empty());
    if (pad_it) out += pad;
    out += lines[i];
  }
  return Value::from_string(out);
}
Value f_escape(Context&, const Value& in, CallArgs&) {
  std::string out;
  for (char c : to_str(in)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return Value::from_string(out);
}
Value f_wordcount(Context&, const Value& in, CallArgs&) {
  return Value::from_int(static_cast<std::int64_t>(py_split(to_str(in), Value::none(), -1).size()));
}
Value f_dictsort(Context&, const Value& in, CallArgs& a) {
  a.check("dictsort", 3, {"case_sensitive", "by", "reverse"});
  bool cs = truthy(a.get_or(0, "case_sensitive", Value::from_bool(false)));
  bool by_value = to_str(a.get_or(1, "by", Value::from_string("key"))) == "value";
  bool reverse = truthy(a.get_or(2, "reverse", Value::from_bool(false)));
  if (in.kind != Kind::Dict) fault("dictsort needs a mapping");
  std::vector<std::pair<Value, Value>> items = in.dict->items;
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    Value kx = key_for_sort(by_value ? x.second : x.first, cs);
    Value ky = key_for_sort(by_value ? y.second : y.first, cs);
    return reverse ? compare(ky, kx) < 0 : compare(kx, ky) < 0;
  });
  ValueList out;
  for (auto& [k, v] : items) {
    Value pair = Value::from_list({k, v});
    pair.is_tuple = true;
    out.push_back(pair);
  }
  return Value::from_list(std::move(out));
}

// select/reject(test, args...), selectattr/rejectattr(attribute, test, args...)
Value select_impl(Context& ctx, const Value& in, CallArgs& a, bool by_attribute, bool keep) {
  std::size_t next = 0;
  Value attribute;
  if (by_attribute) {
    if (a.positional.empty()) fault("selectattr/rejectattr need an attribute name");
    attribute = a.positional[next++];
  }
  TestFn test = nullptr;
  CallArgs test_args;
  if (next < a.positional.size()) {
    std::string name = need_string(a.positional[next++], "test name");
    test = find_test(name);
    if (!test) fault("no test named '" + name + "'");
    test_args.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(next),
                                a.positional.end());
    test_args.keyword = a.keyword;
  }
  ValueList out;
  for (const auto& item : iterate(in)) {
    Value subject = by_attribute ? attribute_path(item, attribute) : item;
    bool pass = test ? test(ctx, subject, test_args) : truthy(subject);
    if (pass == keep) out.push_back(item);
  }
  return Value::from_list(std::move(out));
}
Value f_select(Context& c, const Value& in, CallArgs& a) {
  return select_impl(c, in, a, false, true);
}
Value f_reject(Context& c, const Value& in, CallArgs& a) {
  return select_impl(c, in, a, false, false);
}
Value f_selectattr(Context& c, const Value& in, CallArgs& a) {
  return select_impl(c, in, a, true, true);
}
Value f_rejectattr(Context& c, const Value& in, CallArgs& a) {
  return select_impl(c, in, a, true, false);
}
Value f_map(Context& ctx, const Value& in, CallArgs& a) {
  ValueList out;
  if (const Value* attribute = a.get(99, "attribute")) {
    const Value* fallback = a.get(99, "default");
    for (const auto& item : iterate(in)) {
      Value v = attribute_path(item, *attribute);
      out.push_back(v.is_undefined() && fallback ? *fallback : v);
    }
    return Value::from_list(std::move(out));
  }
  if (a.positional.empty()) fault("map needs a filter name or attribute=");
  std::string name = need_string(a.positional[0], "filter name");
  FilterFn filter = find_filter(name);
  if (!filter) fault("no filter named '" + name + "'");
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const auto& item : iterate(in)) out.push_back(filter(ctx, item, rest));
  return Value::from_list(std::move(out));
}

// ---- tests ----

Value test_arg(CallArgs& a, const std::string& test) {
  if (a.positional.empty()) fault("test '" + test + "' needs an argument");
  return a.positional[0];
}
bool t_defined(Context&, const Value& v, CallArgs&) {
  return !v.is_undefined();
}
bool t_undefined(Context&, const Value& v, CallArgs&) {
  return v.is_undefined();
}
bool t_none(Context&, const Value& v, CallArgs&) {
  return v.is_none();
}
bool t_boolean(Context&, const Value& v, CallArgs&) {
  return v.kind == Kind::Bool;
}
bool t_true(Context&, const Value& v, CallArgs&) {
  return v.kind == Kind::Bool && v.boolean;
}
bool t_false(Context&, const Value& v, CallArgs&) {
  return v.kind == Kind::Bool && !v.boolean;
}
bool t_integer(Context&, const Value& v, CallArgs&) {
  return v.kind == Kind::Int;
}
bool t_float(Context&, const Value& v, CallArgs&) {
  return v.kind == Kind::Float;
}
bool t_number(Context&, const Value& v, CallArgs&) {
  return v.is_number();
}
bool t_string(Context&, const Value& v, CallArgs&) {
  return v.kind == Kind::String;
}
bool t_mapping(Context&, const Value& v, CallArgs&) {
  return v.kind == Kind::Dict;
}
bool t_iterable(Context&, const Value& v, CallArgs&) {
  return v.kind == Kind::String || v.kind == Kind::List || v.kind == Kind::Dict || v.is_undefined();
}
bool t_sequence(Context&, const Value& v, CallArgs&) {
  return v.kind == Kind::String || v.kind == Kind::List || v.kind == Kind::Dict || v.is_undefined();
}
bool t_callable(Context&, const Value& v, CallArgs&) {
  return v.kind == Kind::Callable;
}
bool t_eq(Context&, const Value& v, CallArgs& a) {
  return equals(v, test_arg(a, "=="));
}
bool t_ne(Context&, const Value& v, CallArgs& a) {
  return !equals(v, test_arg(a, "!="));
}
bool t_lt(Context&, const Value& v, CallArgs& a) {
  return compare(v, test_arg(a, "<")) < 0;
}
bool t_le(Context&, const Value& v, CallArgs& a) {
  return compare(v, test_arg(a, "<=")) <= 0;
}
bool t_gt(Context&, const Value& v, CallArgs& a) {
  return compare(v, test_arg(a, ">")) > 0;
}
bool t_ge(Context&, const Value& v, CallArgs& a) {
  return compare(v, test_arg(a, ">=")) >= 0;
}
bool t_in(Context&, const Value& v, CallArgs& a) {
  Value container = test_arg(a, "in");
  if (container.kind == Kind::String)
    return v.kind == Kind::String && container.text.find(v.text) != std::string::npos;
  for (const auto& item : iterate(container))
    if (equals(item, v)) return true;
  return false;
}
bool t_sameas(Context&, const Value& v, CallArgs& a) {
  Value other = test_arg(a, "sameas");
  if (v.kind != other.kind) return false;
  if (v.kind == Kind::List) return v.list == other.list;
  if (v.kind == Kind::Dict || v.kind == Kind::Namespace) return v.dict == other.dict;
  return equals(v, other);
}
bool t_odd(Context&, const Value& v, CallArgs&) {
  if (!is_int_like(v)) fault("test 'odd' needs an integer");
  return as_int(v) % 2 != 0;
}
bool t_even(Context&, const Value& v, CallArgs&) {
  if (!is_int_like(v)) fault("test 'even' needs an integer");
  return as_int(v) % 2 == 0;
}
bool t_divisibleby(Context&, const Value& v, CallArgs& a) {
  Value n = test_arg(a, "divisibleby");
  if (!is_int_like(v) || !is_int_like(n) || as_int(n) == 0)
    fault("test 'divisibleby' needs integers and a non-zero divisor");
  return as_int(v) % as_int(n) == 0;
}
bool t_lower(Context&, const Value& v, CallArgs&) {
  std::string s = to_str(v);
  return py_lower(s) == s;
}
bool t_upper(Context&, const Value& v, CallArgs&) {
  std::string s = to_str(v);
  return py_upper(s) == s;
}
bool t_escaped(Context&, const Value&, CallArgs&) {
  return false;
}

}  // namespace

FilterFn find_filter(const std::string& name) {
  static const std::unordered_map<std::string, FilterFn> filters = {
      {"default", f_default},
      {"d", f_default},
      {"length", f_length},
      {"count", f_length},
      {"trim", f_trim},
      {"upper", f_upper},
      {"lower", f_lower},
      {"title", f_title},
      {"capitalize", f_capitalize},
      {"first", f_first},
      {"last", f_last},
      {"join", f_join},
      {"tojson", f_tojson},
      {"string", f_string},
      {"safe", f_safe},
      {"int", f_int},
      {"float", f_float},
      {"list", f_list},
      {"items", f_items},
      {"replace", f_replace},
      {"round", f_round},
      {"abs", f_abs},
      {"reverse", f_reverse},
      {"unique", f_unique},
      {"sort", f_sort},
      {"max", f_max},
      {"min", f_min},
      {"sum", f_sum},
      {"indent", f_indent},
      {"escape", f_escape},
      {"e", f_escape},
      {"wordcount", f_wordcount},
      {"dictsort", f_dictsort},
      {"select", f_select},
      {"reject", f_reject},
      {"selectattr", f_selectattr},
      {"rejectattr", f_rejectattr},
      {"map", f_map},
  };
  auto it = filters.find(name);
  return it == filters.end() ? nullptr : it->second;
}

TestFn find_test(const std::string& name) {
  static const std::unordered_map<std::string, TestFn> tests = {
      {"defined", t_defined},
      {"undefined", t_undefined},
      {"none", t_none},
      {"boolean", t_boolean},
      {"true", t_true},
      {"false", t_false},
      {"integer", t_integer},
      {"float", t_float},
      {"number", t_number},
      {"string", t_string},
      {"mapping", t_mapping},
      {"iterable", t_iterable},
      {"sequence", t_sequence},
      {"callable", t_callable},
      {"equalto", t_eq},
      {"eq", t_eq},
      {"==", t_eq},
      {"ne", t_ne},
      {"!=", t_ne},
      {"lt", t_lt},
      {"lessthan", t_lt},
      {"<", t_lt},
      {"le", t_le},
      {"<=", t_le},
      {"gt", t_gt},
      {"greaterthan", t_gt},
      {">", t_gt},
      {"ge", t_ge},
      {">=", t_ge},
      {"in", t_in},
      {"sameas", t_sameas},
      {"odd", t_odd},
      {"even", t_even},
      {"divisibleby", t_divisibleby},
      {"lower", t_lower},
      {"upper", t_upper},
      {"escaped", t_escaped},
  };
  auto it = tests.find(name);
  return it == tests.end() ? nullptr : it->second;
}

}  // namespace tessera::hf::jinja
