// Models: a pre-tokenized word → token ids. BPE (byte-level or SentencePiece-style with byte
// fallback) and WordPiece, with the exact merge order of the `tokenizers` library.
#include <array>
#include <mutex>
#include <queue>

#include "core/error.h"
#include "hf/tokenizer/components.h"
#include "hf/tokenizer/unicode.h"

namespace tessera::hf::tokenizer_detail {
namespace {

// Ids beyond this are refused: a reverse table that large means a corrupt file.
constexpr std::int64_t kMaxTokenId = std::int64_t{1} << 24;

struct VocabTables {
  Vocab vocab;
  std::vector<const std::string*> by_id;

  void load(const Json& j, const Where& where) {
    if (!j.is_object()) throw_invalid(where.str() + " must be an object of token → id");
    vocab.reserve(j.size());
    std::int64_t max_id = -1;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!it.value().is_number_integer())
        throw_invalid(where.str() + ": the id of token '" + it.key() + "' is not an integer");
      const std::int64_t id = it.value().get<std::int64_t>();
      if (id < 0 || id >= kMaxTokenId)
        throw_invalid(where.str() + ": token '" + it.key() + "' has id " + std::to_string(id) +
                      ", outside 0.." + std::to_string(kMaxTokenId - 1));
      vocab.emplace(it.key(), static_cast<std::int32_t>(id));
      max_id = std::max(max_id, id);
    }
    by_id.assign(static_cast<std::size_t>(max_id + 1), nullptr);
    for (const auto& [token, id] : vocab) by_id[static_cast<std::size_t>(id)] = &token;
  }
  std::optional<std::int32_t> to_id(std::string_view token) const {
    auto it = vocab.find(token);
    if (it == vocab.end()) return std::nullopt;
    return it->second;
  }
  std::optional<std::string> to_token(std::int32_t id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= by_id.size() || by_id[id] == nullptr)
      return std::nullopt;
    return *by_id[static_cast<std::size_t>(id)];
  }
};

std::optional<std::string> optional_string(const Json& j, const std::string& key,
                                           const Where& where) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return require_string(j, key, where);
}

// A word → ids cache shared by the threads that encode with one tokenizer. Sharded so
// that threads rarely wait on one another; it stops growing when full (as the library's).
class WordCache {
 public:
  static constexpr std::size_t kShards = 16;
  static constexpr std::size_t kMaxEntriesPerShard = 1 << 14;
  static constexpr std::size_t kMaxWordBytes = 256;

  bool get(std::string_view word, std::vector<std::int32_t>& out) const {
    if (word.size() > kMaxWordBytes) return false;
    const std::size_t h = StringHash{}(word);
    Shard& shard = shards_[h % kShards];
    std::lock_guard lock(shard.mutex);
    auto it = shard.map.find(word);
    if (it == shard.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void put(std::string_view word, const std::int32_t* ids, std::size_t n) const {
    if (word.size() > kMaxWordBytes) return;
    const std::size_t h = StringHash{}(word);
    Shard& shard = shards_[h % kShards];
    std::lock_guard lock(shard.mutex);
    if (shard.map.size() >= kMaxEntriesPerShard) return;
    shard.map.emplace(std::string(word), std::vector<std::int32_t>(ids, ids + n));
  }

 private:
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<std::int32_t>, StringHash, std::equal_to<>> map;
  };
  mutable std::array<Shard, kShards> shards_;
};

class BpeModel final : public Model {
 public:
  BpeModel(const Json& j, const Where& where) {
    vocab_.load(require(j, "vocab", where), where / "vocab");
    unk_token_ = optional_string(j, "unk_token", where);
    prefix_ = optional_string(j, "continuing_subword_prefix", where);
    suffix_ = optional_string(j, "end_of_word_suffix", where);
    fuse_unk_ = get_bool(j, "fuse_unk", false, where);
    byte_fallback_ = get_bool(j, "byte_fallback", false, where);
    ignore_merges_ = get_bool(j, "ignore_merges", false, where);
    if (j.contains("dropout") && !j["dropout"].is_null()) {
      if (!j["dropout"].is_number())
        throw_invalid((where / "dropout").str() + " must be a number or null");
      const double p = j["dropout"].get<double>();
      if (p != 0.0)
        throw_unsupported((where / "dropout").str() + " = " + std::to_string(p) +
                              ": BPE dropout (random merges) is not supported",
                          "set \"dropout\": null in tokenizer.json for deterministic encoding");
    }
    if (byte_fallback_) {
      for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        byte_ids_[static_cast<std::size_t>(b)] = vocab_.to_id(name).value_or(-1);
      }
    }
    const Json& merges = require(j, "merges", where);
    const Where mw = where / "merges";
    if (!merges.is_array()) throw_invalid(mw.str() + " must be an array");
    merges_.reserve(merges.size());
    for (std::size_t i = 0; i < merges.size(); ++i) {
      std::string a, b;
      const Json& m = merges[i];
      if (m.is_string()) {
        const std::string& s = m.get_ref<const std::string&>();
        const std::size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          throw_invalid(mw[i].str() + ": merge '" + s +
                        "' must be two tokens separated by one space");
        a = s.substr(0, space);
        b = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        throw_invalid(mw[i].str() + " must be \"A B\" or [\"A\", \"B\"]");
      }
      auto a_id = vocab_.to_id(a), b_id = vocab_.to_id(b);
      if (!a_id || !b_id)
        throw_invalid(mw[i].str() + ": merge references token '" + (a_id ? b : a) +
                          "' which is not in model.vocab",
                      "the vocab and merges of tokenizer.json do not belong together");
      std::string merged = a;
      if (prefix_ && b.compare(0, prefix_->size(), *prefix_) == 0) {
        merged += b.substr(prefix_->size());
      } else {
        merged += b;
      }
      auto new_id = vocab_.to_id(merged);
      if (!new_id)
        throw_invalid(mw[i].str() + ": the merged token '" + merged + "' is not in model.vocab",
                      "the vocab and merges of tokenizer.json do not belong together");
      merges_[pair_key(*a_id, *b_id)] = {static_cast<std::int32_t>(i), *new_id};
    }
    if (unk_token_) unk_id_ = vocab_.to_id(*unk_token_);
  }

  void tokenize(std::string_view word, std::vector<std::int32_t>& out) const override {
    if (word.empty()) return;
    if (ignore_merges_) {
      if (auto id = vocab_.to_id(word)) {
        out.push_back(*id);
        return;
      }
    }
    if (cache_.get(word, out)) return;
    const std::size_t first = out.size();
    merge_word(word, out);
    cache_.put(word, out.data() + first, out.size() - first);
  }

  std::optional<std::int32_t> token_to_id(std::string_view token) const override {
    return vocab_.to_id(token);
  }
  std::optional<std::string> id_to_token(std::int32_t id) const override {
    return vocab_.to_token(id);
  }
  const Vocab& vocab() const override { return vocab_.vocab; }
  std::string kind() const override { return "BPE"; }
  bool byte_fallback() const override { return byte_fallback_; }

 private:
  struct Symbol {
    std::int32_t id;
    std::int32_t prev, next;
    bool removed;
  };
  struct Candidate {
    std::int32_t rank, pos, new_id;
    bool operator<(const Candidate& o) const {  // priority_queue pops the largest
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };

  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
           static_cast<std::uint32_t>(b);
  }
  const std::pair<std::int32_t, std::int32_t>* find_merge(std::int32_t a, std::int32_t b) const {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }

  static void add_symbol(std::vector<Symbol>& symbols, std::int32_t id) {
    const auto n = static_cast<std::int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, false});
  }

  void merge_word(std::string_view word, std::vector<std::int32_t>& out) const {
    thread_local std::vector<Symbol> symbols;
    thread_local std::string piece;
    symbols.clear();
    std::int32_t pending_unk = -1;  // unknowns wait here so that fuse_unk can fuse them
    std::size_t i = 0;
    while (i < word.size()) {
      const std::size_t start = i;
      i += unicode::char_len(static_cast<unsigned char>(word[i]));
      if (i > word.size()) i = word.size();
      const bool is_first = start == 0, is_last = i >= word.size();
      piece.clear();
      if (!is_first && prefix_) piece += *prefix_;
      piece.append(word.substr(start, i - start));
      if (is_last && suffix_) piece += *suffix_;
      if (auto id = vocab_.to_id(piece)) {
        if (pending_unk >= 0) {
          add_symbol(symbols, pending_unk);
          pending_unk = -1;
        }
        add_symbol(symbols, *id);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (char ch : piece) all = all && byte_ids_[static_cast<unsigned char>(ch)] >= 0;
        if (all) {
          for (char ch : piece) add_symbol(symbols, byte_ids_[static_cast<unsigned char>(ch)]);
          continue;
        }
      }
      if (!unk_token_)
        throw_invalid("tokenizer: the text contains '" + piece +
                          "', which is not in the vocabulary, and model.unk_token is null",
                      "use a tokenizer with an unk_token or byte fallback");
      if (!unk_id_)
        throw_invalid("tokenizer: model.unk_token '" + *unk_token_ + "' is not in model.vocab");
      if (pending_unk >= 0 && !fuse_unk_) add_symbol(symbols, pending_unk);
      pending_unk = *unk_id_;
    }
    if (pending_unk >= 0) add_symbol(symbols, pending_unk);

    std::priority_queue<Candidate> queue;
    for (std::size_t k = 0; k + 1 < symbols.size(); ++k) {
      if (auto* m = find_merge(symbols[k].id, symbols[k + 1].id))
        queue.push({m->first, static_cast<std::int32_t>(k), m->second});
    }
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      Symbol& cur = symbols[static_cast<std::size_t>(top.pos)];
      if (cur.removed || cur.next < 0) continue;
      Symbol& right = symbols[static_cast<std::size_t>(cur.next)];
      auto* m = find_merge(cur.id, right.id);
      if (m == nullptr || m->second != top.new_id) continue;  // stale entry
      cur.id = top.new_id;
      right.removed = true;
      cur.next = right.next;
      if (right.next >= 0) symbols[static_cast<std::size_t>(right.next)].prev = top.pos;
      if (cur.prev >= 0) {
        if (auto* pm = find_merge(symbols[static_cast<std::size_t>(cur.prev)].id, cur.id))
          queue.push({pm->first, cur.prev, pm->second});
      }
      if (cur.next >= 0) {
        if (auto* nm = find_merge(cur.id, symbols[static_cast<std::size_t>(cur.next)].id))
          queue.push({nm->first, top.pos, nm->second});
      }
    }
    for (const Symbol& s : symbols)
      if (!s.removed) out.push_back(s.id);
  }

  VocabTables vocab_;
  std::unordered_map<std::uint64_t, std::pair<std::int32_t, std::int32_t>> merges_;
  std::optional<std::string> unk_token_, prefix_, suffix_;
  std::optional<std::int32_t> unk_id_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::array<std::int32_t, 256> byte_ids_{};
  WordCache cache_;
};

class WordPieceModel final : public Model {
 public:
  WordPieceModel(const Json& j, const Where& where) {
    vocab_.load(require(j, "vocab", where), where / "vocab");
    unk_token_ = j.contains("unk_token") ? require_string(j, "unk_token", where) : "[UNK]";
    prefix_ = j.contains("continuing_subword_prefix")
                  ? require_string(j, "continuing_subword_prefix", where)
                  : "##";
    const std::int64_t max_chars = get_int(j, "max_input_chars_per_word", 100, where);
    if (max_chars < 0)
      throw_invalid((where / "max_input_chars_per_word").str() + " must not be negative");
    max_chars_ = static_cast<std::size_t>(max_chars);
    unk_id_ = vocab_.to_id(unk_token_);
    for (const auto& [token, id] : vocab_.vocab)
      max_token_bytes_ = std::max(max_token_bytes_, token.size());
  }

  void tokenize(std::string_view word, std::vector<std::int32_t>& out) const override {
    if (word.empty()) return;
    std::size_t chars = 0;
    for (char ch : word) chars += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
    if (chars > max_chars_) {
      out.push_back(unk());
      return;
    }
    if (cache_.get(word, out)) return;
    const std::size_t first = out.size();
    thread_local std::string candidate;
    std::size_t start = 0;
    while (start < word.size()) {
      std::size_t end = word.size();
      // No vocabulary entry is longer than max_token_bytes_: skip hopeless lookups.
      const std::size_t limit = start + max_token_bytes_;
      if (end > limit) {
        end = limit;
        while (end > start && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80) --end;
      }
      std::optional<std::int32_t> found;
      while (start < end) {
        std::string_view sub = word.substr(start, end - start);
        if (start > 0) {
          candidate.assign(prefix_);
          candidate.append(sub);
          found = vocab_.to_id(candidate);
        } else {
          found = vocab_.to_id(sub);
        }
        if (found) break;
        --end;
        while (end > start && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80) --end;
      }
      if (!found) {
        out.resize(first);
        out.push_back(unk());
        cache_.put(word, out.data() + first, 1);
        return;
      }
      out.push_back(*found);
      start = end;
    }
    cache_.put(word, out.data() + first, out.size() - first);
  }

  std::optional<std::int32_t> token_to_id(std::string_view token) const override {
    return vocab_.to_id(token);
  }
  std::optional<std::string> id_to_token(std::int32_t id) const override {
    return vocab_.to_token(id);
  }
  const Vocab& vocab() const override { return vocab_.vocab; }
  std::string kind() const override { return "WordPiece"; }

 private:
  std::int32_t unk() const {
    if (!unk_id_)
      throw_invalid("tokenizer: model.unk_token '" + unk_token_ + "' is not in model.vocab",
                    "add the unk token to the vocabulary");
    return *unk_id_;
  }

  VocabTables vocab_;
  std::string unk_token_, prefix_;
  std::size_t max_chars_ = 100, max_token_bytes_ = 0;
  std::optional<std::int32_t> unk_id_;
  WordCache cache_;
};

}  // namespace

std::unique_ptr<Model> make_model(const Json& j, const Where& where) {
  if (!j.is_object()) throw_invalid(where.str() + " must be an object");
  std::string type;
  if (j.contains("type")) {
    type = type_of(j, where);
  } else if (j.contains("merges")) {
    type = "BPE";  // old files leave the type out
  } else if (j.contains("continuing_subword_prefix") || j.contains("max_input_chars_per_word")) {
    type = "WordPiece";
  } else {
    throw_invalid((where / "type").str() + " is missing", "set the model type (BPE or WordPiece)");
  }
  if (type == "BPE") return std::make_unique<BpeModel>(j, where);
  if (type == "WordPiece") return std::make_unique<WordPieceModel>(j, where);
  if (type == "Unigram" || type == "WordLevel")
    throw_unsupported((where / "type").str() + ": model type '" + type + "' is not supported yet",
                      "supported models: BPE, WordPiece");
  unknown_type(type, where, "BPE, WordPiece");
}

}  // namespace tessera::hf::tokenizer_detail
