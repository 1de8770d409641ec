# Token-id parity with HuggingFace tokenizers/transformers on test-time tokenizers.
add_executable(tessera-tok-tool tools/tokenizer_tool.cpp)
target_link_libraries(tessera-tok-tool PRIVATE tessera_hf)
tessera_warnings(tessera-tok-tool)

tessera_add_pytest(NAME parity_tokenizer FILE parity/test_tokenizer.py LABELS parity TIMEOUT 900)
