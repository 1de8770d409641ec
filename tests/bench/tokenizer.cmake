# Tokenizer throughput ours ÷ HuggingFace tokenizers (one thread each), label bench.
# Uses tessera-tok-tool, declared in parity/tokenizer.cmake.
add_test(NAME bench_tokenizer
         COMMAND ${TESSERA_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_tokenizer.py)
set_tests_properties(bench_tokenizer PROPERTIES LABELS bench TIMEOUT 1800 RUN_SERIAL TRUE
  ENVIRONMENT "TESSERA_TOOLS_DIR=${CMAKE_CURRENT_BINARY_DIR};RAYON_NUM_THREADS=1;TOKENIZERS_PARALLELISM=false;HF_HUB_OFFLINE=1")
