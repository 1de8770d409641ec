#include "ui/models/dataset_analysis.h"

#include <filesystem>
#include <optional>

#include "core/error.h"
#include "data/dataset.h"
#include "data/format.h"
#include "data/preview.h"
#include "hf/chat/tokenizer_config.h"
#include "hf/config.h"
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
    reader = data::open_datasets(paths);
  } catch (const Error& e) {
    a.error = error_text(e);
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
  } catch (const Error& e) {
    a.error = error_text(e);
  }

  data::PreviewOptions options;
  options.rows = 50;
  options.max_cell_chars = 300;
  options.sample_rows = 2000;
  options.bins = 16;

  // The tokenizer (when a model is chosen) gives the token-length statistics.
  std::optional<hf::Tokenizer> tokenizer;
  std::optional<data::ExampleBuilder> builder;
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
    if (a.error.isEmpty()) a.error = error_text(e);
  } catch (const std::exception& e) {
    if (a.error.isEmpty()) a.error = q(e.what());
  }
  return a;
}

}  // namespace tessera::ui
