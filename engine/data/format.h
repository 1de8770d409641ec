#pragma once
// Dataset formats (text, instruction, chat, classification): which columns play which role,
// detected from the column names or given by the caller, and how a row becomes a
// TokenizedExample with its loss mask.
//
// Layouts, in tokens (BOS = what the tokenizer's post-processor puts first, e.g. <s> for
// Llama, nothing for GPT-2; EOS = tokenizer_config's eos_token):
// - text, one record per sequence: BOS + text + EOS, truncated to max_length; loss on all.
// - text, packed: every document BOS + text + EOS, concatenated and cut into blocks of
//   exactly max_length tokens (the incomplete last block is dropped); loss on all.
// - instruction, with the model's chat template (when it has one): the chat format on
//   [user: instruction + "\n\n" + input, assistant: output]; loss on the assistant turn.
// - instruction, without a chat template:
//     BOS + "### Instruction:\n{instruction}\n\n[### Input:\n{input}\n\n]### Response:\n"
//     + output + EOS, loss on output + EOS.
//   prompt/completion pairs: BOS + prompt + completion + EOS, loss on completion + EOS.
// - chat: the messages rendered with the chat template; loss on the assistant turns. An
//   assistant turn's text is what rendering messages[0..k] adds to rendering messages[0..k)
//   with add_generation_prompt=true (so the generation prompt is not learned, the turn's end
//   marker is). The rendered text is tokenized piece by piece (without special-token
//   insertion, as apply_chat_template does), so piece borders are token borders.
// - classification: tokenizer(text) with special tokens; `label` is the class id.
// - preference (prompt, chosen, rejected), as TRL's DPOTrainer tokenizes pairs: text pairs are
//   tokenizer(prompt) and tokenizer(prompt + completion + EOS text unless it ends with it), with
//   special tokens; message lists (chat) are the template's rendering of the prompt with the
//   generation prompt and of prompt + completion messages. The completion starts where the
//   prompt's ids and prompt + completion's part (the shorter agreement of chosen and
//   rejected), so a token merged across the border belongs to the completion. Each of the two
//   rows is prompt + completion, loss on the completion, truncated to max_length; a prompt that
//   fills max_length leaves no completion and is an error.
// - unpaired (prompt, completion, label: KTO's desirable or not) as the preference format's rows,
//   one completion each, left whole: its prompt length is kept, and the batch cuts each row (and
//   the mismatched rows KTO adds) to max_length, as TRL's KTO collator does.
// Truncation keeps the first max_length tokens.
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "hf/chat/chat_template.h"
#include "hf/chat/tokenizer_config.h"
#include "hf/tokenizer/tokenizer.h"

namespace tessera::data {

inline constexpr std::int32_t kIgnoreIndex = -100;

enum class FormatKind { Text, Instruction, Chat, Classification, Preference, Unpaired };
const char* format_kind_name(FormatKind kind);
// "text", "instruction", "chat", "classification", "preference", "unpaired"; throws
// tessera::Error otherwise.
FormatKind parse_format_kind(const std::string& name);

// The format and which column plays each role. Roles: text: "text"; instruction:
// "instruction", "input" (optional), "output" — or "prompt", "completion"; chat:
// "messages"; classification: "text", "label"; preference: "prompt", "chosen", "rejected";
// unpaired: "prompt", "completion", "label" (true: desirable).
struct DatasetFormat {
  FormatKind kind = FormatKind::Text;
  std::map<std::string, std::string> columns;  // role -> column name
  std::string describe() const;  // e.g. "instruction (instruction='q', input='ctx', output='a')"
};

// Detects the format from column names (case-insensitive): prompt + chosen + rejected →
// preference; prompt + completion + label → unpaired; messages/conversations/… → chat;
// instruction + output/response → instruction; prompt + completion/response → instruction;
// text/sentence + label → classification; text/content/document (or a single column) → text.
// Throws tessera::Error naming `source` and listing the columns when nothing fits.
DatasetFormat detect_format(const std::vector<std::string>& columns, const std::string& source);

// The columns whose names say they play a role of `kind` (case-insensitive aliases, as
// detect_format uses them): possibly not every required role.
std::map<std::string, std::string> roles_by_name(FormatKind kind,
                                                 const std::vector<std::string>& columns);
// The required roles `format` has no column for, e.g. {"output"}.
std::vector<std::string> missing_roles(const DatasetFormat& format);
// Whether rows with `columns` can be read by `format` (another file's, e.g. validation files read
// by the training data's format): the first column it cannot do without that `columns` lack, as
// {role, column}; nothing when none is missing (an optional role, as instruction's input, may be).
std::optional<std::pair<std::string, std::string>> first_missing_column(
    const DatasetFormat& format, const std::vector<std::string>& columns);

// The caller's choice: `kind` (or detection when empty) and role -> column overrides. Every
// required role must map to an existing column; throws naming the role and the columns.
DatasetFormat resolve_format(const std::vector<std::string>& columns, const std::string& source,
                             std::optional<FormatKind> kind,
                             const std::map<std::string, std::string>& overrides = {});

struct TokenizedExample {
  std::vector<std::int32_t> input_ids;
  std::vector<std::int32_t> labels;   // same length; kIgnoreIndex where no loss. Empty for
                                      // classification.
  std::optional<std::int64_t> label;  // classification class id
  // Preference pairs: input_ids / labels are prompt + chosen, these prompt + rejected.
  std::vector<std::int32_t> rejected_input_ids;
  std::vector<std::int32_t> rejected_labels;
  bool is_pair() const { return !rejected_input_ids.empty(); }
  // Unpaired preference (KTO): whether the completion is desirable, and where it starts.
  std::optional<bool> desirable;
  std::size_t prompt_length = 0;
};

// Classification labels: integer labels are used as is; string labels map through `names`
// (the model's id2label when given, else the sorted distinct values of the column).
struct LabelSet {
  bool integer = true;
  std::vector<std::string> names;  // id -> name (for string labels, or from id2label)
  std::string describe() const;
};
// Scans the label column of every row. Throws naming the row for a value that is neither a
// string nor an integer, or a string not in `id2label` when one is given.
LabelSet derive_labels(const DatasetReader& reader, const std::string& column,
                       const std::vector<std::string>& id2label = {});

struct TokenizeOptions {
  std::size_t max_length = 1024;  // truncation / block size; 0 = no truncation (no packing)
  bool pack = true;               // text format: pack documents into max_length blocks
  bool use_chat_template = true;  // instruction format: render with the template if any
};

class ExampleBuilder {
 public:
  // `config` supplies eos/bos and the chat template (chat needs one; see the layouts above).
  // `tokenizer` is borrowed: it must outlive the builder.
  ExampleBuilder(DatasetFormat format, const hf::Tokenizer& tokenizer, hf::TokenizerConfig config,
                 TokenizeOptions options = {}, LabelSet labels = {});

  // One row -> one example (text: one document's tokens, unpacked, untruncated when
  // packing; use Packer). Throws tessera::Error naming `location` for a missing column, a
  // wrong value type, an unknown label, or an example with no loss token left.
  TokenizedExample build(const Row& row, const std::string& location) const;

  const DatasetFormat& format() const { return format_; }
  const TokenizeOptions& options() const { return options_; }
  bool packs() const;  // text format with packing on
  std::optional<std::int32_t> eos_id() const { return eos_id_; }
  bool uses_chat_template() const;

  // The chat path on already-normalized messages (role, content); exposed for tests.
  TokenizedExample build_chat(const nlohmann::ordered_json& messages,
                              const std::string& location) const;

 private:
  std::vector<std::int32_t> encode(const std::string& text) const;  // no special tokens
  // The chat template rendered for the row at `location`: its errors (a template that raises,
  // e.g. on roles that do not alternate) name the row first.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const std::string& location) const;
  TokenizedExample causal(std::vector<std::int32_t> prompt, std::vector<std::int32_t> response,
                          const std::string& location) const;
  TokenizedExample build_pair(const Row& row, const std::string& location) const;
  TokenizedExample build_unpaired(const Row& row, const std::string& location) const;
  // A preference row's prompt and prompt + completion ids (TRL's tokenization), for one or more
  // completions; `roles` name the completion columns.
  struct PromptAndCompletions {
    std::vector<std::int32_t> prompt;
    std::vector<std::vector<std::int32_t>> with_completion;
    std::size_t prompt_length = 0;  // where the completions start (the shortest agreement)
  };
  PromptAndCompletions prompt_and_completions(const Row& row, const std::string& location,
                                              const std::vector<const char*>& roles) const;
  void truncate(TokenizedExample& ex) const;

  DatasetFormat format_;
  const hf::Tokenizer* tokenizer_;
  hf::TokenizerConfig config_;
  TokenizeOptions options_;
  LabelSet labels_;
  std::optional<hf::ChatTemplate> template_;
  std::vector<std::int32_t> bos_prefix_;
  std::optional<std::int32_t> eos_id_;
};

// Packs documents (each already BOS + text + EOS) into blocks of exactly `block_size`.
class Packer {
 public:
  explicit Packer(std::size_t block_size);
  void add(const std::vector<std::int32_t>& document);
  // Complete blocks so far (labels = input_ids); the tail waits for more documents.
  std::vector<TokenizedExample> take_blocks();
  std::size_t pending_tokens() const { return pending_.size(); }  // dropped at the end

 private:
  std::size_t block_size_;
  std::vector<std::int32_t> pending_;
  std::vector<TokenizedExample> ready_;
};

struct TokenizedDataset {
  std::vector<TokenizedExample> examples;
  SkipReport skipped;
  std::size_t dropped_tail_tokens = 0;  // packing: tokens of the incomplete last block
};

// Tokenizes the rows `indices` (in that order) of `reader`. Bad rows throw (the first bad one in
// the file's order, whatever the order of `indices`), or are skipped and reported when
// `skip_bad_rows`. `purpose` names the examples in the error when none are left ("training",
// "validation").
TokenizedDataset tokenize_rows(const DatasetReader& reader, const std::vector<std::size_t>& indices,
                               const ExampleBuilder& builder, bool skip_bad_rows,
                               const std::string& purpose = "training");

// Chat messages from a row value: [{role, content}, …], also ShareGPT's [{from, value}, …]
// (human→user, gpt→assistant). Throws naming `location` for anything else.
nlohmann::ordered_json normalize_messages(const nlohmann::ordered_json& value,
                                          const std::string& location);

}  // namespace tessera::data
