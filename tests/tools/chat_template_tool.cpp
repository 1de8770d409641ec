// Test-only: renders a chat template the way tessera does, for the parity suite.
//   tessera-chat-tool CONFIG MESSAGES_JSON [--add-generation-prompt] [--vars VARS_JSON]
//     CONFIG is a tokenizer_config.json or a model folder; prints the rendered chat.
//   tessera-chat-tool --raw TEMPLATE_FILE CONTEXT_JSON
//     renders a bare Jinja template with the variables of CONTEXT_JSON.
//   tessera-chat-tool --name TEMPLATE_FILE
//     prints chat_template_name() of the template.
// Errors go to stderr with exit code 2 (bad input) or 1.
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "hf/chat/chat_template.h"

namespace {

nlohmann::ordered_json read_json(const std::string& path) {
  std::string text = tessera::core::read_text_file(path);
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    tessera::throw_invalid(path + ": not valid JSON (" + e.what() + ")");
  }
}

int run(const std::vector<std::string>& args) {
  using namespace tessera;
  if (args.size() == 2 && args[0] == "--name") {
    std::cout << hf::chat_template_name(core::read_text_file(args[1])) << "\n";
    return 0;
  }
  if (args.size() == 3 && args[0] == "--raw") {
    auto tmpl = hf::ChatTemplate::parse(core::read_text_file(args[1]), args[1]);
    std::cout << tmpl.render_ordered(read_json(args[2]));
    return 0;
  }
  std::vector<std::string> positional;
  bool add_generation_prompt = false;
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--add-generation-prompt") {
      add_generation_prompt = true;
    } else if (args[i] == "--vars" && i + 1 < args.size()) {
      vars = read_json(args[++i]);
    } else {
      positional.push_back(args[i]);
    }
  }
  if (positional.size() != 2) {
    std::cerr << "usage: tessera-chat-tool CONFIG MESSAGES_JSON [--add-generation-prompt] "
                 "[--vars VARS_JSON] | --raw TEMPLATE CONTEXT_JSON | --name TEMPLATE\n";
    return 2;
  }
  std::filesystem::path config_path = positional[0];
  hf::TokenizerConfig config = std::filesystem::is_directory(config_path)
                                   ? hf::load_tokenizer_config_from_folder(config_path)
                                   : hf::load_tokenizer_config(config_path);
  if (!config.chat_template)
    throw_invalid(config_path.string() + ": no chat_template", "set one in tokenizer_config.json");
  auto tmpl = hf::ChatTemplate::parse(*config.chat_template, config_path.string());
  std::cout << tmpl.render(read_json(positional[1]), add_generation_prompt, config, vars);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return run(args);
  } catch (const tessera::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    if (!e.hint().empty()) std::cerr << "hint: " << e.hint() << "\n";
    auto kind = e.kind();
    return (kind == tessera::ErrorKind::Io || kind == tessera::ErrorKind::Internal) ? 1 : 2;
  }
}
