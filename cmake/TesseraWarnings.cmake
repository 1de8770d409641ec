# Warnings as errors in our own targets only (third-party headers come in as SYSTEM).
function(tessera_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror -Wno-unused-parameter>)
  # Qt's `slots` macro collides with torch's IValue::slots(); see shared/LIBTORCH.md.
  target_compile_definitions(${target} PRIVATE QT_NO_KEYWORDS)
endfunction()
