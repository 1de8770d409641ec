#include "data/preview.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace tessera::data {

namespace {

// Cuts at a UTF-8 character boundary at or below `max_chars` bytes.
std::string clip(std::string text, std::size_t max_chars) {
  if (text.size() <= max_chars) return text;
  std::size_t cut = max_chars;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  text.resize(cut);
  return text + "…";
}

std::size_t nearest_rank(const std::vector<std::size_t>& sorted, double p) {
  const auto n = static_cast<double>(sorted.size());
  auto rank = static_cast<std::size_t>(std::ceil(p * n));
  rank = std::clamp<std::size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

}  // namespace

LengthStats length_stats(std::vector<std::size_t> lengths, std::size_t bins) {
  LengthStats s;
  s.count = lengths.size();
  if (lengths.empty()) return s;
  std::sort(lengths.begin(), lengths.end());
  s.min = lengths.front();
  s.max = lengths.back();
  long double total = 0;
  for (auto l : lengths) total += static_cast<long double>(l);
  s.mean = static_cast<double>(total / static_cast<long double>(lengths.size()));
  s.p50 = nearest_rank(lengths, 0.50);
  s.p95 = nearest_rank(lengths, 0.95);
  bins = std::max<std::size_t>(bins, 1);
  const std::size_t span = s.max - s.min + 1;
  bins = std::min(bins, span);
  const std::size_t width = (span + bins - 1) / bins;  // ceil, so bins cover [min, max]
  bins = (span + width - 1) / width;
  for (std::size_t i = 0; i <= bins; ++i) s.histogram.edges.push_back(s.min + i * width);
  s.histogram.counts.assign(bins, 0);
  for (auto l : lengths) s.histogram.counts[std::min((l - s.min) / width, bins - 1)]++;
  return s;
}

DatasetPreview preview_dataset(const DatasetReader& reader, const DatasetFormat& format,
                               const ExampleBuilder* builder, const PreviewOptions& options) {
  DatasetPreview p;
  p.file_type = reader.file_type();
  p.num_rows = reader.num_rows();
  p.columns = reader.columns();
  p.format = format;
  p.skipped = reader.skipped();
  const std::size_t shown = std::min(options.rows, reader.num_rows());
  for (std::size_t i = 0; i < shown; ++i) {
    const Row row = reader.row(i);
    std::vector<std::string> cells;
    for (const auto& column : p.columns) {
      auto it = row.find(column);
      cells.push_back(it == row.end() ? std::string()
                                      : clip(value_to_text(*it), options.max_cell_chars));
    }
    p.rows.push_back(std::move(cells));
  }
  p.description = format.describe() + "; " + std::to_string(p.num_rows) +
                  (p.num_rows == 1 ? " row; " : " rows; ") + p.file_type;
  if (builder) {
    const std::size_t n = reader.num_rows();
    const bool all = n <= options.sample_rows;
    const std::size_t sample = all ? n : options.sample_rows;
    std::vector<std::size_t> lengths;
    std::size_t truncated = 0;
    const std::size_t max_length = builder->options().max_length;
    for (std::size_t k = 0; k < sample; ++k) {
      // Evenly spaced: floor(k * n / sample), split so that it cannot overflow.
      const std::size_t index = all ? k : k * (n / sample) + k * (n % sample) / sample;
      try {
        TokenizedExample ex = builder->build(reader.row(index), reader.row_location(index));
        if (max_length && ex.input_ids.size() > max_length) ++truncated;
        lengths.push_back(ex.input_ids.size());
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::InvalidInput) throw;
        p.skipped.add(e.what());
      }
    }
    LengthStats stats = length_stats(std::move(lengths), options.bins);
    stats.sampled_rows = sample;
    stats.all_rows = all;
    stats.truncated = truncated;
    p.token_lengths = stats;
  }
  return p;
}

}  // namespace tessera::data
