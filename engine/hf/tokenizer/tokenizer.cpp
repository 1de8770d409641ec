// Tokenizer: loads tokenizer.json and runs the pipeline of the `tokenizers` library:
// added tokens split out → normalizer → pre-tokenizer → model → post-processor.
#include "hf/tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <map>

#include "core/error.h"
#include "core/files.h"
#include "hf/tokenizer/components.h"
#include "hf/tokenizer/unicode.h"

namespace tessera::hf {
namespace tokenizer_detail {

const Json& require(const Json& object, const char* key, const Where& where) {
  if (!object.is_object()) throw_invalid(where.str() + " must be a JSON object");
  auto it = object.find(key);
  if (it == object.end())
    throw_invalid((where / key).str() + " is missing",
                  "tokenizer.json is incomplete; re-save it with the tokenizers library");
  return *it;
}

std::string require_string(const Json& object, const std::string& key, const Where& where) {
  const Json& v = require(object, key.c_str(), where);
  if (!v.is_string()) throw_invalid((where / key).str() + " must be a string");
  return v.get<std::string>();
}

bool get_bool(const Json& object, const std::string& key, bool fallback, const Where& where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw_invalid((where / key).str() + " must be true or false");
  return it->get<bool>();
}

std::int64_t get_int(const Json& object, const std::string& key, std::int64_t fallback,
                     const Where& where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) throw_invalid((where / key).str() + " must be an integer");
  return it->get<std::int64_t>();
}

std::string type_of(const Json& object, const Where& where) {
  return require_string(object, "type", where);
}

char32_t one_char(const std::string& s, const Where& where) {
  std::size_t i = 0;
  if (s.empty() || !unicode::is_valid_utf8(s))
    throw_invalid(where.str() + " must be one character");
  const char32_t c = unicode::next_char(s, i);
  if (i != s.size()) throw_invalid(where.str() + " must be one character, got '" + s + "'");
  return c;
}

void unknown_type(const std::string& type, const Where& where, const char* known) {
  throw_invalid((where / "type").str() + ": unknown type '" + type + "'",
                std::string("supported: ") + known);
}

struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// Leftmost-longest matching of added-token strings (what the library's Aho-Corasick does).
class AddedTokenMatcher {
 public:
  void add(std::string pattern, std::size_t token_index) {
    if (pattern.empty()) return;
    patterns_.push_back({std::move(pattern), token_index});
  }
  void finish() {
    for (auto& list : by_first_byte_) list.clear();
    for (std::size_t i = 0; i < patterns_.size(); ++i)
      by_first_byte_[static_cast<unsigned char>(patterns_[i].text[0])].push_back(i);
    for (auto& list : by_first_byte_) {
      std::stable_sort(list.begin(), list.end(), [&](std::size_t a, std::size_t b) {
        return patterns_[a].text.size() > patterns_[b].text.size();
      });
    }
  }
  bool empty() const { return patterns_.empty(); }
  // First match at or after `from`: {begin, end, token index}.
  bool find(std::string_view text, std::size_t from, std::size_t& begin, std::size_t& end,
            std::size_t& token) const {
    for (std::size_t p = from; p < text.size(); ++p) {
      const auto& list = by_first_byte_[static_cast<unsigned char>(text[p])];
      for (std::size_t idx : list) {
        const std::string& pat = patterns_[idx].text;
        if (text.compare(p, pat.size(), pat) == 0) {
          begin = p;
          end = p + pat.size();
          token = patterns_[idx].token;
          return true;
        }
      }
    }
    return false;
  }

 private:
  struct Pattern {
    std::string text;
    std::size_t token;
  };
  std::vector<Pattern> patterns_;
  std::array<std::vector<std::size_t>, 256> by_first_byte_;
};

struct State {
  std::filesystem::path path;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, std::size_t, StringHash, std::equal_to<>> added_by_content;
  std::map<std::int32_t, std::size_t> added_by_id;
  AddedTokenMatcher raw_matcher, normalized_matcher;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Model> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
};

namespace {

bool is_word_char(char32_t c) {
  return c == '_' || unicode::is_alphanumeric(c);
}

char32_t last_char(std::string_view s) {
  std::size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return unicode::next_char(s, start);
}

// Splits the added tokens out of every plain piece, with the lstrip / rstrip / single_word
// rules of the library's AddedVocabulary::find_matches.
void split_added_tokens(const State& st, const AddedTokenMatcher& matcher,
                        std::vector<Split>& splits) {
  if (matcher.empty()) return;
  std::vector<Split> out;
  out.reserve(splits.size() + 4);
  for (Split& s : splits) {
    if (s.token_id >= 0) {
      out.push_back(std::move(s));
      continue;
    }
    const std::string_view text = s.text;
    std::size_t start_offset = 0, search = 0, b = 0, e = 0, token = 0;
    while (search < text.size() && matcher.find(text, search, b, e, token)) {
      search = e;
      const AddedToken& t = st.added[token];
      std::size_t start = b, stop = e;
      if (t.single_word) {
        const bool start_space = start == 0 || !is_word_char(last_char(text.substr(0, start)));
        std::size_t k = stop;
        const bool stop_space = stop == text.size() || !is_word_char(unicode::next_char(text, k));
        if (!start_space || !stop_space) continue;
      }
      if (t.lstrip) {
        std::size_t new_start = start;
        while (new_start > 0) {
          std::size_t prev = new_start - 1;
          while (prev > 0 && (static_cast<unsigned char>(text[prev]) & 0xC0) == 0x80) --prev;
          std::size_t k = prev;
          if (!unicode::is_whitespace(unicode::next_char(text, k))) break;
          new_start = prev;
        }
        start = std::max(new_start, start_offset);
      }
      if (t.rstrip) {
        while (stop < text.size()) {
          std::size_t k = stop;
          if (!unicode::is_whitespace(unicode::next_char(text, k))) break;
          stop = k;
        }
        search = std::max(search, stop);
      }
      if (start > start_offset)
        out.push_back({std::string(text.substr(start_offset, start - start_offset)),
                       s.at_start && start_offset == 0, -1});
      out.push_back({std::string(text.substr(start, stop - start)), false, t.id});
      start_offset = stop;
    }
    if (start_offset < text.size())
      out.push_back({std::string(text.substr(start_offset)), s.at_start && start_offset == 0, -1});
  }
  splits = std::move(out);
}

Json parse_json_file(const std::filesystem::path& path) {
  const std::string text = core::read_text_file(path);
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    throw_invalid(
        path.string() + ": not valid JSON (byte " + std::to_string(e.byte) + "): " + e.what(),
        "the file is truncated or corrupt; download or save it again");
  } catch (const Json::out_of_range& e) {  // a number beyond a double's range (1e400)
    throw_invalid(path.string() + ": not valid JSON: " + e.what(),
                  "the file is truncated or corrupt; download or save it again");
  }
}

void load_added_tokens(State& st, const Json& list, const Where& where) {
  if (list.is_null()) return;
  if (!list.is_array()) throw_invalid(where.str() + " must be an array");
  for (std::size_t i = 0; i < list.size(); ++i) {
    const Where w = where[i];
    const Json& j = list[i];
    AddedToken t;
    t.content = require_string(j, "content", w);
    const std::int64_t id = get_int(j, "id", -1, w);
    if (id < 0 || id > INT32_MAX) throw_invalid((w / "id").str() + " must be a non-negative id");
    t.id = static_cast<std::int32_t>(id);
    t.special = get_bool(j, "special", false, w);
    t.lstrip = get_bool(j, "lstrip", false, w);
    t.rstrip = get_bool(j, "rstrip", false, w);
    t.single_word = get_bool(j, "single_word", false, w);
    t.normalized = get_bool(j, "normalized", !t.special, w);
    if (!unicode::is_valid_utf8(t.content)) throw_invalid((w / "content").str() + " is not UTF-8");
    st.added_by_content[t.content] = st.added.size();
    st.added_by_id[t.id] = st.added.size();
    st.added.push_back(std::move(t));
  }
}

void build_matchers(State& st) {
  for (std::size_t i = 0; i < st.added.size(); ++i) {
    const AddedToken& t = st.added[i];
    if (t.normalized) {
      std::string pattern = t.content;
      if (st.normalizer) st.normalizer->normalize(pattern);
      st.normalized_matcher.add(std::move(pattern), i);
    } else {
      st.raw_matcher.add(t.content, i);
    }
  }
  st.raw_matcher.finish();
  st.normalized_matcher.finish();
}

}  // namespace
}  // namespace tokenizer_detail

using tokenizer_detail::Json;
using tokenizer_detail::Split;
using tokenizer_detail::State;
using tokenizer_detail::Where;

Tokenizer::Tokenizer(std::unique_ptr<State> state) : state_(std::move(state)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  const Json doc = tokenizer_detail::parse_json_file(tokenizer_json);
  const Where root{tokenizer_json.string(), ""};
  if (!doc.is_object()) throw_invalid(root.file + ": the top level must be a JSON object");
  auto st = std::make_unique<State>();
  st->path = tokenizer_json;
  auto present = [&](const char* key) { return doc.contains(key) && !doc[key].is_null(); };
  if (!present("model"))
    throw_invalid(root.file + ": field 'model' is missing",
                  "this is not a HuggingFace tokenizer.json (no model section)");
  st->model = tokenizer_detail::make_model(doc["model"], root / "model");
  if (present("normalizer"))
    st->normalizer = tokenizer_detail::make_normalizer(doc["normalizer"], root / "normalizer");
  if (present("pre_tokenizer"))
    st->pre_tokenizer =
        tokenizer_detail::make_pre_tokenizer(doc["pre_tokenizer"], root / "pre_tokenizer");
  if (present("post_processor"))
    st->post_processor =
        tokenizer_detail::make_post_processor(doc["post_processor"], root / "post_processor");
  if (present("decoder"))
    st->decoder = tokenizer_detail::make_decoder(doc["decoder"], root / "decoder");
  if (doc.contains("added_tokens"))
    tokenizer_detail::load_added_tokens(*st, doc["added_tokens"], root / "added_tokens");
  tokenizer_detail::build_matchers(*st);
  return Tokenizer(std::move(st));
}

Tokenizer Tokenizer::from_folder(const std::filesystem::path& model_dir) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(model_dir, ec)) return from_file(model_dir);
  if (!std::filesystem::is_directory(model_dir, ec))
    throw_invalid(model_dir.string() + ": no such file or folder",
                  "give a model folder holding tokenizer.json, or the tokenizer.json itself");
  const auto json_path = model_dir / "tokenizer.json";
  if (!std::filesystem::exists(json_path, ec))
    throw_invalid(model_dir.string() + ": no tokenizer.json in this folder",
                  "only fast (tokenizer.json) tokenizers are supported; save one with "
                  "AutoTokenizer.from_pretrained(...).save_pretrained(dir)");
  Tokenizer tok = from_file(json_path);
  const auto config_path = model_dir / "tokenizer_config.json";
  if (!std::filesystem::exists(config_path, ec)) return tok;
  const Json config = tokenizer_detail::parse_json_file(config_path);
  if (!config.is_object())
    throw_invalid(config_path.string() + ": the top level must be an object");
  // transformers (5.x) drops add_bos_token / add_eos_token whenever tokenizer.json exists:
  // the post-processor stored there decides, so the flags change nothing here.
  return tok;
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const State& st = *state_;
  std::vector<Split> splits;
  splits.push_back(
      {unicode::is_valid_utf8(text) ? std::string(text) : unicode::to_valid_utf8(text), true, -1});
  tokenizer_detail::split_added_tokens(st, st.raw_matcher, splits);
  if (st.normalizer) {
    for (Split& s : splits)
      if (s.token_id < 0) st.normalizer->normalize(s.text);
  }
  tokenizer_detail::split_added_tokens(st, st.normalized_matcher, splits);
  std::erase_if(splits, [](const Split& s) { return s.token_id < 0 && s.text.empty(); });
  if (st.pre_tokenizer) st.pre_tokenizer->pre_tokenize(splits);
  std::vector<std::int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const Split& s : splits) {
    if (s.token_id >= 0) {
      ids.push_back(s.token_id);
    } else {
      st.model->tokenize(s.text, ids);
    }
  }
  if (add_special_tokens && st.post_processor) st.post_processor->process(ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
  const State& st = *state_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (std::int32_t id : ids) {
    auto it = st.added_by_id.find(id);
    if (it != st.added_by_id.end()) {
      const auto& t = st.added[it->second];
      if (skip_special_tokens && t.special) continue;
      tokens.push_back(t.content);
      continue;
    }
    auto token = st.model->id_to_token(id);
    if (!token) continue;  // unknown ids are dropped, as the library does
    if (skip_special_tokens) {
      auto a = st.added_by_content.find(*token);
      if (a != st.added_by_content.end() && st.added[a->second].special) continue;
    }
    tokens.push_back(std::move(*token));
  }
  if (!st.decoder) {
    std::string out;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out += tokens[i];
    }
    return out;
  }
  st.decoder->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

std::size_t Tokenizer::vocab_size() const {
  const State& st = *state_;
  std::size_t n = st.model->vocab().size();
  for (const auto& t : st.added)
    if (st.model->vocab().find(t.content) == st.model->vocab().end()) ++n;
  return n;
}

std::optional<std::int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = state_->added_by_content.find(token);
  if (it != state_->added_by_content.end()) return state_->added[it->second].id;
  return state_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(std::int32_t id) const {
  auto it = state_->added_by_id.find(id);
  if (it != state_->added_by_id.end()) return state_->added[it->second].content;
  return state_->model->id_to_token(id);
}

std::vector<std::string> Tokenizer::special_tokens() const {
  std::vector<std::string> out;
  for (const auto& [id, index] : state_->added_by_id)
    if (state_->added[index].special) out.push_back(state_->added[index].content);
  return out;
}

std::string Tokenizer::model_kind() const {
  const State& st = *state_;
  const std::string kind = st.model->kind();
  if (kind != "BPE") return kind;
  if ((st.pre_tokenizer && st.pre_tokenizer->is_byte_level()) ||
      (st.decoder && st.decoder->is_byte_level()))
    return "BPE (byte-level)";
  if (st.model->byte_fallback()) return "BPE (byte fallback)";
  return kind;
}

const std::filesystem::path& Tokenizer::path() const {
  return state_->path;
}

}  // namespace tessera::hf
