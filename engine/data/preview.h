#pragma once
// What the GUI shows before training: the first rows as text, the detected (or chosen)
// format and mapping, and token-length statistics over a sample of the rows.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/format.h"

namespace tessera::data {

struct LengthHistogram {
  std::vector<std::size_t> edges;   // bins.size() + 1 edges; bin i is [edges[i], edges[i+1])
  std::vector<std::size_t> counts;  // the last bin includes its upper edge
};

struct LengthStats {
  std::size_t count = 0;  // examples measured
  std::size_t sampled_rows = 0;
  bool all_rows = false;  // every row was measured, not a sample
  std::size_t min = 0, max = 0, p50 = 0, p95 = 0;
  double mean = 0.0;
  std::size_t truncated = 0;  // examples longer than max_length (before truncation)
  LengthHistogram histogram;
};

// Statistics of `lengths` (nearest-rank percentiles; `bins` equal-width bins over
// [min, max]). Empty input gives count 0.
LengthStats length_stats(std::vector<std::size_t> lengths, std::size_t bins = 20);

struct PreviewOptions {
  std::size_t rows = 20;             // rows shown
  std::size_t max_cell_chars = 500;  // longer cells end in "…"
  std::size_t sample_rows = 1000;    // rows measured for the statistics (all when fewer)
  std::size_t bins = 20;
};

struct DatasetPreview {
  std::string file_type;
  std::size_t num_rows = 0;
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;  // rows x columns, as text
  DatasetFormat format;
  std::string description;                   // "chat (messages='conversations'); 1200 rows; jsonl"
  std::optional<LengthStats> token_lengths;  // only when a builder was given
  SkipReport skipped;  // reader's skips plus rows that failed to tokenize in the sample
};

// `builder` may be null (no tokenizer chosen yet): then no token statistics. The sample is
// every row when num_rows <= sample_rows, else sample_rows rows evenly spaced over the file.
// Lengths are of unpacked, untruncated examples, so `truncated` counts what max_length cuts.
DatasetPreview preview_dataset(const DatasetReader& reader, const DatasetFormat& format,
                               const ExampleBuilder* builder, const PreviewOptions& options = {});

}  // namespace tessera::data
