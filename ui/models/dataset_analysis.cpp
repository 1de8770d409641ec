#include "ui/models/dataset_analysis.h"

#include <QObject>
#include <algorithm>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "data/dataset.h"
#include "data/format.h"
#include "data/preview.h"
#include "hf/chat/tokenizer_config.h"
#include "hf/config.h"
#include "hf/families.h"
#include "hf/tokenizer/tokenizer.h"
#include "ui/utility/error_text.h"

namespace tessera::ui {

namespace fs = std::filesystem;

namespace {

QString q(const std::string& s) {
  return QString::fromStdString(s);
}

QMap<QString, QString> to_qmap(const std::map<std::string, std::string>& m) {
  QMap<QString, QString> out;
  for (const auto& [k, v] : m) out.insert(q(k), q(v));
  return out;
}

// Token lengths of a sample of rows evenly spaced over the file (all rows when few).
data::LengthStats measure_lengths(const data::DatasetReader& reader,
                                  const data::ExampleBuilder& builder,
                                  const data::PreviewOptions& options, std::int64_t max_length,
                                  data::SkipReport& skipped) {
  const std::size_t n = reader.num_rows();
  const bool all = n <= options.sample_rows;
  const std::size_t sample = all ? n : options.sample_rows;
  std::vector<std::size_t> lengths;
  std::size_t truncated = 0;
  for (std::size_t k = 0; k < sample; ++k) {
    const std::size_t index = all ? k : k * (n / sample) + k * (n % sample) / sample;
    try {
      auto ex = builder.build(reader.row(index), reader.row_location(index));
      if (max_length > 0 && ex.input_ids.size() > static_cast<std::size_t>(max_length)) ++truncated;
      lengths.push_back(ex.input_ids.size());
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::InvalidInput) throw;
      skipped.add(e.what());
    }
  }
  data::LengthStats stats = data::length_stats(std::move(lengths), options.bins);
  stats.sampled_rows = sample;
  stats.all_rows = all;
  stats.truncated = truncated;
  return stats;
}

// An engine error in the studio's words: the reader's advice for a file that is not UTF-8 is a
// command line; here it is what to do in an editor.
QString gui_error_text(const Error& error) {
  if (error.hint().find("iconv") == std::string::npos) return error_text(error);
  return q(error.what()) + "\n" +
         QObject::tr(
             "Save the file as UTF-8 (in a text editor: Save As…, encoding UTF-8), then "
             "choose it again.");
}

struct GoodRows {
  std::uint64_t rows = 0;
  std::uint64_t tokens = 0;
};

// Every row through the builder the run uses: the rows it would throw on (InvalidInput, as
// tokenize_rows skips them with skip_bad_rows), and the rows and tokens of the others.
GoodRows check_rows(const data::DatasetReader& reader, const data::ExampleBuilder& builder,
                    data::SkipReport& bad) {
  GoodRows good;
  for (std::size_t i = 0; i < reader.num_rows(); ++i) {
    try {
      good.tokens += builder.build(reader.row(i), reader.row_location(i)).input_ids.size();
      ++good.rows;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::InvalidInput) throw;
      bad.add(e.what());
    }
  }
  return good;
}

QString column_list(const std::vector<std::string>& columns) {
  QStringList names;
  for (const auto& c : columns) names << q(c);
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
    for (const auto& [role, column] : partial.columns) found << "'" + q(column) + "'";
    return QObject::tr(
               "The column %1 looks like part of a %2 dataset, but no row has a column "
               "for '%3' (the columns are: %4), so the rows are read as plain text. To "
               "train on them as %2 data, use the %2 format and choose the column for "
               "each role.")
        .arg(found.join(", "), suggested, q(missing.front()), column_list(columns));
  }
  return {};
}

// The format the user means when resolving failed: the one chosen, else the one the mapped
// roles belong to, else one a column's name points at (none when nothing does).
std::optional<data::FormatKind> meant_format(const std::vector<std::string>& columns,
                                             const DatasetRequest& request) {
  if (request.format != "auto") return data::parse_format_kind(request.format.toStdString());
  const auto mapped = [&](const char* role) { return !request.columns.value(role).isEmpty(); };
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
  if (partial.columns.count("prompt") || partial.columns.count("completion")) {
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
  for (const auto& role : missing) a.missing_roles << q(role);
  a.error = QObject::tr(
                "No column was found for the %1 format's '%2' role: choose it under "
                "\"Format and columns\" (the columns are: %3).")
                .arg(a.format, a.missing_roles.join("', '"), column_list(columns));
}

}  // namespace

QString dataset_display_name(const job::DatasetSpec& spec) {
  if (!spec.hub_id.empty())
    return q(spec.hub_id) + (spec.config.empty() ? QString() : " · " + q(spec.config));
  if (spec.train_files.empty()) return {};
  return q(fs::path(spec.train_files.front()).filename().string());
}

QStringList roles_of(const QString& format, const QMap<QString, QString>& mapping) {
  if (format == "chat") return {"messages"};
  if (format == "classification") return {"text", "label"};
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
    a.error = q(e.what());
    return a;
  }
  a.file_type = q(reader->file_type());
  a.num_rows = reader->num_rows();
  for (const auto& c : reader->columns()) a.columns << q(c);
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
  options.sample_rows = 2000;
  options.bins = 16;

  // The tokenizer (when a model is chosen) gives the token-length statistics.
  std::optional<hf::Tokenizer> tokenizer;
  std::optional<data::ExampleBuilder> builder;
  std::optional<data::ExampleBuilder> run_builder;
  if (!request.model_folder.isEmpty()) {
    try {
      const fs::path dir = request.model_folder.toStdString();
      if (fs::exists(dir / "config.json")) {
        const auto mc = hf::load_model_config(dir / "config.json");
        a.model_context = mc.max_position_embeddings;
        a.model_type = q(mc.model_type);
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
      data::TokenizeOptions tok;
      // Measured untruncated and unpacked, so lengths beyond max_length are seen (the
      // builder would otherwise cut them before they are counted).
      tok.max_length = 0;
      tok.pack = false;
      data::LabelSet labels;
      if (format.kind == data::FormatKind::Classification) {
        std::vector<std::string> id2label;
        if (fs::exists(dir / "config.json")) {
          auto mc = hf::load_model_config(dir / "config.json");
          for (const auto& [id, name] : mc.id2label) id2label.push_back(name);
        }
        labels = data::derive_labels(*reader, format.columns.at("label"), id2label);
      }
      builder.emplace(format, *tokenizer, config, tok, labels);
      data::TokenizeOptions run_options;  // as the runner's prepare_data sets them
      run_options.max_length = static_cast<std::size_t>(request.max_length);
      run_options.pack = request.packing;
      run_builder.emplace(format, *tokenizer, config, run_options, labels);
    } catch (const Error& e) {
      a.token_error = error_text(e);
    } catch (const std::exception& e) {
      a.token_error = q(e.what());
    }
  }

  try {
    auto preview = data::preview_dataset(
        *reader, a.error.isEmpty() ? format : data::DatasetFormat{}, nullptr, options);
    if (builder)
      preview.token_lengths =
          measure_lengths(*reader, *builder, options, request.max_length, preview.skipped);
    for (const auto& row : preview.rows) {
      QStringList cells;
      for (const auto& cell : row) cells << q(cell);
      a.rows << cells;
    }
    if (a.error.isEmpty()) a.description = q(preview.description);
    a.skipped = q(preview.skipped.summary());
    data::SkipReport bad = reader->skipped();
    if (run_builder) {
      const GoodRows good = check_rows(*reader, *run_builder, bad);
      a.good_rows = good.rows;
      a.good_tokens = good.tokens;
      // The run tokenizes the validation files with the same builder and the same rule.
      if (!request.validation_files.isEmpty()) {
        std::vector<fs::path> paths;
        for (const QString& f : request.validation_files) paths.emplace_back(f.toStdString());
        data::ReadOptions read_options;
        read_options.skip_bad_rows = true;
        const auto validation = data::open_datasets(paths, read_options);
        bad.merge(validation->skipped());
        check_rows(*validation, *run_builder, bad);
      }
      a.rows_checked = true;
    }
    a.bad_rows = bad.count;
    for (const std::string& reason : bad.first_reasons) a.bad_reasons << q(reason);
    if (preview.token_lengths) {
      const auto& s = *preview.token_lengths;
      a.measured = s.count;
      a.all_rows = s.all_rows;
      a.min_len = s.min;
      a.max_len = s.max;
      a.p50 = s.p50;
      a.p95 = s.p95;
      a.mean_len = s.mean;
      a.truncated = s.truncated;
      a.bin_edges.assign(s.histogram.edges.begin(), s.histogram.edges.end());
      a.bin_counts.assign(s.histogram.counts.begin(), s.histogram.counts.end());
      if (s.count == 0 && a.token_error.isEmpty())
        a.token_error = "no row of the sample could be tokenized; " + a.skipped;
    }
  } catch (const Error& e) {
    if (a.error.isEmpty()) a.error = gui_error_text(e);
  } catch (const std::exception& e) {
    if (a.error.isEmpty()) a.error = q(e.what());
  }
  return a;
}

}  // namespace tessera::ui
