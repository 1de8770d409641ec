#pragma once
// The parsed form of a Jinja template and the evaluation context. Internal to engine/hf/chat.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hf/chat/jinja_value.h"

namespace tessera::hf::jinja {

struct Scope {
  std::map<std::string, Value, std::less<>> vars;
  std::shared_ptr<Scope> parent;
  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { Normal, Break, Continue };

struct Context {
  std::shared_ptr<Scope> scope;
  Flow flow = Flow::Normal;
  int line = 0;   // line of the construct being evaluated, for error messages
  int depth = 0;  // macro call depth, bounded so a recursive template cannot overflow the stack
  // Every scope a macro closed over. A macro lives in the scope it closes over (a reference
  // cycle), so render() empties these scopes when it ends, or each render would leak them.
  std::vector<std::shared_ptr<Scope>> closures;
};

struct Expr {
  int line = 0;
  virtual ~Expr() = default;
  Value eval(Context& ctx) const {
    ctx.line = line;
    return evaluate(ctx);
  }
  virtual Value evaluate(Context& ctx) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Stmt {
  int line = 0;
  virtual ~Stmt() = default;
  virtual void render(Context& ctx, std::string& out) const = 0;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

void render_body(const Body& body, Context& ctx, std::string& out);

// Filters and tests, looked up by name at parse time so unknown names are syntax errors.
using FilterFn = Value (*)(Context& ctx, const Value& input, CallArgs& args);
using TestFn = bool (*)(Context& ctx, const Value& input, CallArgs& args);
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);
// Attribute and item access with Jinja's fallbacks (attribute first for `.`, item first
// for `[]`), including the string and dict methods.
Value get_attribute(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);

struct TemplateNode {
  std::string name;
  Body body;
};

}  // namespace tessera::hf::jinja
