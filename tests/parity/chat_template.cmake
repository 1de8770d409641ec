# Chat templates: our Jinja interpreter against transformers' apply_chat_template and jinja2.
add_executable(tessera-chat-tool tools/chat_template_tool.cpp)
target_link_libraries(tessera-chat-tool PRIVATE tessera_hf)
tessera_warnings(tessera-chat-tool)
set_target_properties(tessera-chat-tool PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})

tessera_add_pytest(NAME parity_chat_template FILE parity/test_chat_template.py LABELS parity
                   TIMEOUT 600)
