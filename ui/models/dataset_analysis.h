#pragma once
// The wizard's Dataset page analysis: the engine's reader, format detection and preview
// (first rows, token-length statistics through the chosen model's tokenizer and template).
// Runs in a worker thread; the result is plain data the page shows.
#include <QList>
#include <QMap>
#include <QString>
#include <QStringList>
#include <cstdint>
#include <vector>

#include "job/job_spec.h"

namespace tessera::ui {

struct DatasetRequest {
  QString file;       // the file, or the first of `files`
  QStringList files;  // several files of one type read as one dataset (a Hub split's shards)
  QStringList validation_files;    // a Hub dataset's validation split: its rows are checked too
  QString model_folder;            // empty: no token statistics
  QString format = "auto";         // auto | text | instruction | chat | classification
  QMap<QString, QString> columns;  // role → column chosen by the user
  std::int64_t max_length = 512;
  bool packing = true;
};

struct DatasetAnalysis {
  QString file;
  QStringList files;  // every file read (one unless the request named several)
  QString error;      // non-empty: the dataset (or the mapping) cannot be used; message + hint
  QString file_type;
  std::uint64_t num_rows = 0;
  QStringList columns;
  QList<QStringList> rows;          // the first rows, as text
  QString format;                   // resolved kind
  QMap<QString, QString> mapping;   // resolved role → column
  QMap<QString, QString> detected;  // what detection alone gives for that kind
  QString detected_format;          // what detection gives with format "auto" ("" if none)
  QString description;
  QString skipped;  // skipped-rows summary
  // The format's required roles that no column plays (the mapping the user has to finish);
  // `format` and `mapping` then hold the format meant and the roles found so far.
  QStringList missing_roles;
  // Detection read the rows as `format` although a column's name says they were meant as
  // `suggested_format`, whose other columns no row has: what the page says about it.
  QString suggested_format;
  QString format_note;
  // Every row built as the run builds it (the reader's and the example builder's rules, with
  // the request's max_length and packing): the rows the run fails on without
  // dataset.skip_bad_rows and skips with it. Checked when a model's tokenizer was given.
  bool rows_checked = false;
  std::uint64_t bad_rows = 0;
  QStringList bad_reasons;        // the first few, each naming the file and line
  std::uint64_t good_rows = 0;    // rows that build
  std::uint64_t good_tokens = 0;  // their tokens, for packing's one-block check
  // The model's context: positions it was trained on, and whether more cannot run at all
  // (learned position embeddings: gpt2, bert) rather than run untrained (rotary: llama, …).
  std::int64_t model_context = 0;
  bool learned_positions = false;
  QString model_type;
  // Token lengths over a sample (empty when no model was given or tokenizing failed).
  QString token_error;
  std::uint64_t measured = 0;
  bool all_rows = false;
  std::uint64_t min_len = 0, max_len = 0, p50 = 0, p95 = 0;
  double mean_len = 0;
  std::uint64_t truncated = 0;
  std::vector<std::uint64_t> bin_edges;
  std::vector<std::uint64_t> bin_counts;
  double truncated_share() const { return measured ? double(truncated) / double(measured) : 0; }
};

// The roles a format has, in display order (instruction: with prompt/completion when
// `mapping` uses them).
QStringList roles_of(const QString& format, const QMap<QString, QString>& mapping);

// Never throws; reads and tokenizes: call it off the GUI thread.
DatasetAnalysis analyze_dataset(const DatasetRequest& request);

// How lists name a job's dataset: "org/data · config" for a Hub dataset, else its first file's
// name ("" when it has none).
QString dataset_display_name(const job::DatasetSpec& spec);

}  // namespace tessera::ui
