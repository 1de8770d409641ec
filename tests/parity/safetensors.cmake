# Test-only front end to the safetensors reader/writer, driven by parity/test_safetensors.py.
add_executable(tessera-st-tool tools/safetensors_tool.cpp)
target_link_libraries(tessera-st-tool PRIVATE tessera_hf Qt6::Core)
tessera_warnings(tessera-st-tool)

tessera_add_pytest(NAME parity_safetensors FILE parity/test_safetensors.py LABELS parity
                   TIMEOUT 600)
