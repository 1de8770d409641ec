#pragma once
// An interpreter for the subset of Jinja2 that chat templates use, configured the way
// transformers configures its environment (trim_blocks, lstrip_blocks, loop controls, the
// `generation` tag, no autoescape). Anything outside the subset is an error that names
// the template, line and column, never a silent mis-render.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace tessera::hf::jinja {

struct TemplateNode;  // the parsed tree (internal)

class Template {
 public:
  // Throws tessera::Error (InvalidInput) naming `source_name`, line and column on a syntax
  // error, and on unknown statements, filters and tests.
  static Template parse(const std::string& source, const std::string& source_name);

  // Renders with `context` as the template's variables. The globals transformers provides
  // (range, namespace, dict, raise_exception, strftime_now) are always available.
  // Throws tessera::Error: raise_exception(...) and runtime faults (undefined attribute
  // of an undefined value, type errors) name the template and line.
  std::string render(const nlohmann::ordered_json& context) const;

  const std::string& source_name() const;

 private:
  std::shared_ptr<const TemplateNode> root_;
};

}  // namespace tessera::hf::jinja
