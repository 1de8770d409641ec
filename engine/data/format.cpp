// Format detection, column mapping and row -> TokenizedExample (see format.h for layouts).
#include "data/format.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>

#include "core/error.h"
#include "core/text.h"

namespace tessera::data {

namespace {

using Json = nlohmann::ordered_json;

std::string join_columns(const std::vector<std::string>& columns) {
  std::string out;
  for (const auto& c : columns) out += (out.empty() ? "'" : ", '") + c + "'";
  return out.empty() ? "none" : out;
}

// The first column whose lower-cased name is one of `aliases` (in alias order).
std::optional<std::string> find_column(const std::vector<std::string>& columns,
                                       std::initializer_list<const char*> aliases) {
  for (const char* alias : aliases)
    for (const auto& c : columns)
      if (core::ascii_lower(c) == alias) return c;
  return std::nullopt;
}

}  // namespace

std::map<std::string, std::string> roles_by_name(FormatKind kind,
                                                 const std::vector<std::string>& columns) {
  std::map<std::string, std::string> roles;
  auto put = [&](const char* role, std::optional<std::string> column) {
    if (column) roles[role] = *column;
  };
  switch (kind) {
    case FormatKind::Chat:
      put("messages", find_column(columns, {"messages", "conversations", "conversation", "chat",
                                            "dialog", "dialogue"}));
      break;
    case FormatKind::Instruction:
      if (auto instruction = find_column(columns, {"instruction"})) {
        roles["instruction"] = *instruction;
        put("input", find_column(columns, {"input", "context"}));
        put("output", find_column(columns, {"output", "response", "answer"}));
      } else {
        put("prompt", find_column(columns, {"prompt", "question", "query"}));
        put("completion", find_column(columns, {"completion", "response", "answer"}));
      }
      break;
    case FormatKind::Classification:
      put("text", find_column(columns, {"text", "sentence", "content"}));
      put("label", find_column(columns, {"label", "labels"}));
      break;
    case FormatKind::Text:
      put("text", find_column(columns, {"text", "content", "document"}));
      if (!roles.count("text") && columns.size() == 1) roles["text"] = columns.front();
      break;
    case FormatKind::Preference:
      put("prompt", find_column(columns, {"prompt", "question", "query", "instruction"}));
      put("chosen", find_column(columns, {"chosen"}));
      put("rejected", find_column(columns, {"rejected"}));
      break;
    case FormatKind::Unpaired:
      put("prompt", find_column(columns, {"prompt", "question", "query", "instruction"}));
      put("completion", find_column(columns, {"completion", "response", "answer"}));
      put("label", find_column(columns, {"label", "desirable"}));
      break;
  }
  return roles;
}

std::vector<std::string> missing_roles(const DatasetFormat& f) {
  std::vector<std::string> missing;
  auto need = [&](const char* role) {
    if (!f.columns.count(role)) missing.push_back(role);
  };
  switch (f.kind) {
    case FormatKind::Chat:
      need("messages");
      break;
    case FormatKind::Instruction:
      if (f.columns.count("prompt") || f.columns.count("completion")) {
        need("prompt");
        need("completion");
      } else {
        need("instruction");
        need("output");
      }
      break;
    case FormatKind::Classification:
      need("text");
      need("label");
      break;
    case FormatKind::Text:
      need("text");
      break;
    case FormatKind::Preference:  // no prompt: the common start of chosen and rejected
      need("chosen");
      need("rejected");
      break;
    case FormatKind::Unpaired:
      need("prompt");
      need("completion");
      need("label");
      break;
  }
  return missing;
}

namespace {

const char* kMappingHint =
    "name the format and map its columns: dataset.format and dataset.columns in the job spec, "
    "e.g. \"format\": \"instruction\", \"columns\": {\"instruction\": \"question\", "
    "\"output\": \"answer\"} (tessera-cli finetune: --format instruction --column "
    "instruction=question --column output=answer)";

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// An integer written as a JSON number or as decimal digits in a string ("3", "-1").
std::optional<std::int64_t> integer_value(const Json& v) {
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    std::int64_t out = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec == std::errc() && ptr == s.data() + s.size() && !s.empty()) return out;
  }
  return std::nullopt;
}

}  // namespace

const char* format_kind_name(FormatKind kind) {
  switch (kind) {
    case FormatKind::Text:
      return "text";
    case FormatKind::Instruction:
      return "instruction";
    case FormatKind::Chat:
      return "chat";
    case FormatKind::Classification:
      return "classification";
    case FormatKind::Preference:
      return "preference";
    case FormatKind::Unpaired:
      return "unpaired";
  }
  return "?";
}

FormatKind parse_format_kind(const std::string& name) {
  const std::string n = core::ascii_lower(name);
  if (n == "text") return FormatKind::Text;
  if (n == "instruction") return FormatKind::Instruction;
  if (n == "chat") return FormatKind::Chat;
  if (n == "classification") return FormatKind::Classification;
  if (n == "preference") return FormatKind::Preference;
  if (n == "unpaired") return FormatKind::Unpaired;
  throw_invalid("unknown dataset format '" + name + "'",
                "use text, instruction, chat, classification, preference or unpaired");
}

std::string DatasetFormat::describe() const {
  std::string out = format_kind_name(kind);
  out += " (";
  bool first = true;
  for (const auto& [role, column] : columns) {
    out += (first ? "" : ", ") + role + "='" + column + "'";
    first = false;
  }
  return out + ")";
}

std::optional<std::pair<std::string, std::string>> first_missing_column(
    const DatasetFormat& format, const std::vector<std::string>& columns) {
  for (const auto& [role, column] : format.columns) {
    if (std::find(columns.begin(), columns.end(), column) != columns.end()) continue;
    DatasetFormat without = format;
    without.columns.erase(role);
    if (!missing_roles(without).empty()) return std::pair{role, column};
  }
  return std::nullopt;
}

DatasetFormat detect_format(const std::vector<std::string>& columns, const std::string& source) {
  for (FormatKind kind : {FormatKind::Preference, FormatKind::Unpaired, FormatKind::Chat,
                          FormatKind::Instruction, FormatKind::Classification, FormatKind::Text}) {
    DatasetFormat f{kind, roles_by_name(kind, columns)};
    if (missing_roles(f).empty()) return f;
  }
  throw_invalid(
      source + ": cannot tell the dataset format from its columns (" + join_columns(columns) + ")",
      std::string("expected messages (chat), instruction+output or prompt+completion "
                  "(instruction), text+label (classification), prompt+chosen+rejected "
                  "(preference), prompt+completion+label (unpaired) or text; otherwise ") +
          kMappingHint);
}

DatasetFormat resolve_format(const std::vector<std::string>& columns, const std::string& source,
                             std::optional<FormatKind> kind,
                             const std::map<std::string, std::string>& overrides) {
  if (!kind && overrides.empty()) return detect_format(columns, source);
  if (!kind) {
    // The columns as the overrides name them, detected as a file with those names would be:
    // {"text": "sentence"} beside a label column is classification, alone it is text.
    std::vector<std::string> renamed = columns;
    for (std::string& column : renamed)
      for (const auto& [role, mapped] : overrides)
        if (column == mapped) column = role;
    try {
      kind = detect_format(renamed, source).kind;
    } catch (const Error&) {
    }
  }
  if (!kind) {  // else the roles named say which format is meant
    auto has = [&](const char* role) { return overrides.count(role) > 0; };
    if (has("chosen") || has("rejected"))
      kind = FormatKind::Preference;
    else if (has("completion") && has("label"))
      kind = FormatKind::Unpaired;
    else if (has("messages"))
      kind = FormatKind::Chat;
    else if (has("instruction") || has("output") || has("prompt") || has("completion") ||
             has("input"))
      kind = FormatKind::Instruction;
    else if (has("label"))
      kind = FormatKind::Classification;
    else if (has("text"))
      kind = FormatKind::Text;
    else
      kind = detect_format(columns, source).kind;
  }
  DatasetFormat f{*kind, roles_by_name(*kind, columns)};
  static const std::map<FormatKind, std::set<std::string>> known_roles = {
      {FormatKind::Text, {"text"}},
      {FormatKind::Instruction, {"instruction", "input", "output", "prompt", "completion"}},
      {FormatKind::Chat, {"messages"}},
      {FormatKind::Classification, {"text", "label"}},
      {FormatKind::Preference, {"prompt", "chosen", "rejected"}},
      {FormatKind::Unpaired, {"prompt", "completion", "label"}}};
  const bool wants_prompt = overrides.count("prompt") || overrides.count("completion");
  const bool wants_instruction = overrides.count("instruction") || overrides.count("output");
  if (*kind == FormatKind::Instruction && wants_prompt && !wants_instruction) {
    f.columns.erase("instruction");
    f.columns.erase("input");
    f.columns.erase("output");
  } else if (*kind == FormatKind::Instruction && wants_instruction) {
    f.columns.erase("prompt");
    f.columns.erase("completion");
  }
  for (const auto& [role, column] : overrides) {
    if (!known_roles.at(*kind).count(role))
      throw_invalid("column mapping: '" + role + "' is not a role of the " +
                        format_kind_name(*kind) + " format",
                    *kind == FormatKind::Instruction
                        ? "roles: instruction, input, output (or prompt, completion)"
                        : "see the format's roles in the documentation");
    if (std::find(columns.begin(), columns.end(), column) == columns.end())
      throw_invalid(source + ": column '" + column + "' (mapped to " + role +
                        ") does not exist; columns: " + join_columns(columns),
                    "check the column name (case matters)");
    f.columns[role] = column;
  }
  if (auto missing = missing_roles(f); !missing.empty())
    throw_invalid(source + ": the " + std::string(format_kind_name(*kind)) +
                      " format needs a column for '" + missing.front() +
                      "', and none was found among " + join_columns(columns),
                  kMappingHint);
  return f;
}

std::string LabelSet::describe() const {
  if (integer && names.empty()) return "integer class ids";
  std::string out = std::to_string(names.size()) + " labels: ";
  for (std::size_t i = 0; i < names.size(); ++i)
    out += (i ? ", " : "") + std::to_string(i) + "=" + names[i];
  return out;
}

LabelSet derive_labels(const DatasetReader& reader, const std::string& column,
                       const std::vector<std::string>& id2label) {
  std::set<std::string> strings;
  bool all_integers = true;
  for (std::size_t i = 0; i < reader.num_rows(); ++i) {
    const Row row = reader.row(i);
    auto it = row.find(column);
    if (it == row.end() || it->is_null())
      throw_invalid(reader.row_location(i) + ": the label column '" + column + "' is missing",
                    "give every row a label");
    if (!it->is_string() && !it->is_number_integer())
      throw_invalid(reader.row_location(i) + ": label '" + column + "' is a " + it->type_name() +
                    "; expected a class name or an integer id");
    const auto as_int = integer_value(*it);
    if (as_int && *as_int < 0)
      throw_invalid(reader.row_location(i) + ": label " + std::to_string(*as_int) +
                    " is negative; class ids start at 0");
    if (!as_int) all_integers = false;
    strings.insert(value_to_text(*it));
  }
  LabelSet set;
  if (!id2label.empty()) {
    set.names = id2label;
    set.integer = all_integers;
    if (!all_integers)
      for (const auto& s : strings)
        if (std::find(id2label.begin(), id2label.end(), s) == id2label.end())
          throw_invalid(reader.path().string() + ": label '" + s +
                            "' is not one of the model's labels (" + join_columns(id2label) + ")",
                        "map the labels to the model's id2label names, or use integer ids");
    return set;
  }
  set.integer = all_integers;
  if (!all_integers) set.names.assign(strings.begin(), strings.end());
  return set;
}

nlohmann::ordered_json normalize_messages(const nlohmann::ordered_json& value,
                                          const std::string& location) {
  const char* hint = "write messages as [{\"role\": \"user\", \"content\": \"...\"}, ...]";
  if (value.is_string()) {
    // Some exports store the list as a JSON string.
    try {
      return normalize_messages(Json::parse(value.get<std::string>()), location);
    } catch (const nlohmann::json::exception&) {  // a syntax error, or a number beyond a double
      throw_invalid(location + ": messages is a string, not a list of messages", hint);
    }
  }
  if (!value.is_array() || value.empty())
    throw_invalid(location + ": messages must be a non-empty list, found " +
                      (value.is_array() ? std::string("an empty list") : value.type_name()),
                  hint);
  Json out = Json::array();
  for (std::size_t i = 0; i < value.size(); ++i) {
    const Json& m = value[i];
    const std::string where = location + ": message " + std::to_string(i + 1);
    if (!m.is_object()) throw_invalid(where + " is a " + m.type_name() + ", not an object", hint);
    const Json* role = m.contains("role") ? &m["role"] : m.contains("from") ? &m["from"] : nullptr;
    const Json* content = m.contains("content") ? &m["content"]
                          : m.contains("value") ? &m["value"]
                                                : nullptr;
    if (!role || !role->is_string()) throw_invalid(where + " has no 'role' text", hint);
    if (!content) throw_invalid(where + " has no 'content'", hint);
    std::string r = core::ascii_lower(role->get<std::string>());
    if (r == "human") r = "user";
    if (r == "gpt" || r == "bot") r = "assistant";
    Json msg = Json::object();
    msg["role"] = r;
    msg["content"] = *content;
    for (auto it = m.begin(); it != m.end(); ++it)
      if (it.key() != "role" && it.key() != "content" && it.key() != "from" && it.key() != "value")
        msg[it.key()] = it.value();
    out.push_back(std::move(msg));
  }
  return out;
}

// ---------------------------------------------------------------- ExampleBuilder

ExampleBuilder::ExampleBuilder(DatasetFormat format, const hf::Tokenizer& tokenizer,
                               hf::TokenizerConfig config, TokenizeOptions options, LabelSet labels)
    : format_(std::move(format)),
      tokenizer_(&tokenizer),
      config_(std::move(config)),
      options_(options),
      labels_(std::move(labels)) {
  // What the post-processor adds around a text: the part before it is the BOS prefix
  // (<s> for Llama, [CLS] for BERT, nothing for GPT-2); the part after is the EOS fallback.
  const auto plain = tokenizer.encode("a", false);
  const auto with = tokenizer.encode("a", true);
  std::vector<std::int32_t> suffix;
  if (!plain.empty()) {
    auto at = std::search(with.begin(), with.end(), plain.begin(), plain.end());
    if (at != with.end()) {
      bos_prefix_.assign(with.begin(), at);
      suffix.assign(at + static_cast<std::ptrdiff_t>(plain.size()), with.end());
    }
  }
  if (config_.eos_token) eos_id_ = tokenizer.token_to_id(*config_.eos_token);
  if (!eos_id_ && suffix.size() == 1) eos_id_ = suffix.front();
  if (config_.chat_template)
    template_ = hf::ChatTemplate::parse(*config_.chat_template, "chat_template");
  if (format_.kind == FormatKind::Chat && !template_)
    throw_invalid("the chat format needs the model's chat template, and its tokenizer has none",
                  "use a model whose tokenizer_config.json (or chat_template.jinja) has a "
                  "chat_template, or the instruction format");
  if (packs() && options_.max_length < 2)
    throw_invalid("packing needs a block size (max_length) of at least 2 tokens");
}

bool ExampleBuilder::packs() const {
  return format_.kind == FormatKind::Text && options_.pack && options_.max_length > 0;
}

bool ExampleBuilder::uses_chat_template() const {
  return format_.kind == FormatKind::Chat ||
         (format_.kind == FormatKind::Instruction && options_.use_chat_template && template_);
}

std::vector<std::int32_t> ExampleBuilder::encode(const std::string& text) const {
  return tokenizer_->encode(text, false);
}

void ExampleBuilder::truncate(TokenizedExample& ex) const {
  if (options_.max_length == 0 || ex.input_ids.size() <= options_.max_length) return;
  ex.input_ids.resize(options_.max_length);
  if (!ex.labels.empty()) ex.labels.resize(options_.max_length);
}

TokenizedExample ExampleBuilder::causal(std::vector<std::int32_t> prompt,
                                        std::vector<std::int32_t> response,
                                        const std::string& location) const {
  TokenizedExample ex;
  ex.input_ids = std::move(prompt);
  ex.labels.assign(ex.input_ids.size(), kIgnoreIndex);
  ex.input_ids.insert(ex.input_ids.end(), response.begin(), response.end());
  ex.labels.insert(ex.labels.end(), response.begin(), response.end());
  truncate(ex);
  if (std::all_of(ex.labels.begin(), ex.labels.end(), [](auto l) { return l == kIgnoreIndex; }))
    throw_invalid(location + ": no response token is left within max_length " +
                      std::to_string(options_.max_length) + " (the prompt takes it all)",
                  "raise max_length, shorten the prompt, or skip such rows");
  return ex;
}

std::string ExampleBuilder::render(const Json& messages, bool add_generation_prompt,
                                   const std::string& location) const {
  try {
    return template_->render(messages, add_generation_prompt, config_, Json());
  } catch (const Error& e) {
    throw Error(e.kind(), location + ": " + e.what(), e.hint());
  }
}

TokenizedExample ExampleBuilder::build_chat(const nlohmann::ordered_json& messages,
                                            const std::string& location) const {
  if (!template_)
    throw_invalid(location + ": the chat format needs a chat template, and there is none");
  const std::string full = render(messages, false, location);
  std::vector<std::pair<std::string, bool>> pieces;  // text, learned
  std::size_t pos = 0;
  for (std::size_t k = 0; k < messages.size(); ++k) {
    if (messages[k].value("role", "") != "assistant") continue;
    Json before = Json::array(), through = Json::array();
    for (std::size_t i = 0; i < k; ++i) before.push_back(messages[i]);
    through = before;
    through.push_back(messages[k]);
    const std::string prompt = render(before, true, location);
    const std::string turn = render(through, false, location);
    if (!starts_with(turn, prompt) || !starts_with(full, turn) || prompt.size() < pos)
      throw_invalid(location + ": the chat template does not render assistant message " +
                        std::to_string(k + 1) +
                        " as a continuation of the conversation before it, so its tokens "
                        "cannot be located",
                    "use a template that renders a conversation prefix by prefix (most do), or "
                    "the instruction format");
    pieces.emplace_back(full.substr(pos, prompt.size() - pos), false);
    pieces.emplace_back(turn.substr(prompt.size()), true);
    pos = turn.size();
  }
  if (pieces.empty())
    throw_invalid(location + ": the conversation has no assistant message, so nothing to learn",
                  "add an assistant reply, or skip such rows");
  pieces.emplace_back(full.substr(pos), false);
  TokenizedExample ex;
  for (const auto& [text, learned] : pieces) {
    if (text.empty()) continue;
    const auto ids = encode(text);
    ex.input_ids.insert(ex.input_ids.end(), ids.begin(), ids.end());
    if (learned)
      ex.labels.insert(ex.labels.end(), ids.begin(), ids.end());
    else
      ex.labels.insert(ex.labels.end(), ids.size(), kIgnoreIndex);
  }
  truncate(ex);
  if (std::all_of(ex.labels.begin(), ex.labels.end(), [](auto l) { return l == kIgnoreIndex; }))
    throw_invalid(location + ": no assistant token is left within max_length " +
                      std::to_string(options_.max_length),
                  "raise max_length, or skip such rows");
  return ex;
}

TokenizedExample ExampleBuilder::build(const Row& row, const std::string& location) const {
  auto value_of = [&](const char* role, bool required) -> const Json* {
    auto col = format_.columns.find(role);
    if (col == format_.columns.end()) return nullptr;
    auto it = row.find(col->second);
    if (it == row.end() || it->is_null()) {
      if (!required) return nullptr;
      throw_invalid(location + ": column '" + col->second + "' (" + role + ") is missing",
                    "give every row this column, or skip such rows");
    }
    return &*it;
  };
  auto text_of = [&](const char* role, bool required) -> std::string {
    const Json* v = value_of(role, required);
    if (!v) return {};
    if (!v->is_string())
      throw_invalid(location + ": column '" + format_.columns.at(role) + "' (" + role + ") is a " +
                        v->type_name() + "; expected text",
                    "check the column mapping");
    return v->get<std::string>();
  };
  auto with_eos = [&](std::vector<std::int32_t> ids) {
    if (eos_id_) ids.push_back(*eos_id_);
    return ids;
  };
  auto with_bos = [&](const std::vector<std::int32_t>& ids) {
    std::vector<std::int32_t> out = bos_prefix_;
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  };

  switch (format_.kind) {
    case FormatKind::Text: {
      TokenizedExample ex;
      ex.input_ids = with_eos(with_bos(encode(text_of("text", true))));
      ex.labels = ex.input_ids;
      if (!packs()) truncate(ex);
      return ex;
    }
    case FormatKind::Instruction: {
      const bool prompt_style = format_.columns.count("prompt") > 0;
      std::string prompt, response;
      if (prompt_style) {
        prompt = text_of("prompt", true);
        response = text_of("completion", true);
      } else {
        prompt = text_of("instruction", true);
        response = text_of("output", true);
      }
      const std::string input = prompt_style ? std::string() : text_of("input", false);
      if (uses_chat_template()) {
        Json messages = Json::array();
        messages.push_back(
            {{"role", "user"}, {"content", input.empty() ? prompt : prompt + "\n\n" + input}});
        messages.push_back({{"role", "assistant"}, {"content", response}});
        return build_chat(messages, location);
      }
      if (!prompt_style) {
        std::string layout = "### Instruction:\n" + prompt + "\n\n";
        if (!input.empty()) layout += "### Input:\n" + input + "\n\n";
        prompt = layout + "### Response:\n";
      }
      return causal(with_bos(encode(prompt)), with_eos(encode(response)), location);
    }
    case FormatKind::Chat:
      return build_chat(normalize_messages(*value_of("messages", true), location), location);
    case FormatKind::Preference:
      return build_pair(row, location);
    case FormatKind::Unpaired:
      return build_unpaired(row, location);
    case FormatKind::Classification: {
      TokenizedExample ex;
      ex.input_ids = tokenizer_->encode(text_of("text", true), true);
      truncate(ex);
      const Json& v = *value_of("label", true);
      const auto as_int = integer_value(v);
      if (labels_.integer) {
        if (!as_int || *as_int < 0)
          throw_invalid(location + ": label " + value_to_text(v) + " is not a class id (0, 1, …)",
                        "use integer ids, or class names throughout");
        if (!labels_.names.empty() && static_cast<std::uint64_t>(*as_int) >= labels_.names.size())
          throw_invalid(location + ": label " + std::to_string(*as_int) + " is out of range; " +
                        labels_.describe());
        ex.label = *as_int;
      } else {
        const std::string name = value_to_text(v);
        auto it = std::find(labels_.names.begin(), labels_.names.end(), name);
        if (it == labels_.names.end())
          throw_invalid(location + ": label '" + name + "' is not in the label list (" +
                            labels_.describe() + ")",
                        "derive the labels from this dataset (derive_labels)");
        ex.label = it - labels_.names.begin();
      }
      return ex;
    }
  }
  throw_invalid(location + ": unknown format");
}

namespace {

// A preference row without a prompt column (HH-RLHF's layout): its prompt is the common start of
// chosen and rejected, taken as TRL 1.x's extract_prompt takes it — text compared by code point
// (Python's string indices), message lists by message; where they part, a space just before
// stays with the completions; when one is the start of the other, the last shared item goes to
// the completions (TRL's loop ends one short); Python's negative index included.
struct ImplicitPrompt {
  Json prompt, chosen, rejected;
};

// The byte offset where each code point of UTF-8 `text` starts, and its size at the end.
std::vector<std::size_t> code_point_starts(const std::string& text) {
  std::vector<std::size_t> starts;
  for (std::size_t i = 0; i < text.size(); ++i)
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) starts.push_back(i);
  starts.push_back(text.size());
  return starts;
}

ImplicitPrompt extract_prompt(const Json& chosen, const Json& rejected,
                              const std::string& location) {
  const bool text = chosen.is_string() && rejected.is_string();
  if (!text && !(chosen.is_array() && rejected.is_array()))
    throw_invalid(location +
                      ": chosen and rejected are not both text or both message lists, so "
                      "no prompt can be taken from their common start",
                  "write both as text or both as messages, or add a prompt column");
  // Items (code points, or messages) of each, and Python's x[:i] / x[i:] over them.
  std::vector<std::size_t> chosen_at, rejected_at;
  std::size_t chosen_items = 0, rejected_items = 0;
  if (text) {
    chosen_at = code_point_starts(chosen.get_ref<const std::string&>());
    rejected_at = code_point_starts(rejected.get_ref<const std::string&>());
    chosen_items = chosen_at.size() - 1;
    rejected_items = rejected_at.size() - 1;
  } else {
    chosen_items = chosen.size();
    rejected_items = rejected.size();
  }
  const auto item = [&](const Json& v, const std::vector<std::size_t>& at, std::int64_t i) {
    if (!text) return v.at(static_cast<std::size_t>(i));
    const auto& s = v.get_ref<const std::string&>();
    return Json(s.substr(at[static_cast<std::size_t>(i)],
                         at[static_cast<std::size_t>(i) + 1] - at[static_cast<std::size_t>(i)]));
  };
  const std::size_t shared = std::min(chosen_items, rejected_items);
  if (shared == 0)
    throw_invalid(location +
                      ": chosen or rejected is empty, so no prompt can be taken from their "
                      "common start",
                  "give every pair both completions, or add a prompt column");
  auto idx = static_cast<std::int64_t>(shared) - 1;  // no difference: where TRL's loop ends
  for (std::size_t i = 0; i < shared; ++i) {
    if (item(chosen, chosen_at, static_cast<std::int64_t>(i)) ==
        item(rejected, rejected_at, static_cast<std::int64_t>(i)))
      continue;
    idx = static_cast<std::int64_t>(i);
    const std::int64_t before = idx > 0 ? idx - 1 : static_cast<std::int64_t>(chosen_items) - 1;
    if (text && item(chosen, chosen_at, before) == Json(" ")) --idx;
    break;
  }
  // Python's slices: a negative index counts from each sequence's own end.
  const auto slice = [&](const Json& v, const std::vector<std::size_t>& at, std::size_t items,
                         std::int64_t from, bool head) {
    const auto cut = static_cast<std::size_t>(
        std::clamp<std::int64_t>(from < 0 ? from + static_cast<std::int64_t>(items) : from, 0,
                                 static_cast<std::int64_t>(items)));
    if (text) {
      const auto& s = v.get_ref<const std::string&>();
      return Json(head ? s.substr(0, at[cut]) : s.substr(at[cut]));
    }
    Json out = Json::array();
    for (std::size_t i = head ? 0 : cut; i < (head ? cut : items); ++i) out.push_back(v.at(i));
    return out;
  };
  return {slice(chosen, chosen_at, chosen_items, idx, true),
          slice(chosen, chosen_at, chosen_items, idx, false),
          slice(rejected, rejected_at, rejected_items, idx, false)};
}

}  // namespace

ExampleBuilder::PromptAndCompletions ExampleBuilder::prompt_and_completions(
    const Row& row, const std::string& location, const std::vector<const char*>& roles) const {
  auto value_of = [&](const char* role) -> const Json& {
    const std::string& column = format_.columns.at(role);
    auto it = row.find(column);
    if (it == row.end() || it->is_null())
      throw_invalid(location + ": column '" + column + "' (" + role + ") is missing",
                    "give every row its prompt and completion columns, or skip such rows");
    return *it;
  };
  // The prompt and each completion: the row's columns, or for pairs without a prompt column
  // their common start and the rest of each (TRL's extract_prompt).
  const bool implicit = !format_.columns.count("prompt");
  Json prompt;
  std::vector<Json> completions;
  if (implicit) {
    if (format_.kind != FormatKind::Preference || roles.size() != 2)
      throw Error(ErrorKind::Internal, "an implicit prompt outside preference pairs");
    ImplicitPrompt parts = extract_prompt(value_of(roles[0]), value_of(roles[1]), location);
    prompt = std::move(parts.prompt);
    completions = {std::move(parts.chosen), std::move(parts.rejected)};
  } else {
    prompt = value_of("prompt");
    for (const char* role : roles) completions.push_back(value_of(role));
  }
  const auto column_of = [&](const char* role) {
    return format_.columns.count(role) ? "column '" + format_.columns.at(role) + "'"
                                       : std::string("the common start of chosen and rejected");
  };
  bool chat = prompt.is_array();
  for (const Json& completion : completions) chat = chat || completion.is_array();
  PromptAndCompletions out;
  if (chat) {
    if (!template_)
      throw_invalid(location +
                        ": the row is written as chat messages, and the model's tokenizer "
                        "has no chat template to render them",
                    "write the prompt and completions as text, or use a model with a chat "
                    "template");
    const Json prompt_messages = normalize_messages(prompt, location + " (prompt)");
    out.prompt = encode(render(prompt_messages, true, location));
    for (std::size_t i = 0; i < roles.size(); ++i) {
      Json messages = prompt_messages;
      for (const Json& m :
           normalize_messages(completions[i], location + " (" + std::string(roles[i]) + ")"))
        messages.push_back(m);
      out.with_completion.push_back(encode(render(messages, false, location)));
    }
  } else {
    const auto text = [&](const Json& v, const char* role) {
      if (!v.is_string())
        throw_invalid(location + ": " + column_of(role) + " (" + role + ") is a " + v.type_name() +
                          "; expected text, or a list of messages",
                      "write the prompt and completions all as text or all as messages");
      return v.get<std::string>();
    };
    const std::string eos = config_.eos_token.value_or("");
    const std::string prompt_text = text(prompt, "prompt");
    out.prompt = tokenizer_->encode(prompt_text, true);
    for (std::size_t i = 0; i < roles.size(); ++i) {
      std::string completion = text(completions[i], roles[i]);
      if (!eos.empty() && !completion.ends_with(eos)) completion += eos;
      out.with_completion.push_back(tokenizer_->encode(prompt_text + completion, true));
    }
  }
  out.prompt_length = out.prompt.size();
  for (const auto& ids : out.with_completion) {
    const auto end = std::mismatch(out.prompt.begin(), out.prompt.end(), ids.begin(), ids.end());
    out.prompt_length =
        std::min(out.prompt_length, static_cast<std::size_t>(end.first - out.prompt.begin()));
  }
  if (options_.max_length > 0 && out.prompt_length >= options_.max_length)
    throw_invalid(location + ": the prompt takes " + std::to_string(out.prompt_length) +
                      " tokens, and max_length is " + std::to_string(options_.max_length) +
                      ", so no completion token is left",
                  "raise max_length, shorten the prompt, or skip such rows");
  for (std::size_t i = 0; i < roles.size(); ++i)
    if (out.with_completion[i].size() <= out.prompt_length)
      throw_invalid(location + ": the " + std::string(roles[i]) + " completion has no token",
                    "give every row a non-empty completion");
  return out;
}

namespace {

// prompt + completion with the loss on the completion.
TokenizedExample completion_row(const std::vector<std::int32_t>& ids, std::size_t prompt_length) {
  TokenizedExample ex;
  ex.input_ids = ids;
  ex.labels.assign(prompt_length, kIgnoreIndex);
  ex.labels.insert(ex.labels.end(), ids.begin() + static_cast<std::ptrdiff_t>(prompt_length),
                   ids.end());
  return ex;
}

// A KTO label: true / false, 1 / 0, or "true" / "false".
std::optional<bool> desirability(const Json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer() && (v.get<std::int64_t>() == 0 || v.get<std::int64_t>() == 1))
    return v.get<std::int64_t>() == 1;
  if (v.is_string()) {
    const std::string s = core::ascii_lower(v.get<std::string>());
    if (s == "true" || s == "1") return true;
    if (s == "false" || s == "0") return false;
  }
  return std::nullopt;
}

}  // namespace

TokenizedExample ExampleBuilder::build_pair(const Row& row, const std::string& location) const {
  const PromptAndCompletions ids = prompt_and_completions(row, location, {"chosen", "rejected"});
  TokenizedExample pair = completion_row(ids.with_completion[0], ids.prompt_length);
  TokenizedExample rejected = completion_row(ids.with_completion[1], ids.prompt_length);
  truncate(pair);
  truncate(rejected);
  pair.rejected_input_ids = std::move(rejected.input_ids);
  pair.rejected_labels = std::move(rejected.labels);
  return pair;
}

TokenizedExample ExampleBuilder::build_unpaired(const Row& row, const std::string& location) const {
  const std::string& column = format_.columns.at("label");
  const auto label = row.find(column);
  std::optional<bool> desirable;
  if (label != row.end()) desirable = desirability(*label);
  if (!desirable)
    throw_invalid(location + ": column '" + column +
                      "' (label) must say whether the completion is desirable: true or false",
                  "write true for a desirable completion, false for an undesirable one");
  const PromptAndCompletions ids = prompt_and_completions(row, location, {"completion"});
  // Left whole: the batch cuts it, and the mismatched rows made from it, to max_length.
  TokenizedExample ex = completion_row(ids.with_completion[0], ids.prompt_length);
  ex.desirable = desirable;
  ex.prompt_length = ids.prompt_length;
  return ex;
}

// ---------------------------------------------------------------- packing

Packer::Packer(std::size_t block_size) : block_size_(block_size) {
  if (block_size_ == 0) throw_invalid("packing needs a block size above 0");
}

void Packer::add(const std::vector<std::int32_t>& document) {
  pending_.insert(pending_.end(), document.begin(), document.end());
  std::size_t start = 0;
  while (pending_.size() - start >= block_size_) {
    TokenizedExample block;
    block.input_ids.assign(pending_.begin() + static_cast<std::ptrdiff_t>(start),
                           pending_.begin() + static_cast<std::ptrdiff_t>(start + block_size_));
    block.labels = block.input_ids;
    ready_.push_back(std::move(block));
    start += block_size_;
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(start));
}

std::vector<TokenizedExample> Packer::take_blocks() {
  std::vector<TokenizedExample> out;
  out.swap(ready_);
  return out;
}

namespace {

// The first of `indices` in the file's order, before `failed`, whose row is refused as `error`
// refused `failed`'s: what a user fixing rows one by one wants named (the rows are taken
// shuffled).
[[noreturn]] void throw_first_bad_row(const DatasetReader& reader,
                                      const std::vector<std::size_t>& indices, std::size_t failed,
                                      const ExampleBuilder& builder, const Error& error) {
  std::vector<std::size_t> earlier;
  for (std::size_t index : indices)
    if (index < failed && index < reader.num_rows()) earlier.push_back(index);
  std::sort(earlier.begin(), earlier.end());
  for (std::size_t index : earlier) {
    try {
      builder.build(reader.row(index), reader.row_location(index));
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::InvalidInput) throw;
    }
  }
  throw error;
}

}  // namespace

TokenizedDataset tokenize_rows(const DatasetReader& reader, const std::vector<std::size_t>& indices,
                               const ExampleBuilder& builder, bool skip_bad_rows,
                               const std::string& purpose) {
  TokenizedDataset out;
  std::optional<Packer> packer;
  if (builder.packs()) packer.emplace(builder.options().max_length);
  for (std::size_t index : indices) {
    if (index >= reader.num_rows())
      throw_invalid(reader.path().string() + ": row index " + std::to_string(index) +
                    " is out of range (" + std::to_string(reader.num_rows()) + " rows)");
    TokenizedExample ex;
    try {
      ex = builder.build(reader.row(index), reader.row_location(index));
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::InvalidInput) throw;
      if (!skip_bad_rows) throw_first_bad_row(reader, indices, index, builder, e);
      out.skipped.add(e.what());
      continue;
    }
    if (packer) {
      packer->add(ex.input_ids);
      for (auto& block : packer->take_blocks()) out.examples.push_back(std::move(block));
    } else {
      out.examples.push_back(std::move(ex));
    }
  }
  if (packer) out.dropped_tail_tokens = packer->pending_tokens();
  if (out.examples.empty()) {
    std::string why = packer ? "fewer tokens (" + std::to_string(out.dropped_tail_tokens) +
                                   ") than one block of " +
                                   std::to_string(builder.options().max_length)
                             : std::string("no rows");
    if (out.skipped.count) why += "; " + out.skipped.summary();
    throw_invalid(reader.path().string() + ": no " + purpose + " examples: " + why,
                  packer ? "lower max_length, turn packing off, or add data" : "check the data");
  }
  return out;
}

}  // namespace tessera::data
