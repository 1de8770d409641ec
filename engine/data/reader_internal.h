#pragma once
// Shared by the readers; internal to engine/data.
#include <filesystem>
#include <memory>

#include "data/dataset.h"

namespace tessera::data::detail {

// Defined in parquet_reader.cpp; throws a clear error when Parquet support was not built.
std::unique_ptr<DatasetReader> open_parquet(const std::filesystem::path& path,
                                            const ReadOptions& options);

}  // namespace tessera::data::detail
