#pragma once
// A finished run's base model: the folder its job spec trained from, for the chat pane's
// side-by-side answers and the export dialog's default precision.
#include <QString>

#include "ui/models/runs_db.h"

namespace tessera::ui {

// The job spec's model.path, or the cached snapshot of model.hub_id at model.revision. Sets
// `name` to what the user knows the model by, and `problem` (in words) when there is none.
QString base_model_folder(const RunRecord& run, QString* name, QString* problem);

// config.json's torch_dtype (or dtype) of a model folder: "bfloat16", "float16", "float32";
// empty when the folder or the field is missing.
QString config_dtype(const QString& model_dir);

}  // namespace tessera::ui
