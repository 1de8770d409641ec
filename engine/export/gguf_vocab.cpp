#include "export/gguf_vocab.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "core/files.h"
#include "hf/chat/tokenizer_config.h"
#include "hf/tokenizer/tokenizer.h"

namespace tessera::exporter {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* kCannotHint =
    "export with --format hf and convert that folder with llama.cpp's convert_hf_to_gguf.py, or "
    "fine-tune a model whose tokenizer is byte-level BPE (GPT-2, Llama 3, Qwen2) or "
    "SentencePiece-style BPE with byte fallback (Llama 2, Mistral)";

// The split patterns of the byte-level BPE tokenizers llama.cpp knows by name, as tokenizer.json
// writes them (Split with behavior Isolated, then ByteLevel without its own regex).
struct KnownSplit {
  const char* pattern;
  const char* pre;
};
const KnownSplit kKnownSplits[] = {
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "llama-bpe"},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "qwen2"},
};

[[noreturn]] void cannot(const fs::path& file, const std::string& what) {
  throw_unsupported(
      file.string() + ": " + what + "; GGUF (llama.cpp) cannot express this tokenizer",
      kCannotHint);
}

std::string type_of(const json& node) {
  if (!node.is_object()) return "";
  auto it = node.find("type");
  return it != node.end() && it->is_string() ? it->get<std::string>() : "";
}

bool flag(const json& node, const char* key, bool fallback) {
  auto it = node.find(key);
  return it != node.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// tokenizer.ggml.pre for a byte-level BPE's pre_tokenizer.
std::string byte_level_pre(const json& pre, const fs::path& file) {
  const std::string type = type_of(pre);
  if (type == "ByteLevel") {
    if (flag(pre, "add_prefix_space", false))
      cannot(file, "pre_tokenizer ByteLevel with add_prefix_space=true");
    if (!flag(pre, "use_regex", true))
      cannot(file, "pre_tokenizer ByteLevel without its regex (use_regex=false) and no split");
    return "gpt-2";
  }
  if (type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array() &&
      pre["pretokenizers"].size() == 2) {
    const json& split = pre["pretokenizers"][0];
    const json& bytes = pre["pretokenizers"][1];
    const bool split_ok =
        type_of(split) == "Split" && split.contains("pattern") && split["pattern"].is_object() &&
        split["pattern"].contains("Regex") && split["pattern"]["Regex"].is_string() &&
        split.value("behavior", "") == "Isolated" && !flag(split, "invert", false);
    const bool bytes_ok = type_of(bytes) == "ByteLevel" &&
                          !flag(bytes, "add_prefix_space", false) &&
                          !flag(bytes, "use_regex", true);
    if (split_ok && bytes_ok) {
      const std::string pattern = split["pattern"]["Regex"].get<std::string>();
      for (const KnownSplit& k : kKnownSplits)
        if (pattern == k.pattern) return k.pre;
      cannot(file, "pre_tokenizer splits with the regex \"" + pattern +
                       "\", which is not one llama.cpp names (it knows GPT-2's, Llama 3's and "
                       "Qwen2's)");
    }
  }
  cannot(file, "pre_tokenizer " + (pre.is_null() ? std::string("null") : pre.dump()) +
                   " is not GPT-2's ByteLevel nor a Llama 3 / Qwen2 split");
}

// Whether the SentencePiece-style tokenizer prepends "▁" to the text (llama.cpp's
// add_space_prefix); refuses normalizers and pre-tokenizers llama.cpp does not apply.
bool spm_space_prefix(const json& doc, const fs::path& file) {
  const std::string kSpace = "\xE2\x96\x81";  // ▁
  const json& normalizer = doc.contains("normalizer") ? doc["normalizer"] : json();
  const json& pre = doc.contains("pre_tokenizer") ? doc["pre_tokenizer"] : json();
  if (!pre.is_null()) {
    if (type_of(pre) != "Metaspace" || pre.value("replacement", kSpace) != kSpace)
      cannot(file, "pre_tokenizer " + pre.dump() + " (a byte-fallback BPE needs Metaspace with \"" +
                       kSpace + "\" or none)");
    if (!normalizer.is_null())
      cannot(file, "normalizer " + normalizer.dump() + " beside Metaspace");
    const std::string scheme = pre.value("prepend_scheme", "always");
    if (scheme != "always" && scheme != "first" && scheme != "never")
      cannot(file, "pre_tokenizer.prepend_scheme \"" + scheme + "\"");
    return scheme != "never";
  }
  // Llama 2's: Prepend("▁") then Replace(" " → "▁"); or the Replace alone (no prefix).
  std::vector<json> steps;
  if (type_of(normalizer) == "Sequence" && normalizer.contains("normalizers"))
    for (const json& n : normalizer["normalizers"]) steps.push_back(n);
  else if (!normalizer.is_null())
    steps.push_back(normalizer);
  bool prepend = false, replace = false;
  for (const json& n : steps) {
    const std::string type = type_of(n);
    if (type == "Prepend" && n.value("prepend", "") == kSpace && !replace) {
      prepend = true;
    } else if (type == "Replace" && n.contains("pattern") && n["pattern"].is_object() &&
               n["pattern"].value("String", "") == " " && n.value("content", "") == kSpace) {
      replace = true;
    } else {
      cannot(file, "normalizer step " + n.dump() +
                       " (llama.cpp's SentencePiece tokenizer only "
                       "replaces spaces with \"" +
                       kSpace + "\" and may prepend one)");
    }
  }
  if (!replace)
    cannot(file,
           "a byte-fallback BPE whose normalizer does not replace spaces with \"" + kSpace + "\"");
  return prepend;
}

bool is_byte_token(const std::string& t) {
  auto hex = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f');
  };
  return t.size() == 6 && t.starts_with("<0x") && hex(t[3]) && hex(t[4]) && t[5] == '>';
}

// UTF-8 characters in `s` (bytes that do not continue a sequence).
std::size_t characters(const std::string& s) {
  return static_cast<std::size_t>(std::count_if(
      s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

std::optional<std::uint32_t> id_of(const hf::Tokenizer& tok, const std::optional<std::string>& s) {
  if (!s) return std::nullopt;
  if (auto id = tok.token_to_id(*s)) return static_cast<std::uint32_t>(*id);
  return std::nullopt;
}

}  // namespace

GgufVocab read_gguf_vocab(const fs::path& dir, const hf::ModelConfig& config) {
  const fs::path file = dir / "tokenizer.json";
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    throw_invalid(file.string() + ": missing; a GGUF file carries the tokenizer",
                  "put the model's tokenizer.json (AutoTokenizer.save_pretrained writes it) in " +
                      dir.string());
  json doc = json::parse(core::read_text_file(file), nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("model") || !doc["model"].is_object())
    throw_invalid(file.string() + ": not a tokenizer.json (no \"model\" object)",
                  "save the tokenizer again with AutoTokenizer.save_pretrained");
  const hf::Tokenizer tokenizer = hf::Tokenizer::from_folder(dir);
  const json& model = doc["model"];
  const std::string model_type = type_of(model);
  if (model_type != "BPE")
    cannot(file, "model.type \"" + model_type +
                     "\" (llama.cpp reads BPE tokenizers for these model families)");
  const bool byte_fallback = flag(model, "byte_fallback", false);

  GgufVocab v;
  const json& pre = doc.contains("pre_tokenizer") ? doc["pre_tokenizer"] : json();
  if (byte_fallback) {
    v.model = "llama";
    v.add_space_prefix = spm_space_prefix(doc, file);
  } else {
    v.model = "gpt2";
    v.pre = byte_level_pre(pre, file);
    const json& normalizer = doc.contains("normalizer") ? doc["normalizer"] : json();
    // NFC changes nothing in text that is already composed; llama.cpp skips it as its converter.
    if (!normalizer.is_null() && type_of(normalizer) != "NFC")
      cannot(file, "normalizer " + normalizer.dump() + " on a byte-level BPE");
  }

  // Tokens by id: the model's vocabulary, then added tokens (which may repeat vocabulary entries).
  if (!model.contains("vocab") || !model["vocab"].is_object())
    throw_invalid(file.string() + ": model.vocab is not an object", "save the tokenizer again");
  std::map<std::int64_t, std::string> by_id;
  std::unordered_map<std::string, std::int64_t> id_of_text;
  auto place = [&](const std::string& text, std::int64_t id, const char* where) {
    if (id < 0 || id >= config.vocab_size)
      throw_invalid(file.string() + ": " + where + " token \"" + text + "\" has id " +
                        std::to_string(id) + ", outside the model's vocab_size " +
                        std::to_string(config.vocab_size),
                    "the tokenizer does not belong to this model; use the model's own");
    auto [it, fresh] = by_id.emplace(id, text);
    if (!fresh && it->second != text)
      throw_invalid(file.string() + ": id " + std::to_string(id) + " is both \"" + it->second +
                        "\" and \"" + text + "\"",
                    "save the tokenizer again");
    auto [t, new_text] = id_of_text.emplace(text, id);
    if (!new_text && t->second != id)
      cannot(file, "token \"" + text + "\" has two ids (" + std::to_string(t->second) + " and " +
                       std::to_string(id) + "), and llama.cpp needs each token text once");
  };
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer())
      throw_invalid(file.string() + ": model.vocab[\"" + text + "\"] is not an integer id",
                    "save the tokenizer again");
    place(text, id.get<std::int64_t>(), "model.vocab");
  }
  std::map<std::int64_t, bool> added_special;  // id → special
  if (doc.contains("added_tokens") && doc["added_tokens"].is_array())
    for (const json& a : doc["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string())
        throw_invalid(file.string() + ": an added_tokens entry lacks an integer id or a content",
                      "save the tokenizer again");
      place(a["content"].get<std::string>(), a["id"].get<std::int64_t>(), "added_tokens");
      added_special[a["id"].get<std::int64_t>()] = flag(a, "special", false);
    }

  const std::optional<std::string> unk_text =
      model.contains("unk_token") && model["unk_token"].is_string()
          ? std::optional(model["unk_token"].get<std::string>())
          : std::nullopt;
  const std::size_t n = static_cast<std::size_t>(config.vocab_size);
  v.tokens.resize(n);
  v.token_types.resize(n, kTokenNormal);
  for (std::size_t id = 0; id < n; ++id) {
    auto it = by_id.find(static_cast<std::int64_t>(id));
    if (it == by_id.end()) {
      v.tokens[id] = "[PAD" + std::to_string(id) + "]";
      v.token_types[id] = kTokenUnused;
      ++v.padding_tokens;
      continue;
    }
    v.tokens[id] = it->second;
    auto added = added_special.find(it->first);
    if (added != added_special.end())
      v.token_types[id] = added->second ? kTokenControl : kTokenUserDefined;
    else if (byte_fallback && is_byte_token(it->second))
      v.token_types[id] = kTokenByte;
    else if (byte_fallback && unk_text && it->second == *unk_text)
      v.token_types[id] = kTokenUnknown;
  }

  // Merges, in rank order: "left right" strings or [left, right] pairs in the file.
  std::vector<std::pair<std::string, std::string>> merges;
  if (model.contains("merges") && model["merges"].is_array())
    for (const json& m : model["merges"]) {
      std::string left, right;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const std::size_t space = s.find(' ', 1);
        if (space == std::string::npos)
          throw_invalid(file.string() + ": merge \"" + s + "\" has no space between its parts",
                        "save the tokenizer again");
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        throw_invalid(file.string() + ": model.merges holds " + m.dump() +
                          ", neither \"a b\" nor [\"a\", \"b\"]",
                      "save the tokenizer again");
      }
      if (left.empty() || right.empty() || left.find(' ') != std::string::npos ||
          right.find(' ') != std::string::npos)
        cannot(file, "merge [\"" + left + "\", \"" + right +
                         "\"] has a space inside a part (GGUF writes merges as \"left right\")");
      merges.emplace_back(std::move(left), std::move(right));
    }
  if (v.model == "gpt2") {
    v.merges.reserve(merges.size());
    for (const auto& [l, r] : merges) v.merges.push_back(l + " " + r);
  } else {
    // A token made by merge r scores −(r + 1) (its first merge if several make it); tokens no
    // merge makes score below every merge, except single characters and specials (0), which
    // llama.cpp never forms from pairs.
    v.scores.assign(n, -static_cast<float>(merges.size() + 1));
    for (std::size_t id = 0; id < n; ++id)
      if (v.token_types[id] != kTokenNormal || characters(v.tokens[id]) == 1) v.scores[id] = 0.0f;
    for (std::size_t r = merges.size(); r-- > 0;) {
      auto it = id_of_text.find(merges[r].first + merges[r].second);
      if (it != id_of_text.end() && static_cast<std::size_t>(it->second) < n)
        v.scores[static_cast<std::size_t>(it->second)] = -static_cast<float>(r + 1);
    }
  }

  // Special tokens: tokenizer_config.json names them; config.json's ids fill the rest.
  const hf::TokenizerConfig tc = hf::load_tokenizer_config_from_folder(dir);
  v.bos_id = id_of(tokenizer, tc.bos_token);
  v.eos_id = id_of(tokenizer, tc.eos_token);
  v.unk_id = id_of(tokenizer, tc.unk_token ? tc.unk_token : unk_text);
  v.pad_id = id_of(tokenizer, tc.pad_token);
  if (!v.bos_id && config.bos_token_id) v.bos_id = static_cast<std::uint32_t>(*config.bos_token_id);
  if (!v.eos_id && !config.eos_token_ids.empty())
    v.eos_id = static_cast<std::uint32_t>(config.eos_token_ids.front());
  if (!v.pad_id && config.pad_token_id) v.pad_id = static_cast<std::uint32_t>(*config.pad_token_id);
  v.chat_template = tc.chat_template;

  // BOS/EOS as the tokenizer adds them: what encoding with special tokens puts around the text.
  const std::string probe = "Hello world";
  const std::vector<std::int32_t> plain = tokenizer.encode(probe, false);
  const std::vector<std::int32_t> full = tokenizer.encode(probe, true);
  auto at = std::search(full.begin(), full.end(), plain.begin(), plain.end());
  if (plain.empty() || at == full.end())
    cannot(file, "its post-processor changes the text's own tokens");
  const std::size_t before = static_cast<std::size_t>(at - full.begin());
  const std::size_t after = full.size() - before - plain.size();
  auto adds = [&](std::size_t count, std::int32_t token, std::optional<std::uint32_t>& id,
                  const char* role) {
    if (count == 0) return false;
    if (count > 1)
      cannot(file, std::string("its post-processor adds ") + std::to_string(count) + " tokens " +
                       role + " the text (llama.cpp adds one)");
    if (!id) id = static_cast<std::uint32_t>(token);
    if (*id != static_cast<std::uint32_t>(token))
      cannot(file, std::string("its post-processor adds token ") + std::to_string(token) + " " +
                       role + " the text, which is not the " +
                       (std::string(role) == "before" ? "BOS" : "EOS") + " token " +
                       std::to_string(*id));
    return true;
  };
  v.add_bos = adds(before, before > 0 ? full.front() : 0, v.bos_id, "before");
  v.add_eos = adds(after, after > 0 ? full.back() : 0, v.eos_id, "after");
  for (const std::optional<std::uint32_t>* id : {&v.bos_id, &v.eos_id, &v.unk_id, &v.pad_id})
    if (*id && **id >= n)
      throw_invalid(dir.string() + ": special token id " + std::to_string(**id) +
                        " is outside the model's vocab_size " + std::to_string(n),
                    "fix tokenizer_config.json or config.json");
  return v;
}

}  // namespace tessera::exporter
