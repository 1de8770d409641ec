# Datasets against Python oracles: pyarrow (Parquet rows), csv (quoting), transformers
# (chat rendering and the assistant mask), and the documented shuffle reimplemented.
add_executable(tessera-data-tool tools/data_tool.cpp)
target_link_libraries(tessera-data-tool PRIVATE tessera_data)
tessera_warnings(tessera-data-tool)

tessera_add_pytest(NAME parity_data FILE parity/test_data.py LABELS parity TIMEOUT 600)
