#include "ui/models/dataset_analysis.h"

#include <QObject>
#include <algorithm>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "data/dataset.h"
#include "data/format.h"
#include "data/preview.h"
#include "data/split.h"
#include "hf/chat/tokenizer_config.h"
#include "hf/config.h"
#include "hf/families.h"
#include "hf/tokenizer/tokenizer.h"
#include "ui/utility/error_text.h"

namespace tessera::ui {

namespace fs = std::filesystem;

namespace {

QMap<QString, QString> to_qmap(const std::map<std::string, std::string>& m) {
  QMap<QString, QString> out;
  for (const auto& [k, v] : m) out.insert(QString::fromStdString(k), QString::fromStdString(v));
  return out;
}

// An engine error in the studio's words: the reader's advice for a file that is not UTF-8 is a
// command line; here it is what to do in an editor.
QString gui_error_text(const Error& error) {
  if (error.hint().find("iconv") == std::string::npos) return error_text(error);
  return QString::fromStdString(error.what()) + "\n" +
         QObject::tr(
             "Save the file as UTF-8 (in a text editor: Save As…, encoding UTF-8), then "
             "choose it again.");
}

// Whether the run's truncation to `max_length` leaves `ex` no token to learn from: the builder
// truncates causal examples and then rejects one whose labels are all ignored.
bool truncation_leaves_no_loss(const data::TokenizedExample& ex, std::size_t max_length) {
  if (ex.labels.empty() || ex.input_ids.size() <= max_length) return false;
  return std::all_of(ex.labels.begin(), ex.labels.begin() + std::ptrdiff_t(max_length),
                     [](std::int32_t label) { return label == data::kIgnoreIndex; });
}

// Every row of `reader` tokenized once: `full` builds it untruncated (its length, for the
// statistics); a row that fails there, or that the run's truncation leaves without a loss token,
// goes through `run` (the run's own builder) for the verdict and the words the run would use.
// Returns false when cancelled.
bool check_rows(const data::DatasetReader& reader, const data::ExampleBuilder& full,
                const data::ExampleBuilder& run, bool validation_file,
                std::vector<std::uint32_t>& tokens, DatasetAnalysis& a,
                AnalysisProgress* progress) {
  const bool truncates = !run.packs() && run.options().max_length > 0;
  tokens.assign(reader.num_rows(), DatasetAnalysis::kBadRow);
  for (std::size_t i = 0; i < reader.num_rows(); ++i) {
    if (progress) {
      if (progress->cancel.load(std::memory_order_relaxed)) return false;
      progress->rows_done.fetch_add(1, std::memory_order_relaxed);
    }
    const data::Row row = reader.row(i);
    const std::string location = reader.row_location(i);
    std::optional<data::TokenizedExample> example;
    try {
      example = full.build(row, location);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::InvalidInput) throw;
    }
    if (!example || (truncates && truncation_leaves_no_loss(*example, run.options().max_length))) {
      try {
        const data::TokenizedExample built = run.build(row, location);
        if (!example) example = built;
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::InvalidInput) throw;
        if (a.first_bad_rows.size() < DatasetAnalysis::kKeptReasons)
          a.first_bad_rows.push_back({i, validation_file, QString::fromStdString(e.what())});
        continue;
      }
    }
    tokens[i] = std::uint32_t(
        std::min<std::size_t>(example->input_ids.size(), DatasetAnalysis::kBadRow - 1));
  }
  return true;
}

QString column_list(const std::vector<std::string>& columns) {
  QStringList names;
  for (const auto& c : columns) names << QString::fromStdString(c);
  return names.join(", ");
}

// The roles a column's name points at for `kind`, beyond what a plain-text reading uses: a
// column named like an instruction, prompt, answer or label.
bool named_for(data::FormatKind kind, const std::map<std::string, std::string>& roles) {
  if (kind == data::FormatKind::Classification) return roles.count("label") > 0;
  return kind == data::FormatKind::Instruction && !roles.empty();
}

// When detection fell back to plain text although a column's name says the rows are
// instructions or labelled texts whose other column no row has: what to tell the user.
QString partial_format_note(const std::vector<std::string>& columns,
                            const data::DatasetFormat& format, const DatasetRequest& request,
                            QString& suggested) {
  if (format.kind != data::FormatKind::Text || request.format != "auto" ||
      !request.columns.isEmpty())
    return {};
  for (auto kind : {data::FormatKind::Instruction, data::FormatKind::Classification}) {
    const data::DatasetFormat partial{kind, data::roles_by_name(kind, columns)};
    const auto missing = data::missing_roles(partial);
    if (!named_for(kind, partial.columns) || missing.empty()) continue;
    suggested = data::format_kind_name(kind);
    QStringList found;
    for (const auto& [role, column] : partial.columns)
      found << "'" + QString::fromStdString(column) + "'";
    return QObject::tr(
               "The column %1 looks like part of a %2 dataset, but no row has a column "
               "for '%3' (the columns are: %4), so the rows are read as plain text. To "
               "train on them as %2 data, use the %2 format and choose the column for "
               "each role.")
        .arg(found.join(", "), suggested, QString::fromStdString(missing.front()),
             column_list(columns));
  }
  return {};
}

// The format the user means when resolving failed: the one chosen, else the one the mapped
// roles belong to, else one a column's name points at (none when nothing does).
std::optional<data::FormatKind> meant_format(const std::vector<std::string>& columns,
                                             const DatasetRequest& request) {
  if (request.format != "auto") return data::parse_format_kind(request.format.toStdString());
  const auto mapped = [&](const char* role) { return !request.columns.value(role).isEmpty(); };
  if (mapped("chosen") || mapped("rejected")) return data::FormatKind::Preference;
  if (mapped("completion") && mapped("label")) return data::FormatKind::Unpaired;
  if (mapped("messages")) return data::FormatKind::Chat;
  if (mapped("instruction") || mapped("output") || mapped("prompt") || mapped("completion") ||
      mapped("input"))
    return data::FormatKind::Instruction;
  if (mapped("label")) return data::FormatKind::Classification;
  for (auto kind : {data::FormatKind::Instruction, data::FormatKind::Classification})
    if (named_for(kind, data::roles_by_name(kind, columns))) return kind;
  return std::nullopt;
}

// resolve_format failed: the format meant, the roles found (detected by name, or chosen), and
// in GUI words what is missing, so the page keeps the column drop-downs to finish the mapping.
void explain_unresolved_format(const std::vector<std::string>& columns,
                               const DatasetRequest& request, const Error& error,
                               DatasetAnalysis& a) {
  std::optional<data::FormatKind> kind;
  try {
    kind = meant_format(columns, request);
  } catch (const Error&) {
  }
  if (!kind) {
    a.error = QObject::tr(
                  "The format cannot be told from the column names (%1): choose the "
                  "format above, then the column for each of its roles.")
                  .arg(column_list(columns));
    return;
  }
  data::DatasetFormat partial{*kind, data::roles_by_name(*kind, columns)};
  for (auto it = request.columns.begin(); it != request.columns.end(); ++it)
    if (!it.value().isEmpty() &&
        std::find(columns.begin(), columns.end(), it.value().toStdString()) != columns.end())
      partial.columns[it.key().toStdString()] = it.value().toStdString();
  if (*kind == data::FormatKind::Instruction &&
      (partial.columns.count("prompt") || partial.columns.count("completion"))) {
    partial.columns.erase("instruction");
    partial.columns.erase("output");
    partial.columns.erase("input");
  }
  const auto missing = data::missing_roles(partial);
  a.format = data::format_kind_name(*kind);
  a.mapping = to_qmap(partial.columns);
  if (missing.empty()) {  // something else is wrong with the mapping: the engine says what
    a.error = error_text(error);
    return;
  }
  for (const auto& role : missing) a.missing_roles << QString::fromStdString(role);
  a.error = QObject::tr(
                "No column was found for the %1 format's '%2' role: choose it under "
                "\"Format and columns\" (the columns are: %3).")
                .arg(a.format, a.missing_roles.join("', '"), column_list(columns));
}

}  // namespace

QString dataset_display_name(const job::DatasetSpec& spec) {
  if (!spec.hub_id.empty())
    return QString::fromStdString(spec.hub_id) +
           (spec.config.empty() ? QString() : " · " + QString::fromStdString(spec.config));
  if (spec.train_files.empty()) return {};
  return QString::fromStdString(fs::path(spec.train_files.front()).filename().string());
}

QStringList roles_of(const QString& format, const QMap<QString, QString>& mapping) {
  if (format == "chat") return {"messages"};
  if (format == "classification") return {"text", "label"};
  if (format == "preference") return {"prompt", "chosen", "rejected"};
  if (format == "unpaired") return {"prompt", "completion", "label"};
  if (format == "instruction") {
    if (mapping.contains("prompt") || mapping.contains("completion"))
      return {"prompt", "completion"};
    return {"instruction", "input", "output"};
  }
  return {"text"};
}

DatasetAnalysis analyze_dataset(const DatasetRequest& request) {
  DatasetAnalysis a;
  a.file = request.file;
  a.max_length = request.max_length;
  a.packing = request.packing;
  a.files = request.files.isEmpty() ? QStringList{request.file} : request.files;
  std::unique_ptr<data::DatasetReader> reader;
  try {
    std::vector<fs::path> paths;
    for (const QString& f : a.files) paths.emplace_back(f.toStdString());
    // Bad rows skipped and counted here; the page blocks them unless the run skips them too.
    data::ReadOptions read_options;
    read_options.skip_bad_rows = true;
    reader = data::open_datasets(paths, read_options);
  } catch (const Error& e) {
    a.error = gui_error_text(e);
    return a;
  } catch (const std::exception& e) {
    a.error = QString::fromStdString(e.what());
    return a;
  }
  a.file_type = QString::fromStdString(reader->file_type());
  a.num_rows = reader->num_rows();
  for (const auto& c : reader->columns()) a.columns << QString::fromStdString(c);
  const std::string source = request.file.toStdString();
  try {
    a.detected_format = data::format_kind_name(data::detect_format(reader->columns(), source).kind);
  } catch (const Error&) {
  }

  data::DatasetFormat format;
  try {
    std::optional<data::FormatKind> kind;
    if (request.format != "auto") kind = data::parse_format_kind(request.format.toStdString());
    std::map<std::string, std::string> overrides;
    for (auto it = request.columns.begin(); it != request.columns.end(); ++it)
      if (!it.value().isEmpty()) overrides[it.key().toStdString()] = it.value().toStdString();
    format = data::resolve_format(reader->columns(), source, kind, overrides);
    a.format = data::format_kind_name(format.kind);
    a.mapping = to_qmap(format.columns);
    try {
      a.detected =
          to_qmap(data::resolve_format(reader->columns(), source, format.kind, {}).columns);
    } catch (const Error&) {
    }
    a.format_note = partial_format_note(reader->columns(), format, request, a.suggested_format);
  } catch (const Error& e) {
    explain_unresolved_format(reader->columns(), request, e, a);
  }

  data::PreviewOptions options;
  options.rows = 50;
  options.max_cell_chars = 300;
  a.unreadable_rows = reader->skipped().count;
  for (const std::string& reason : reader->skipped().first_reasons)
    a.unreadable_reasons << QString::fromStdString(reason);

  // The tokenizer (when a model is chosen) checks the rows and gives the token lengths.
  std::optional<hf::Tokenizer> tokenizer;
  std::optional<data::ExampleBuilder> full_builder;
  std::optional<data::ExampleBuilder> run_builder;
  if (!request.model_folder.isEmpty()) {
    try {
      const fs::path dir = request.model_folder.toStdString();
      if (fs::exists(dir / "config.json")) {
        const auto mc = hf::load_model_config(dir / "config.json");
        a.model_context = mc.max_position_embeddings;
        a.model_type = QString::fromStdString(mc.model_type);
        a.learned_positions = hf::family_of(mc).learned_positions;
      }
    } catch (const Error&) {
      // The Model page reports an unreadable config; the context stays unknown here.
    }
  }
  if (a.error.isEmpty() && !request.model_folder.isEmpty()) {
    try {
      const fs::path dir = request.model_folder.toStdString();
      tokenizer.emplace(hf::Tokenizer::from_folder(dir));
      auto config = hf::load_tokenizer_config_from_folder(dir);
      data::LabelSet labels;
      if (format.kind == data::FormatKind::Classification) {
        std::vector<std::string> id2label;
        if (fs::exists(dir / "config.json")) {
          auto mc = hf::load_model_config(dir / "config.json");
          for (const auto& [id, name] : mc.id2label) id2label.push_back(name);
        }
        labels = data::derive_labels(*reader, format.columns.at("label"), id2label);
      }
      data::TokenizeOptions run_options;  // as the runner's prepare_data sets them
      run_options.max_length = static_cast<std::size_t>(request.max_length);
      run_options.pack = request.packing;
      run_builder.emplace(format, *tokenizer, config, run_options, labels);
      // Untruncated and unpacked, so lengths beyond max_length are seen.
      data::TokenizeOptions full_options = run_options;
      full_options.max_length = 0;
      full_options.pack = false;
      full_builder.emplace(format, *tokenizer, config, full_options, labels);
    } catch (const Error& e) {
      a.token_error = error_text(e);
    } catch (const std::exception& e) {
      a.token_error = QString::fromStdString(e.what());
    }
  }

  try {
    const auto preview = data::preview_dataset(
        *reader, a.error.isEmpty() ? format : data::DatasetFormat{}, nullptr, options);
    for (const auto& row : preview.rows) {
      QStringList cells;
      for (const auto& cell : row) cells << QString::fromStdString(cell);
      a.rows << cells;
    }
    if (a.error.isEmpty()) a.description = QString::fromStdString(preview.description);
    a.skipped = QString::fromStdString(preview.skipped.summary());
    if (run_builder) {
      // The run tokenizes the validation files with the same builder and the same rule.
      std::unique_ptr<data::DatasetReader> validation;
      if (!request.validation_files.isEmpty()) {
        std::vector<fs::path> paths;
        for (const QString& f : request.validation_files) paths.emplace_back(f.toStdString());
        data::ReadOptions read_options;
        read_options.skip_bad_rows = true;
        validation = data::open_datasets(paths, read_options);
        a.unreadable_validation_rows = validation->skipped().count;
        for (const std::string& reason : validation->skipped().first_reasons)
          a.unreadable_reasons << QString::fromStdString(reason);
      }
      AnalysisProgress* progress = request.progress.get();
      if (progress)
        progress->rows_total = reader->num_rows() + (validation ? validation->num_rows() : 0);
      a.packs = run_builder->packs();
      const bool complete =
          check_rows(*reader, *full_builder, *run_builder, false, a.row_tokens, a, progress) &&
          (!validation || check_rows(*validation, *full_builder, *run_builder, true,
                                     a.validation_file_tokens, a, progress));
      a.cancelled = !complete;
      a.rows_checked = complete;
    }
  } catch (const Error& e) {
    if (a.error.isEmpty()) a.error = gui_error_text(e);
  } catch (const std::exception& e) {
    if (a.error.isEmpty()) a.error = QString::fromStdString(e.what());
  }
  count_shares(a, request.validation_files.isEmpty() ? request.validation_fraction : 0.0,
               request.seed);
  return a;
}

void count_shares(DatasetAnalysis& a, double validation_fraction, std::uint64_t seed) {
  a.counted_fraction = validation_fraction;
  a.counted_seed = seed;
  a.split_error.clear();
  a.training_rows = a.validation_rows = 0;
  a.training_bad_rows = a.validation_bad_rows = 0;
  a.good_rows = a.good_tokens = a.validation_good_rows = a.validation_good_tokens = 0;
  a.longest_example = a.longest_row = 0;
  a.measured = a.truncated = a.min_len = a.max_len = a.p50 = a.p95 = 0;
  a.mean_len = 0;
  a.all_rows = false;
  a.bin_edges.clear();
  a.bin_counts.clear();
  a.bad_reasons = a.unreadable_reasons;
  a.bad_rows = a.unreadable_rows + a.unreadable_validation_rows;
  if (!a.rows_checked) return;

  // The run's split (runner.cpp's prepare_data): over the readable rows, shuffled by the seed.
  const std::size_t n = a.row_tokens.size();
  std::vector<char> held_out(n, 0);
  if (a.validation_file_tokens.empty() && validation_fraction > 0 && n > 0) {
    try {
      data::SplitOptions split;
      split.validation_fraction = validation_fraction;
      split.shuffle = true;
      split.seed = seed;
      for (std::size_t i : data::split_rows(n, split).validation) held_out[i] = 1;
    } catch (const Error& e) {
      a.split_error = error_text(e);
    }
  }
  const auto max_length = std::uint64_t(std::max<std::int64_t>(a.max_length, 0));
  // The tokens of an example as the run builds it: packed documents whole, others truncated.
  const auto built_tokens = [&](std::uint64_t tokens) {
    return a.packs || max_length == 0 ? tokens : std::min(tokens, max_length);
  };
  std::vector<std::size_t> training_lengths;
  const auto count = [&](std::uint32_t tokens, bool validation) {
    (validation ? a.validation_rows : a.training_rows)++;
    if (tokens == DatasetAnalysis::kBadRow) {
      (validation ? a.validation_bad_rows : a.training_bad_rows)++;
      return;
    }
    a.longest_row = std::max<std::uint64_t>(a.longest_row, tokens);
    a.longest_example = std::max(a.longest_example, built_tokens(tokens));
    if (validation) {
      ++a.validation_good_rows;
      a.validation_good_tokens += built_tokens(tokens);
      return;
    }
    ++a.good_rows;
    a.good_tokens += built_tokens(tokens);
    training_lengths.push_back(tokens);
    if (!a.packs && max_length > 0 && tokens > max_length) ++a.truncated;
  };
  for (std::size_t i = 0; i < n; ++i) count(a.row_tokens[i], held_out[i] != 0);
  for (std::uint32_t tokens : a.validation_file_tokens) count(tokens, true);
  // Packed: every block is max_length tokens.
  if (a.packs && (a.good_tokens >= max_length || a.validation_good_tokens >= max_length))
    a.longest_example = max_length;
  a.bad_rows += a.training_bad_rows + a.validation_bad_rows;

  QStringList reasons;
  for (const auto& bad : a.first_bad_rows) {
    if (reasons.size() >= int(data::SkipReport::kMaxReasons)) break;
    const bool validation = bad.validation_file || (bad.index < n && held_out[bad.index] != 0);
    reasons << (validation ? QObject::tr("%1 (validation)").arg(bad.reason) : bad.reason);
  }
  a.bad_reasons = reasons + a.unreadable_reasons;

  const data::LengthStats stats = data::length_stats(std::move(training_lengths), 16);
  a.measured = stats.count;
  a.all_rows = true;
  a.min_len = stats.min;
  a.max_len = stats.max;
  a.p50 = stats.p50;
  a.p95 = stats.p95;
  a.mean_len = stats.mean;
  a.bin_edges.assign(stats.histogram.edges.begin(), stats.histogram.edges.end());
  a.bin_counts.assign(stats.histogram.counts.begin(), stats.histogram.counts.end());
}

}  // namespace tessera::ui
