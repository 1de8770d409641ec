# Pipeline parallelism's arithmetic (engine/parallel/pipeline_schedule.h): stage balancing, the
# 1F1B order and its bubble. The parallel layers themselves run on several ranks in
# tests/integration (test_tensor_parallel.py, test_hybrid.py).
if(TESSERA_WITH_TORCH)
  tessera_add_qt_test(NAME test_parallel SOURCES unit/test_parallel.cpp LIBS tessera_parallel
                      LABELS unit)
endif()
