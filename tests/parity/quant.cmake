# Test-only front end to engine/quant, driven by parity/test_quant_parity.py against bitsandbytes.
add_executable(tessera-quant-tool tools/quant_tool.cpp)
target_link_libraries(tessera-quant-tool PRIVATE tessera_quant tessera_hf)
tessera_warnings(tessera-quant-tool)

tessera_add_pytest(NAME parity_quant FILE parity/test_quant_parity.py LABELS parity TIMEOUT 300)
set_property(TEST parity_quant APPEND PROPERTY DEPENDS tessera-quant-tool)

# QLoRA training (engine/model/quantized_linear) against peft on a bitsandbytes base.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME parity_qlora FILE parity/test_qlora_parity.py LABELS parity TIMEOUT 600)
  set_property(TEST parity_qlora APPEND PROPERTY DEPENDS tessera-train-probe)
endif()
