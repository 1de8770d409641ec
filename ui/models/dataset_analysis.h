#pragma once
// The wizard's Dataset page analysis: the engine's reader, format detection and preview
// (first rows, token-length statistics through the chosen model's tokenizer and template).
// Runs in a worker thread; the result is plain data the page shows.
#include <QList>
#include <QMap>
#include <QString>
#include <QStringList>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "job/job_spec.h"

namespace tessera::ui {

// Shared between the page and the analysis while it runs: how far the row check is, and a
// request to stop (the page's choices changed: this answer is no longer wanted).
struct AnalysisProgress {
  std::atomic<std::uint64_t> rows_done{0};
  std::atomic<std::uint64_t> rows_total{0};  // 0 until the file is read and the check starts
  std::atomic<bool> cancel{false};
};

struct DatasetRequest {
  QString file;       // the file, or the first of `files`
  QStringList files;  // several files of one type read as one dataset (a Hub split's shards)
  QStringList validation_files;    // a Hub dataset's validation split: its rows are checked too
  QString model_folder;            // empty: no token statistics
  QString format = "auto";         // auto | text | instruction | chat | classification
  QMap<QString, QString> columns;  // role → column chosen by the user
  std::int64_t max_length = 512;
  bool packing = true;
  // The run's split of the training rows (no validation files): dataset.validation_split and
  // training.seed (data/split.h).
  double validation_fraction = 0;
  std::uint64_t seed = 42;
  std::shared_ptr<AnalysisProgress> progress;  // optional
};

struct DatasetAnalysis {
  QString file;
  QStringList files;  // every file read (one unless the request named several)
  QString error;      // non-empty: the dataset (or the mapping) cannot be used; message + hint
  QString file_type;
  std::uint64_t num_rows = 0;  // readable rows of the training files
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
  // The request's sequence length and packing: what the rows were checked for.
  std::int64_t max_length = 0;
  bool packing = false;
  bool cancelled = false;  // stopped at the page's request: the check is incomplete

  // Every row built once as the run builds it (the reader's and the example builder's rules,
  // with the request's max_length and packing): the rows the run fails on without
  // dataset.skip_bad_rows and skips with it. Checked when a model's tokenizer was given.
  bool rows_checked = false;
  bool packs = false;  // text rows packed into blocks of max_length
  static constexpr std::uint32_t kBadRow = 0xffffffffu;
  // Per row of the training files (the reader's order) and of the validation files: its tokens
  // before truncation, or kBadRow for a row the run's builder rejects.
  std::vector<std::uint32_t> row_tokens;
  std::vector<std::uint32_t> validation_file_tokens;
  struct BadRow {
    std::size_t index = 0;
    bool validation_file = false;
    QString reason;  // the builder's, naming the file and line
  };
  std::vector<BadRow> first_bad_rows;  // in file order, the first kKeptReasons
  static constexpr std::size_t kKeptReasons = 64;
  // Rows that do not parse (skipped by the reader, before the split), with the first reasons.
  std::uint64_t unreadable_rows = 0;
  std::uint64_t unreadable_validation_rows = 0;
  QStringList unreadable_reasons;

  // Counted by count_shares for a split of the rows (as the run splits them), over the checked
  // rows above: nothing is tokenized again.
  double counted_fraction = -1;
  std::uint64_t counted_seed = 0;
  QString split_error;  // the run's split fails (no training row left): why
  std::uint64_t training_rows = 0, validation_rows = 0;  // readable rows of each share
  std::uint64_t training_bad_rows = 0, validation_bad_rows = 0;
  std::uint64_t bad_rows = 0;     // every row the run skips: unreadable and rejected, both shares
  QStringList bad_reasons;        // the first few, each naming the file and line (and share)
  std::uint64_t good_rows = 0;    // training rows that build
  std::uint64_t good_tokens = 0;  // their tokens as the run builds them (packing's blocks)
  std::uint64_t validation_good_rows = 0;
  std::uint64_t validation_good_tokens = 0;
  std::uint64_t longest_example = 0;  // the longest example the run builds, either share
  std::uint64_t longest_row = 0;      // the longest good row before truncation, either share
  // The model's context: positions it was trained on, and whether more cannot run at all
  // (learned position embeddings: gpt2, bert) rather than run untrained (rotary: llama, …).
  std::int64_t model_context = 0;
  bool learned_positions = false;
  QString model_type;
  // Token lengths of the training rows that train (bad rows and the validation share left out).
  QString token_error;
  std::uint64_t measured = 0;
  bool all_rows = false;
  std::uint64_t min_len = 0, max_len = 0, p50 = 0, p95 = 0;
  double mean_len = 0;
  std::uint64_t truncated = 0;  // of those, longer than max_length (not packing)
  std::vector<std::uint64_t> bin_edges;
  std::vector<std::uint64_t> bin_counts;
  double truncated_share() const { return measured ? double(truncated) / double(measured) : 0; }
};

// The roles a format has, in display order (instruction: with prompt/completion when
// `mapping` uses them).
QStringList roles_of(const QString& format, const QMap<QString, QString>& mapping);

// Never throws; reads and tokenizes every row once (progress and cancel through
// request.progress): call it off the GUI thread. Counts the shares for the request's split.
DatasetAnalysis analyze_dataset(const DatasetRequest& request);

// The split-dependent counts of `a` (its checked rows, nothing tokenized again) for the run's
// split with `validation_fraction` (ignored with validation files) and `seed`. Sorts the training
// lengths for the statistics: off the GUI thread for a large dataset.
void count_shares(DatasetAnalysis& a, double validation_fraction, std::uint64_t seed);

// How lists name a job's dataset: "org/data · config" for a Hub dataset, else its first file's
// name ("" when it has none).
QString dataset_display_name(const job::DatasetSpec& spec);

}  // namespace tessera::ui
