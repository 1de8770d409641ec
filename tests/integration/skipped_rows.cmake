# dataset.skip_bad_rows: the run logs the rows it skipped per place (unreadable, training share,
# validation share, validation files), checked against rows planted where the split puts them.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_skipped_rows FILE integration/test_skipped_rows.py
                     LABELS integration TIMEOUT 300)
endif()
