# Warnings as errors in our own targets only (third-party headers come in as SYSTEM).
# TESSERA_WERROR=OFF keeps them warnings: tests/gpu/run.sh builds on a machine whose newer
# compiler may warn where ours does not, and a GPU check must not end on a new warning.
option(TESSERA_WERROR "Treat warnings in our code as errors" ON)
function(tessera_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter>)
  if(TESSERA_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  # GCC's flow analysis under -fsanitize=address reports std::regex's own moves as maybe
  # uninitialized (libstdc++ 12's regex_automaton.h); the same code builds clean without it.
  if(TESSERA_SANITIZE AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-maybe-uninitialized>)
  endif()
  # In a unity build a source's own types in its anonymous namespace look to GCC like a header's
  # (the batch file is the main file), so members of those types would be reported.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>)
  endif()
  # Qt's `slots` macro collides with torch's IValue::slots(); see shared/LIBTORCH.md.
  target_compile_definitions(${target} PRIVATE QT_NO_KEYWORDS)
endfunction()
