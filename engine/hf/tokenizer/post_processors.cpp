// Post-processors: the special tokens added around an encoded sequence (single sequences;
// pairs are not needed by the engine).
#include "core/error.h"
#include "hf/tokenizer/components.h"

namespace tessera::hf::tokenizer_detail {
namespace {

// Every supported processor reduces to "these ids, the sequence, those ids".
class WrapProcessor final : public PostProcessor {
 public:
  WrapProcessor(std::vector<std::int32_t> before, std::vector<std::int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<std::int32_t>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }

 private:
  std::vector<std::int32_t> before_, after_;
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void process(std::vector<std::int32_t>& ids) const override {
    for (const auto& step : steps_) step->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

std::int32_t token_pair_id(const Json& j, const std::string& key, const Where& where) {
  const Json& pair = require(j, key.c_str(), where);
  if (!pair.is_array() || pair.size() != 2 || !pair[1].is_number_integer())
    throw_invalid((where / key).str() + " must be [\"TOKEN\", ID]");
  const std::int64_t id = pair[1].get<std::int64_t>();
  if (id < 0 || id > INT32_MAX) throw_invalid((where / key).str() + ": id out of range");
  return static_cast<std::int32_t>(id);
}

std::unique_ptr<PostProcessor> make_template(const Json& j, const Where& where) {
  const Json& single = require(j, "single", where);
  const Where sw = where / "single";
  if (!single.is_array()) throw_invalid(sw.str() + " must be an array");
  const Json empty = Json::object();
  const Json& specials = j.contains("special_tokens") ? j["special_tokens"] : empty;
  std::vector<std::int32_t> before, after;
  bool seen_sequence = false;
  for (std::size_t i = 0; i < single.size(); ++i) {
    const Json& piece = single[i];
    if (piece.is_object() && piece.contains("Sequence")) {
      if (seen_sequence)
        throw_unsupported(sw[i].str() + ": a template with the sequence twice is not supported");
      seen_sequence = true;
      continue;
    }
    if (!piece.is_object() || !piece.contains("SpecialToken"))
      throw_invalid(sw[i].str() + " must be {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    const std::string name = require_string(piece["SpecialToken"], "id", sw[i] / "SpecialToken");
    if (!specials.is_object() || !specials.contains(name))
      throw_invalid(sw[i].str() + ": special token '" + name +
                    "' is not listed in post_processor.special_tokens");
    const Where tw = where / "special_tokens" / name;
    const Json& ids = require(specials[name], "ids", tw);
    if (!ids.is_array()) throw_invalid((tw / "ids").str() + " must be an array of ids");
    for (const Json& id : ids) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
          id.get<std::int64_t>() > INT32_MAX)
        throw_invalid((tw / "ids").str() + " must hold non-negative integer ids");
      (seen_sequence ? after : before).push_back(static_cast<std::int32_t>(id.get<std::int64_t>()));
    }
  }
  if (!seen_sequence) throw_invalid(sw.str() + " has no {\"Sequence\": {\"id\": \"A\"}} entry");
  return std::make_unique<WrapProcessor>(std::move(before), std::move(after));
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const Json& j, const Where& where) {
  const std::string type = type_of(j, where);
  if (type == "TemplateProcessing") return make_template(j, where);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    return std::make_unique<WrapProcessor>(
        std::vector<std::int32_t>{token_pair_id(j, "cls", where)},
        std::vector<std::int32_t>{token_pair_id(j, "sep", where)});
  }
  if (type == "ByteLevel")
    return std::make_unique<WrapProcessor>(std::vector<std::int32_t>{},
                                           std::vector<std::int32_t>{});
  if (type == "Sequence") {
    const Json& list = require(j, "processors", where);
    if (!list.is_array()) throw_invalid((where / "processors").str() + " must be an array");
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (std::size_t i = 0; i < list.size(); ++i)
      steps.push_back(make_post_processor(list[i], (where / "processors")[i]));
    return std::make_unique<SequenceProcessor>(std::move(steps));
  }
  unknown_type(type, where,
               "TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence");
}

}  // namespace tessera::hf::tokenizer_detail
