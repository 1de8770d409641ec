// Parser and tree-walking renderer for the Jinja subset (see jinja.h).
#include "hf/chat/jinja.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>
#include <optional>

#include "core/error.h"
#include "hf/chat/jinja_ast.h"
#include "hf/chat/jinja_lexer.h"

namespace tessera::hf::jinja {

namespace {

constexpr int kMaxCallDepth = 256;
constexpr int kMaxNesting = 200;
constexpr std::size_t kMaxStringBytes = std::size_t{1} << 30;

// ---- expressions ---------------------------------------------------------------------

struct ConstExpr : Expr {
  Value value;
  Value evaluate(Context&) const override { return value; }
};

struct NameExpr : Expr {
  std::string name;
  Value evaluate(Context& ctx) const override {
    if (const Value* v = ctx.scope->lookup(name)) return *v;
    return Value::undefined("'" + name + "' is undefined");
  }
};

struct AttrExpr : Expr {
  ExprPtr object;
  std::string name;
  Value evaluate(Context& ctx) const override {
    Value obj = object->eval(ctx);
    ctx.line = line;
    return get_attribute(obj, name);
  }
};

struct ItemExpr : Expr {
  ExprPtr object, key;
  Value evaluate(Context& ctx) const override {
    Value obj = object->eval(ctx);
    Value k = key->eval(ctx);
    ctx.line = line;
    return get_item(obj, k);
  }
};

std::int64_t clamp_index(std::int64_t i, std::int64_t len, std::int64_t lo, std::int64_t hi) {
  if (i < 0) i += len;
  return std::clamp(i, lo, hi);
}

struct SliceExpr : Expr {
  ExprPtr object, start, stop, step;
  Value evaluate(Context& ctx) const override {
    Value obj = object->eval(ctx);
    auto bound = [&](const ExprPtr& e) -> std::optional<std::int64_t> {
      if (!e) return std::nullopt;
      Value v = e->eval(ctx);
      if (v.is_none()) return std::nullopt;
      if (!is_int_like(v)) fault("slice indices must be integers or None");
      return as_int(v);
    };
    auto b = bound(start), e = bound(stop), s = bound(step);
    std::int64_t st = s.value_or(1);
    if (st == 0) fault("slice step cannot be zero");
    if (obj.is_undefined()) undefined_fault(obj);
    std::vector<std::size_t> picks;
    auto select = [&](std::int64_t len) {
      std::int64_t from, to;
      if (st > 0) {
        from = b ? clamp_index(*b, len, 0, len) : 0;
        to = e ? clamp_index(*e, len, 0, len) : len;
        for (std::int64_t i = from; i < to; i += st) picks.push_back(static_cast<std::size_t>(i));
      } else {
        from = b ? clamp_index(*b, len, -1, len - 1) : len - 1;
        to = e ? clamp_index(*e, len, -1, len - 1) : -1;
        for (std::int64_t i = from; i > to; i += st) picks.push_back(static_cast<std::size_t>(i));
      }
    };
    if (obj.kind == Kind::String) {
      std::u32string wide = utf8_to_u32(obj.text), out;
      select(static_cast<std::int64_t>(wide.size()));
      for (auto i : picks) out.push_back(wide[i]);
      return Value::from_string(u32_to_utf8(out));
    }
    if (obj.kind == Kind::List) {
      select(static_cast<std::int64_t>(obj.list->size()));
      ValueList out;
      for (auto i : picks) out.push_back((*obj.list)[i]);
      Value r = Value::from_list(std::move(out));
      r.is_tuple = obj.is_tuple;
      return r;
    }
    fault(std::string("'") + type_name(obj) + "' object is not subscriptable");
  }
};

struct ArgExprs {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  CallArgs eval(Context& ctx) const {
    CallArgs args;
    for (const auto& e : positional) args.positional.push_back(e->eval(ctx));
    for (const auto& [k, e] : keyword) args.keyword.emplace_back(k, e->eval(ctx));
    return args;
  }
};

struct CallExpr : Expr {
  ExprPtr callee;
  ArgExprs args;
  Value evaluate(Context& ctx) const override {
    Value fn = callee->eval(ctx);
    CallArgs call_args = args.eval(ctx);
    ctx.line = line;
    if (fn.is_undefined()) undefined_fault(fn);
    if (fn.kind != Kind::Callable)
      fault(std::string("'") + type_name(fn) + "' object is not callable");
    return fn.callable->fn(call_args);
  }
};

struct FilterExpr : Expr {
  ExprPtr input;  // null inside {% filter %} blocks, where the body is the input
  std::string name;
  FilterFn fn = nullptr;
  ArgExprs args;
  Value apply(Context& ctx, const Value& in) const {
    CallArgs call_args = args.eval(ctx);
    ctx.line = line;
    return fn(ctx, in, call_args);
  }
  Value evaluate(Context& ctx) const override { return apply(ctx, input->eval(ctx)); }
};

struct TestExpr : Expr {
  ExprPtr input;
  std::string name;
  TestFn fn = nullptr;
  bool negated = false;
  ArgExprs args;
  Value evaluate(Context& ctx) const override {
    Value in = input->eval(ctx);
    CallArgs call_args = args.eval(ctx);
    ctx.line = line;
    return Value::from_bool(fn(ctx, in, call_args) != negated);
  }
};

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_fault(a);
  if (b.is_undefined()) undefined_fault(b);
  auto unsupported = [&]() -> Value {
    fault("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
          type_name(b) + "'");
  };
  bool ints = is_int_like(a) && is_int_like(b);
  bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) {
      std::int64_t r;
      if (__builtin_add_overflow(as_int(a), as_int(b), &r)) fault("integer overflow in +");
      return Value::from_int(r);
    }
    if (nums) return Value::from_float(as_double(a) + as_double(b));
    if (a.kind == Kind::String && b.kind == Kind::String) {
      if (a.text.size() + b.text.size() > kMaxStringBytes) fault("string too large");
      return Value::from_string(a.text + b.text);
    }
    if (a.kind == Kind::List && b.kind == Kind::List) {
      ValueList out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return Value::from_list(std::move(out));
    }
    return unsupported();
  }
  if (op == "-") {
    if (ints) {
      std::int64_t r;
      if (__builtin_sub_overflow(as_int(a), as_int(b), &r)) fault("integer overflow in -");
      return Value::from_int(r);
    }
    if (nums) return Value::from_float(as_double(a) - as_double(b));
    return unsupported();
  }
  if (op == "*") {
    if (ints) {
      std::int64_t r;
      if (__builtin_mul_overflow(as_int(a), as_int(b), &r)) fault("integer overflow in *");
      return Value::from_int(r);
    }
    if (nums) return Value::from_float(as_double(a) * as_double(b));
    const Value* seq = (a.kind == Kind::String || a.kind == Kind::List) ? &a : &b;
    const Value* count = seq == &a ? &b : &a;
    if ((seq->kind == Kind::String || seq->kind == Kind::List) && is_int_like(*count)) {
      std::int64_t times = std::max<std::int64_t>(0, as_int(*count));
      std::size_t unit = seq->kind == Kind::String ? seq->text.size() : seq->list->size();
      if (unit && static_cast<std::uint64_t>(times) > kMaxStringBytes / unit)
        fault("repetition result too large");
      if (unit == 0) times = 0;  // '' * 2**63 is '', at once (not 2**63 empty appends)
      if (seq->kind == Kind::String) {
        std::string out;
        for (std::int64_t i = 0; i < times; ++i) out += seq->text;
        return Value::from_string(std::move(out));
      }
      ValueList out;
      for (std::int64_t i = 0; i < times; ++i)
        out.insert(out.end(), seq->list->begin(), seq->list->end());
      return Value::from_list(std::move(out));
    }
    return unsupported();
  }
  if (!nums) return unsupported();
  if (op == "/") {
    if (as_double(b) == 0.0) fault("division by zero");
    return Value::from_float(as_double(a) / as_double(b));
  }
  if (op == "//") {
    if (ints) {
      std::int64_t x = as_int(a), y = as_int(b);
      if (y == 0) fault("integer division or modulo by zero");
      if (x == std::numeric_limits<std::int64_t>::min() && y == -1) fault("integer overflow in //");
      std::int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return Value::from_int(q);
    }
    if (as_double(b) == 0.0) fault("float floor division by zero");
    return Value::from_float(std::floor(as_double(a) / as_double(b)));
  }
  if (op == "%") {
    if (ints) {
      std::int64_t x = as_int(a), y = as_int(b);
      if (y == 0) fault("integer division or modulo by zero");
      if (y == -1) return Value::from_int(0);
      std::int64_t r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value::from_int(r);
    }
    double y = as_double(b);
    if (y == 0.0) fault("float modulo");
    double r = std::fmod(as_double(a), y);
    if (r != 0.0 && ((r < 0) != (y < 0))) r += y;
    return Value::from_float(r);
  }
  if (op == "**") {
    if (ints && as_int(b) >= 0) {
      std::int64_t base = as_int(a), r = 1;
      for (std::int64_t i = 0; i < as_int(b); ++i)
        if (__builtin_mul_overflow(r, base, &r)) fault("integer overflow in **");
      return Value::from_int(r);
    }
    return Value::from_float(std::pow(as_double(a), as_double(b)));
  }
  return unsupported();
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::Undefined:
      return false;
    case Kind::String:
      if (item.kind != Kind::String)
        fault(std::string("'in <string>' requires string as left operand, not ") + type_name(item));
      return container.text.find(item.text) != std::string::npos;
    case Kind::List:
      for (const auto& v : *container.list)
        if (equals(v, item)) return true;
      return false;
    case Kind::Dict:
      return container.dict->find(item) != nullptr;
    default:
      fault(std::string("argument of type '") + type_name(container) + "' is not iterable");
  }
}

struct BinaryExpr : Expr {
  std::string op;
  ExprPtr left, right;
  Value evaluate(Context& ctx) const override {
    Value a = left->eval(ctx);
    Value b = right->eval(ctx);
    ctx.line = line;
    if (op == "~") return Value::from_string(to_str(a) + to_str(b));
    return arithmetic(op, a, b);
  }
};

struct UnaryExpr : Expr {
  std::string op;  // "-", "+", "not"
  ExprPtr operand;
  Value evaluate(Context& ctx) const override {
    Value v = operand->eval(ctx);
    if (op == "not") return Value::from_bool(!truthy(v));
    if (v.is_undefined()) undefined_fault(v);
    if (!v.is_number()) fault("bad operand type for unary " + op + ": '" + type_name(v) + "'");
    if (op == "+") return is_int_like(v) ? Value::from_int(as_int(v)) : v;
    if (is_int_like(v)) {
      if (as_int(v) == std::numeric_limits<std::int64_t>::min()) fault("integer overflow in -");
      return Value::from_int(-as_int(v));
    }
    return Value::from_float(-v.number);
  }
};

struct AndOrExpr : Expr {
  bool is_and = true;
  ExprPtr left, right;
  Value evaluate(Context& ctx) const override {
    Value a = left->eval(ctx);
    if (truthy(a) != is_and) return a;
    return right->eval(ctx);
  }
};

struct CompareExpr : Expr {
  ExprPtr first;
  std::vector<std::pair<std::string, ExprPtr>> rest;
  Value evaluate(Context& ctx) const override {
    Value a = first->eval(ctx);
    for (const auto& [op, e] : rest) {
      Value b = e->eval(ctx);
      ctx.line = line;
      bool ok;
      if (op == "==") {
        ok = equals(a, b);
      } else if (op == "!=") {
        ok = !equals(a, b);
      } else if (op == "in") {
        ok = contains(b, a);
      } else if (op == "notin") {
        ok = !contains(b, a);
      } else {
        if (a.is_undefined()) undefined_fault(a);
        if (b.is_undefined()) undefined_fault(b);
        int c = compare(a, b);
        ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
      }
      if (!ok) return Value::from_bool(false);
      a = std::move(b);
    }
    return Value::from_bool(true);
  }
};

struct CondExpr : Expr {
  ExprPtr test, then_expr, else_expr;
  Value evaluate(Context& ctx) const override {
    if (truthy(test->eval(ctx))) return then_expr->eval(ctx);
    if (else_expr) return else_expr->eval(ctx);
    return Value::undefined("the inline if-expression evaluated to false and has no else");
  }
};

struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  bool tuple = false;
  Value evaluate(Context& ctx) const override {
    ValueList out;
    for (const auto& e : items) out.push_back(e->eval(ctx));
    Value v = Value::from_list(std::move(out));
    v.is_tuple = tuple;
    return v;
  }
};

struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value evaluate(Context& ctx) const override {
    Value d = Value::new_dict();
    for (const auto& [k, v] : items) {
      Value key = k->eval(ctx);
      if (key.kind == Kind::List || key.kind == Kind::Dict || key.kind == Kind::Namespace)
        fault(std::string("unhashable type: '") + type_name(key) + "'");
      d.dict->set(key, v->eval(ctx));
    }
    return d;
  }
};

// ---- statements ----------------------------------------------------------------------

struct TextStmt : Stmt {
  std::string text;
  void render(Context&, std::string& out) const override { out += text; }
};

struct PrintStmt : Stmt {
  ExprPtr expr;
  void render(Context& ctx, std::string& out) const override {
    Value v = expr->eval(ctx);
    out += to_str(v);
    if (out.size() > kMaxStringBytes) fault("rendered output too large");
  }
};

struct IfStmt : Stmt {
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body else_body;
  void render(Context& ctx, std::string& out) const override {
    for (const auto& [cond, body] : branches) {
      ctx.line = line;
      if (truthy(cond->eval(ctx))) {
        render_body(body, ctx, out);
        return;
      }
    }
    render_body(else_body, ctx, out);
  }
};

// Assignment targets: a name or a tuple of names (`for a, b in ...`, `set a, b = ...`).
void assign(Scope& scope, const std::vector<std::string>& names, bool unpack, const Value& v) {
  if (!unpack) {
    scope.vars[names[0]] = v;
    return;
  }
  ValueList items = iterate(v);
  if (items.size() != names.size())
    fault(std::string(items.size() > names.size() ? "too many" : "not enough") +
          " values to unpack (expected " + std::to_string(names.size()) + ", got " +
          std::to_string(items.size()) + ")");
  for (std::size_t i = 0; i < names.size(); ++i) scope.vars[names[i]] = items[i];
}

struct ForStmt : Stmt {
  std::vector<std::string> targets;
  bool unpack = false;
  ExprPtr iterable, filter;
  Body body, else_body;
  void render(Context& ctx, std::string& out) const override {
    ctx.line = line;
    Value seq = iterable->eval(ctx);
    if (seq.kind == Kind::Dict || seq.kind == Kind::String || seq.kind == Kind::List ||
        seq.is_undefined()) {
    } else {
      fault(std::string("'") + type_name(seq) + "' object is not iterable");
    }
    ValueList items = iterate(seq);
    auto outer = ctx.scope;
    if (filter) {
      ValueList kept;
      for (const auto& item : items) {
        ctx.scope = std::make_shared<Scope>(Scope{{}, outer});
        assign(*ctx.scope, targets, unpack, item);
        bool keep = truthy(filter->eval(ctx));
        ctx.scope = outer;
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const auto n = static_cast<std::int64_t>(items.size());
    for (std::int64_t i = 0; i < n; ++i) {
      Value loop = Value::new_dict();
      auto set = [&](const char* k, Value v) {
        loop.dict->set(Value::from_string(k), std::move(v));
      };
      set("index", Value::from_int(i + 1));
      set("index0", Value::from_int(i));
      set("revindex", Value::from_int(n - i));
      set("revindex0", Value::from_int(n - i - 1));
      set("first", Value::from_bool(i == 0));
      set("last", Value::from_bool(i == n - 1));
      set("length", Value::from_int(n));
      set("depth", Value::from_int(1));
      set("depth0", Value::from_int(0));
      set("previtem", i > 0 ? items[static_cast<std::size_t>(i - 1)]
                            : Value::undefined("there is no previous item"));
      set("nextitem", i + 1 < n ? items[static_cast<std::size_t>(i + 1)]
                                : Value::undefined("there is no next item"));
      set("cycle", Value::function("loop.cycle", [i](CallArgs& args) {
            if (args.positional.empty()) fault("no items for cycling given");
            return args.positional[static_cast<std::size_t>(i) % args.positional.size()];
          }));
      ctx.scope = std::make_shared<Scope>(Scope{{}, outer});
      ctx.scope->vars["loop"] = loop;
      assign(*ctx.scope, targets, unpack, items[static_cast<std::size_t>(i)]);
      try {
        render_body(body, ctx, out);
      } catch (...) {
        ctx.scope = outer;
        throw;
      }
      ctx.scope = outer;
      Flow flow = ctx.flow;
      ctx.flow = Flow::Normal;
      if (flow == Flow::Break) break;
    }
    if (n == 0) render_body(else_body, ctx, out);
  }
};

struct SetStmt : Stmt {
  std::vector<std::string> targets;
  bool unpack = false;
  std::string attribute;  // `set ns.attr = ...` when not empty (targets[0] is the namespace)
  ExprPtr value;
  void render(Context& ctx, std::string&) const override {
    Value v = value->eval(ctx);
    ctx.line = line;
    if (!attribute.empty()) {
      const Value* ns = ctx.scope->lookup(targets[0]);
      if (!ns || ns->kind != Kind::Namespace)
        fault("cannot assign attribute on non-namespace object '" + targets[0] + "'");
      if (!attribute.empty() && attribute[0] == '_')
        fault("chat templates cannot store underscore-prefixed attributes on a namespace");
      ns->dict->set(Value::from_string(attribute), std::move(v));
      return;
    }
    assign(*ctx.scope, targets, unpack, v);
  }
};

struct SetBlockStmt : Stmt {
  std::string target;
  std::vector<std::unique_ptr<FilterExpr>> filters;
  Body body;
  void render(Context& ctx, std::string&) const override {
    std::string captured;
    render_body(body, ctx, captured);
    Value v = Value::from_string(std::move(captured));
    for (const auto& f : filters) v = f->apply(ctx, v);
    ctx.scope->vars[target] = std::move(v);
  }
};

struct FilterBlockStmt : Stmt {
  std::vector<std::unique_ptr<FilterExpr>> filters;
  Body body;
  void render(Context& ctx, std::string& out) const override {
    std::string captured;
    render_body(body, ctx, captured);
    Value v = Value::from_string(std::move(captured));
    for (const auto& f : filters) v = f->apply(ctx, v);
    out += to_str(v);
  }
};

struct WithStmt : Stmt {
  std::vector<std::pair<std::string, ExprPtr>> assignments;
  Body body;
  void render(Context& ctx, std::string& out) const override {
    auto outer = ctx.scope;
    auto inner = std::make_shared<Scope>(Scope{{}, outer});
    for (const auto& [name, e] : assignments) inner->vars[name] = e->eval(ctx);
    ctx.scope = inner;
    try {
      render_body(body, ctx, out);
    } catch (...) {
      ctx.scope = outer;
      throw;
    }
    ctx.scope = outer;
  }
};

struct LoopControlStmt : Stmt {
  Flow flow = Flow::Break;
  void render(Context& ctx, std::string&) const override { ctx.flow = flow; }
};

struct BlockStmt : Stmt {  // {% generation %}: renders its body as is
  Body body;
  void render(Context& ctx, std::string& out) const override { render_body(body, ctx, out); }
};

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // aligned to the last params
  std::vector<std::string> caller_params;
  Body body;
};

Value make_macro(const MacroDef* def, Context* ctx, std::shared_ptr<Scope> closure,
                 std::optional<Value> caller) {
  ctx->closures.push_back(closure);
  return Value::function(def->name, [def, ctx, closure, caller](CallArgs& args) -> Value {
    if (ctx->depth >= kMaxCallDepth) fault("macro '" + def->name + "' recursed too deeply");
    auto scope = std::make_shared<Scope>(Scope{{}, closure});
    if (args.positional.size() > def->params.size())
      fault("macro '" + def->name + "' takes not more than " + std::to_string(def->params.size()) +
            " argument(s)");
    std::size_t first_default = def->params.size() - def->defaults.size();
    auto saved_scope = ctx->scope;
    auto saved_line = ctx->line;
    ctx->scope = scope;
    ++ctx->depth;
    std::string out;
    try {
      for (const auto& [k, v] : args.keyword)
        if (k != "caller" &&
            std::find(def->params.begin(), def->params.end(), k) == def->params.end())
          fault("macro '" + def->name + "' takes no keyword argument '" + k + "'");
      for (std::size_t i = 0; i < def->params.size(); ++i) {
        const Value* given = args.get(i, def->params[i]);
        if (given) {
          scope->vars[def->params[i]] = *given;
        } else if (i >= first_default) {
          scope->vars[def->params[i]] = def->defaults[i - first_default]->eval(*ctx);
        } else {
          scope->vars[def->params[i]] =
              Value::undefined("parameter '" + def->params[i] + "' was not provided");
        }
      }
      if (caller) scope->vars["caller"] = *caller;
      for (const auto& [k, v] : args.keyword)
        if (k == "caller") scope->vars["caller"] = v;
      render_body(def->body, *ctx, out);
    } catch (...) {
      ctx->scope = saved_scope;
      --ctx->depth;
      throw;
    }
    ctx->scope = saved_scope;
    ctx->line = saved_line;
    --ctx->depth;
    ctx->flow = Flow::Normal;
    return Value::from_string(std::move(out));
  });
}

struct MacroStmt : Stmt {
  MacroDef def;
  void render(Context& ctx, std::string&) const override {
    ctx.scope->vars[def.name] = make_macro(&def, &ctx, ctx.scope, std::nullopt);
  }
};

struct CallBlockStmt : Stmt {
  MacroDef caller_def;  // the body, as a macro named "caller"
  std::unique_ptr<CallExpr> call;
  void render(Context& ctx, std::string& out) const override {
    Value fn = call->callee->eval(ctx);
    if (fn.kind != Kind::Callable) fault("{% call %} needs a macro to call");
    CallArgs args = call->args.eval(ctx);
    args.keyword.emplace_back("caller", make_macro(&caller_def, &ctx, ctx.scope, std::nullopt));
    out += to_str(fn.callable->fn(args));
  }
};

// ---- parser --------------------------------------------------------------------------

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& name)
      : tokens_(std::move(tokens)), name_(name) {}

  Body parse_template() {
    Body body = subparse({});
    if (cur().type != Tok::Eof) fail_at(cur(), "unexpected tag");
    return body;
  }

 private:
  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek(std::size_t k = 1) const {
    return tokens_[std::min(pos_ + k, tokens_.size() - 1)];
  }
  Token next() {
    Token t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  [[noreturn]] void fail_at(const Token& t, const std::string& message) const {
    syntax_error(name_, t.line, t.col, message);
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Eof:
        return "end of template";
      case Tok::BlockEnd:
        return "end of statement block";
      case Tok::VarEnd:
        return "end of print statement";
      case Tok::String:
        return "string";
      case Tok::Int:
      case Tok::Float:
        return "number '" + t.value + "'";
      default:
        return "'" + t.value + "'";
    }
  }
  bool is_op(const std::string& op) const { return cur().type == Tok::Op && cur().value == op; }
  bool is_name(const std::string& name) const {
    return cur().type == Tok::Name && cur().value == name;
  }
  bool skip_op(const std::string& op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const std::string& name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  void expect_op(const std::string& op) {
    if (!skip_op(op)) fail_at(cur(), "expected '" + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail_at(cur(), "expected a name, got " + describe(cur()));
    return next().value;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd)
      fail_at(cur(), "expected end of statement block '%}', got " + describe(cur()));
    next();
  }

  template <typename T>
  std::unique_ptr<T> node(const Token& at) {
    auto n = std::make_unique<T>();
    n->line = at.line;
    return n;
  }

  // Parses until a block tag whose name is in `end_names`; leaves the parser on that name.
  Body subparse(const std::vector<std::string>& end_names) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (!end_names.empty()) {
          std::string wanted;
          for (const auto& n : end_names) wanted += (wanted.empty() ? "'" : " or '") + n + "'";
          fail_at(t, "unexpected end of template, expected " + wanted);
        }
        return body;
      }
      if (t.type == Tok::Data) {
        auto text = node<TextStmt>(t);
        text->text = t.value;
        body.push_back(std::move(text));
        next();
      } else if (t.type == Tok::VarBegin) {
        next();
        auto print = node<PrintStmt>(t);
        print->expr = parse_tuple(true);
        if (cur().type != Tok::VarEnd)
          fail_at(cur(), "expected end of print statement '}}', got " + describe(cur()));
        next();
        body.push_back(std::move(print));
      } else if (t.type == Tok::BlockBegin) {
        next();
        if (cur().type != Tok::Name) fail_at(cur(), "tag name expected");
        if (std::find(end_names.begin(), end_names.end(), cur().value) != end_names.end())
          return body;
        body.push_back(parse_statement());
      } else {
        fail_at(t, "unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement() {
    DepthGuard guard(*this);
    const Token t = cur();
    const std::string& tag = t.value;
    if (tag == "if") return parse_if();
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "macro") return parse_macro();
    if (tag == "call") return parse_call_block();
    if (tag == "filter") return parse_filter_block();
    if (tag == "with") return parse_with();
    if (tag == "generation") {
      next();
      expect_block_end();
      auto b = node<BlockStmt>(t);
      b->body = subparse({"endgeneration"});
      next();
      expect_block_end();
      return b;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail_at(t, "'" + tag + "' outside of a for loop");
      next();
      expect_block_end();
      auto s = node<LoopControlStmt>(t);
      s->flow = tag == "break" ? Flow::Break : Flow::Continue;
      return s;
    }
    static const std::vector<std::string> unsupported = {"block", "extends", "include",    "import",
                                                         "from",  "do",      "autoescape", "trans"};
    if (std::find(unsupported.begin(), unsupported.end(), tag) != unsupported.end())
      fail_at(t, "the '" + tag + "' tag is not supported in chat templates");
    fail_at(t, "encountered unknown tag '" + tag + "'");
  }

  StmtPtr parse_if() {
    const Token t = next();  // if
    auto s = node<IfStmt>(t);
    while (true) {
      ExprPtr cond = parse_tuple(false);
      expect_block_end();
      Body body = subparse({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(body));
      std::string which = next().value;
      if (which == "elif") continue;
      if (which == "else") {
        expect_block_end();
        s->else_body = subparse({"endif"});
        next();
      }
      expect_block_end();
      return s;
    }
  }

  void parse_targets(std::vector<std::string>& names, bool& unpack) {
    bool paren = skip_op("(");
    names.push_back(expect_name());
    while (skip_op(",")) {
      unpack = true;
      if (cur().type != Tok::Name) break;
      names.push_back(expect_name());
    }
    if (paren) {
      unpack = true;
      expect_op(")");
    }
  }

  StmtPtr parse_for() {
    const Token t = next();  // for
    auto s = node<ForStmt>(t);
    parse_targets(s->targets, s->unpack);
    if (!skip_name("in")) fail_at(cur(), "expected 'in' in for loop, got " + describe(cur()));
    s->iterable = parse_tuple(false, /*with_condexpr=*/false);
    if (skip_name("if")) s->filter = parse_tuple(false);
    if (is_name("recursive")) fail_at(cur(), "recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    s->body = subparse({"endfor", "else"});
    --loop_depth_;
    if (next().value == "else") {
      expect_block_end();
      s->else_body = subparse({"endfor"});
      next();
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set() {
    const Token t = next();  // set
    if (cur().type == Tok::Name && peek().type == Tok::Op && peek().value == "." &&
        peek(2).type == Tok::Name) {
      auto s = node<SetStmt>(t);
      s->targets.push_back(next().value);
      next();
      s->attribute = next().value;
      expect_op("=");
      s->value = parse_tuple(false);
      expect_block_end();
      return s;
    }
    std::vector<std::string> names;
    bool unpack = false;
    parse_targets(names, unpack);
    if (skip_op("=")) {
      auto s = node<SetStmt>(t);
      s->targets = std::move(names);
      s->unpack = unpack;
      s->value = parse_tuple(false);
      expect_block_end();
      return s;
    }
    if (unpack) fail_at(cur(), "a block set takes exactly one name");
    auto s = node<SetBlockStmt>(t);
    s->target = names[0];
    while (skip_op("|")) s->filters.push_back(parse_filter_call(nullptr));
    expect_block_end();
    s->body = subparse({"endset"});
    next();
    expect_block_end();
    return s;
  }

  void parse_signature(MacroDef& def) {
    expect_op("(");
    while (!is_op(")")) {
      if (!def.params.empty()) expect_op(",");
      if (is_op(")")) break;
      def.params.push_back(expect_name());
      if (skip_op("=")) {
        def.defaults.push_back(parse_expression(true));
      } else if (!def.defaults.empty()) {
        fail_at(cur(), "non-default argument follows default argument");
      }
    }
    next();
  }

  StmtPtr parse_macro() {
    const Token t = next();  // macro
    auto s = node<MacroStmt>(t);
    s->def.name = expect_name();
    parse_signature(s->def);
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->def.body = subparse({"endmacro"});
    loop_depth_ = saved;
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block() {
    const Token t = next();  // call
    auto s = node<CallBlockStmt>(t);
    s->caller_def.name = "caller";
    if (is_op("(")) parse_signature(s->caller_def);
    ExprPtr call = parse_expression(true);
    auto* as_call = dynamic_cast<CallExpr*>(call.get());
    if (!as_call) fail_at(t, "expected a macro call after 'call'");
    call.release();
    s->call.reset(as_call);
    expect_block_end();
    s->caller_def.body = subparse({"endcall"});
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block() {
    const Token t = next();  // filter
    auto s = node<FilterBlockStmt>(t);
    s->filters.push_back(parse_filter_call(nullptr));
    while (skip_op("|")) s->filters.push_back(parse_filter_call(nullptr));
    expect_block_end();
    s->body = subparse({"endfilter"});
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_with() {
    const Token t = next();  // with
    auto s = node<WithStmt>(t);
    while (cur().type != Tok::BlockEnd) {
      if (!s->assignments.empty()) expect_op(",");
      std::string name = expect_name();
      expect_op("=");
      s->assignments.emplace_back(name, parse_expression(true));
    }
    expect_block_end();
    s->body = subparse({"endwith"});
    next();
    expect_block_end();
    return s;
  }

  // ---- expressions ----

  ExprPtr parse_tuple(bool /*print*/, bool with_condexpr = true) {
    const Token start = cur();
    ExprPtr first = with_condexpr ? parse_expression(true) : parse_or();
    if (!is_op(",")) return first;
    auto list = node<ListExpr>(start);
    list->tuple = true;
    list->items.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::BlockEnd || cur().type == Tok::VarEnd || is_op(")") || is_name("if") ||
          is_name("in"))
        break;
      list->items.push_back(with_condexpr ? parse_expression(true) : parse_or());
    }
    return list;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    if (!with_condexpr) return parse_or();
    const Token start = cur();
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      next();
      auto c = node<CondExpr>(start);
      c->then_expr = std::move(expr);
      c->test = parse_or();
      if (skip_name("else")) c->else_expr = parse_expression(true);
      expr = std::move(c);
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const Token t = next();
      auto n = node<AndOrExpr>(t);
      n->is_and = false;
      n->left = std::move(left);
      n->right = parse_and();
      left = std::move(n);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const Token t = next();
      auto n = node<AndOrExpr>(t);
      n->left = std::move(left);
      n->right = parse_not();
      left = std::move(n);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const Token t = next();
      auto n = node<UnaryExpr>(t);
      n->op = "not";
      n->operand = parse_not();
      return n;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token start = cur();
    ExprPtr first = parse_math1();
    std::unique_ptr<CompareExpr> cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
           cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
        op = next().value;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().type == Tok::Name && peek().value == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node<CompareExpr>(start);
        cmp->first = std::move(first);
      }
      cmp->rest.emplace_back(op, parse_math1());
    }
    if (cmp) return cmp;
    return first;
  }

  ExprPtr binary(const Token& t, std::string op, ExprPtr l, ExprPtr r) {
    auto n = node<BinaryExpr>(t);
    n->op = std::move(op);
    n->left = std::move(l);
    n->right = std::move(r);
    return n;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token t = next();
      left = binary(t, t.value, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const Token t = next();
      left = binary(t, "~", std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token t = next();
      left = binary(t, t.value, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Token t = next();
      left = binary(t, "**", std::move(left), parse_unary(true));
    }
    return left;
  }

  // Bounds recursion so that a pathological template is an error, not a stack overflow.
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting) p.fail_at(p.cur(), "template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    const Token t = cur();
    ExprPtr n;
    if (is_op("-") || is_op("+")) {
      next();
      auto u = node<UnaryExpr>(t);
      u->op = t.value;
      u->operand = parse_unary(false);
      n = std::move(u);
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filter_expr(std::move(n));
    return n;
  }

  ExprPtr parse_primary() {
    const Token t = cur();
    if (t.type == Tok::Name) {
      next();
      if (t.value == "true" || t.value == "True") return constant(t, Value::from_bool(true));
      if (t.value == "false" || t.value == "False") return constant(t, Value::from_bool(false));
      if (t.value == "none" || t.value == "None") return constant(t, Value::none());
      auto n = node<NameExpr>(t);
      n->name = t.value;
      return n;
    }
    if (t.type == Tok::String) {
      std::string s = next().value;
      while (cur().type == Tok::String) s += next().value;
      return constant(t, Value::from_string(std::move(s)));
    }
    if (t.type == Tok::Int) return next(), constant(t, Value::from_int(t.int_value));
    if (t.type == Tok::Float) return next(), constant(t, Value::from_float(t.float_value));
    if (is_op("(")) {
      next();
      if (skip_op(")")) {
        auto empty = node<ListExpr>(t);
        empty->tuple = true;
        return empty;
      }
      ExprPtr inner = parse_expression(true);
      if (is_op(",")) {
        auto list = node<ListExpr>(t);
        list->tuple = true;
        list->items.push_back(std::move(inner));
        while (skip_op(",")) {
          if (is_op(")")) break;
          list->items.push_back(parse_expression(true));
        }
        inner = std::move(list);
      }
      expect_op(")");
      return inner;
    }
    if (is_op("[")) {
      next();
      auto list = node<ListExpr>(t);
      while (!is_op("]")) {
        if (!list->items.empty()) expect_op(",");
        if (is_op("]")) break;
        list->items.push_back(parse_expression(true));
      }
      next();
      return list;
    }
    if (is_op("{")) {
      next();
      auto dict = node<DictExpr>(t);
      while (!is_op("}")) {
        if (!dict->items.empty()) expect_op(",");
        if (is_op("}")) break;
        ExprPtr key = parse_expression(true);
        expect_op(":");
        dict->items.emplace_back(std::move(key), parse_expression(true));
      }
      next();
      return dict;
    }
    fail_at(t, "unexpected " + describe(t));
  }

  ExprPtr constant(const Token& t, Value v) {
    auto n = node<ConstExpr>(t);
    n->value = std::move(v);
    return n;
  }

  ExprPtr parse_postfix(ExprPtr n) {
    while (true) {
      const Token t = cur();
      if (is_op(".")) {
        next();
        if (cur().type == Tok::Name) {
          auto a = node<AttrExpr>(t);
          a->object = std::move(n);
          a->name = next().value;
          n = std::move(a);
        } else if (cur().type == Tok::Int) {
          auto item = node<ItemExpr>(t);
          item->object = std::move(n);
          item->key = constant(cur(), Value::from_int(cur().int_value));
          next();
          n = std::move(item);
        } else {
          fail_at(cur(), "expected an attribute name after '.', got " + describe(cur()));
        }
      } else if (is_op("[")) {
        next();
        n = parse_subscript(t, std::move(n));
      } else if (is_op("(")) {
        n = parse_call(std::move(n));
      } else {
        return n;
      }
    }
  }

  ExprPtr parse_subscript(const Token& t, ExprPtr obj) {
    ExprPtr parts[3];
    int colons = 0;
    bool any = false;
    while (!is_op("]")) {
      if (is_op(":")) {
        if (++colons > 2) fail_at(cur(), "too many ':' in slice");
        next();
        continue;
      }
      if (parts[colons]) fail_at(cur(), "expected ']' or ':', got " + describe(cur()));
      parts[colons] = parse_expression(true);
      any = true;
    }
    next();
    if (colons == 0) {
      if (!any) fail_at(t, "empty subscript");
      auto item = node<ItemExpr>(t);
      item->object = std::move(obj);
      item->key = std::move(parts[0]);
      return item;
    }
    auto slice = node<SliceExpr>(t);
    slice->object = std::move(obj);
    slice->start = std::move(parts[0]);
    slice->stop = std::move(parts[1]);
    slice->step = std::move(parts[2]);
    return slice;
  }

  void parse_call_args(ArgExprs& args) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail_at(cur(), "*args and **kwargs are not supported");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().value == "=") {
        std::string key = next().value;
        next();
        args.keyword.emplace_back(key, parse_expression(true));
      } else {
        if (!args.keyword.empty()) fail_at(cur(), "positional argument follows keyword argument");
        args.positional.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    const Token t = cur();
    auto call = node<CallExpr>(t);
    call->callee = std::move(callee);
    parse_call_args(call->args);
    return call;
  }

  std::unique_ptr<FilterExpr> parse_filter_call(ExprPtr input) {
    const Token t = cur();
    std::string name = expect_name();
    while (is_op(".")) {
      next();
      name += "." + expect_name();
    }
    auto f = node<FilterExpr>(t);
    f->input = std::move(input);
    f->name = name;
    f->fn = find_filter(name);
    if (!f->fn) fail_at(t, "no filter named '" + name + "'");
    if (is_op("(")) parse_call_args(f->args);
    return f;
  }

  ExprPtr parse_filter_expr(ExprPtr n) {
    while (true) {
      if (is_op("|")) {
        next();
        n = parse_filter_call(std::move(n));
      } else if (is_name("is")) {
        n = parse_test(std::move(n));
      } else if (is_op("(")) {
        n = parse_call(std::move(n));
      } else {
        return n;
      }
    }
  }

  ExprPtr parse_test(ExprPtr input) {
    next();  // is
    auto test = std::make_unique<TestExpr>();
    if (skip_name("not")) test->negated = true;
    const Token t = cur();
    test->line = t.line;
    std::string name;
    if (cur().type == Tok::Name) {
      name = next().value;
    } else if (cur().type == Tok::Op &&
               (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
                cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
      name = next().value;
    } else {
      fail_at(t, "expected a test name after 'is', got " + describe(t));
    }
    test->name = name;
    test->fn = find_test(name);
    if (!test->fn) fail_at(t, "no test named '" + name + "'");
    test->input = std::move(input);
    if (is_op("(")) {
      parse_call_args(test->args);
    } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                cur().type == Tok::Float || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail_at(cur(), "you cannot chain multiple tests with 'is'");
      test->args.positional.push_back(parse_postfix(parse_primary()));
    }
    return test;
  }

  std::vector<Token> tokens_;
  const std::string& name_;
  std::size_t pos_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

// ---- globals -------------------------------------------------------------------------

Value global_range(CallArgs& args) {
  args.check("range", 3, {});
  for (const auto& a : args.positional)
    if (!is_int_like(a))
      fault(std::string("'") + type_name(a) + "' object cannot be interpreted as an integer");
  std::int64_t start = 0, stop = 0, step = 1;
  if (args.positional.size() == 1) {
    stop = as_int(args.positional[0]);
  } else if (args.positional.size() >= 2) {
    start = as_int(args.positional[0]);
    stop = as_int(args.positional[1]);
    if (args.positional.size() == 3) step = as_int(args.positional[2]);
  } else {
    fault("range expected at least 1 argument, got 0");
  }
  if (step == 0) fault("range() arg 3 must not be zero");
  // As jinja2's sandbox (which transformers uses): at most 100000 items.
  constexpr std::size_t kMaxRange = 100'000;
  ValueList out;
  for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= kMaxRange)
      fault("range too big: the sandbox blocks ranges larger than 100000 items");
    out.push_back(Value::from_int(i));
    if ((step > 0 && i > std::numeric_limits<std::int64_t>::max() - step) ||
        (step < 0 && i < std::numeric_limits<std::int64_t>::min() - step))
      break;
  }
  return Value::from_list(std::move(out));
}

Value dict_from_args(CallArgs& args, Value result) {
  if (args.positional.size() > 1) fault("expected at most 1 positional argument");
  if (!args.positional.empty()) {
    const Value& src = args.positional[0];
    if (src.kind == Kind::Dict || src.kind == Kind::Namespace) {
      for (const auto& [k, v] : src.dict->items) result.dict->set(k, v);
    } else {
      for (const auto& pair : iterate(src)) {
        ValueList kv = iterate(pair);
        if (kv.size() != 2) fault("dictionary update sequence element has the wrong length");
        result.dict->set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : args.keyword) result.dict->set(Value::from_string(k), v);
  return result;
}

Value global_strftime_now(CallArgs& args) {
  args.check("strftime_now", 1, {"format"});
  Value fmt = args.get_or(0, "format", Value::undefined());
  if (fmt.kind != Kind::String) fault("strftime_now() needs a format string");
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::string buf(256 + fmt.text.size() * 8, '\0');
  std::size_t n = std::strftime(buf.data(), buf.size(), fmt.text.c_str(), &local);
  buf.resize(n);
  return Value::from_string(buf);
}

std::shared_ptr<Scope> make_globals() {
  auto g = std::make_shared<Scope>();
  g->vars["range"] = Value::function("range", global_range);
  g->vars["namespace"] = Value::function("namespace", [](CallArgs& args) {
    Value ns = dict_from_args(args, Value::new_namespace());
    for (const auto& [k, v] : ns.dict->items)
      if (k.kind == Kind::String && !k.text.empty() && k.text[0] == '_')
        fault("chat templates cannot store underscore-prefixed attributes on a namespace");
    return ns;
  });
  g->vars["dict"] = Value::function(
      "dict", [](CallArgs& args) { return dict_from_args(args, Value::new_dict()); });
  g->vars["raise_exception"] = Value::function("raise_exception", [](CallArgs& args) -> Value {
    Value msg = args.get_or(0, "message", Value::from_string(""));
    throw RuntimeFault{to_str(msg), true};
  });
  g->vars["strftime_now"] = Value::function("strftime_now", global_strftime_now);
  return g;
}

}  // namespace

void render_body(const Body& body, Context& ctx, std::string& out) {
  for (const auto& stmt : body) {
    ctx.line = stmt->line;
    stmt->render(ctx, out);
    if (ctx.flow != Flow::Normal) return;
  }
}

Template Template::parse(const std::string& source, const std::string& source_name) {
  auto root = std::make_shared<TemplateNode>();
  root->name = source_name;
  Parser parser(lex(source, source_name), root->name);
  root->body = parser.parse_template();
  Template t;
  t.root_ = std::move(root);
  return t;
}

const std::string& Template::source_name() const {
  return root_->name;
}

std::string Template::render(const nlohmann::ordered_json& context) const {
  Context ctx;
  // Breaks the macro/scope reference cycles, however the render ends.
  struct ClosureReleaser {
    Context& ctx;
    ~ClosureReleaser() {
      for (const auto& scope : ctx.closures) scope->vars.clear();
    }
  } release_closures{ctx};
  auto globals = make_globals();
  auto vars = std::make_shared<Scope>(Scope{{}, globals});
  if (!context.is_null() && !context.is_object())
    throw_invalid("render context for " + root_->name + " must be a JSON object");
  ctx.scope = vars;
  std::string out;
  try {
    if (context.is_object())
      for (const auto& [k, v] : context.items()) vars->vars[k] = Value::from_json(v);
    render_body(root_->body, ctx, out);
  } catch (const RuntimeFault& f) {
    if (f.from_raise_exception)
      throw_invalid(root_->name + ":" + std::to_string(ctx.line) +
                        ": the chat template raised an exception: " + f.message,
                    "the conversation does not fit what this chat template accepts");
    throw_invalid(root_->name + ":" + std::to_string(ctx.line) +
                      ": error while rendering the template: " + f.message,
                  "check the messages and variables the template expects");
  }
  return out;
}

}  // namespace tessera::hf::jinja
