"""Chat-template parity: tessera's Jinja interpreter against transformers'
apply_chat_template(tokenize=False) and against plain jinja2.

The templates below are written from the model families' tokenizer_config.json files;
the tokenizers are built at test time (no hub).
"""

import json
import os
import subprocess
from pathlib import Path

import jinja2
import jinja2.ext
import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

TOOLS_DIR = Path(os.environ.get("TESSERA_TOOLS_DIR", Path(__file__).resolve().parents[2] / "build-chat" / "tests"))
TOOL = TOOLS_DIR / "tessera-chat-tool"

# ---- official templates (as fixtures) ------------------------------------------------

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

QWEN2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

QWEN25 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

LLAMA31 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

MISTRAL_V01 = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

MISTRAL_V03 = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

# Llama 3.2 style: the date comes from strftime_now when date_string is not given.
STRFTIME = (
    "{{- bos_token }}{%- if not date_string is defined %}{%- if strftime_now is defined %}"
    "{%- set date_string = strftime_now('%d %b %Y') %}{%- else %}{%- set date_string = '26 Jul 2024' %}"
    "{%- endif %}{%- endif %}{{ 'Today Date: ' + date_string + '\n\n' }}"
    "{% for message in messages %}{{ message.role | capitalize }}: {{ message.content }}\n{% endfor %}"
)

# Prints what a reasoning-aware template sees of each message.
REASONING = "{% for m in messages %}{{ m | tojson }}|{{ m.reasoning_content }}|{{ m.thinking }}\n{% endfor %}"

TEMPLATES = {
    "reasoning": (REASONING, {"eos_token": "</s>"}),
    "strftime": (STRFTIME, {"bos_token": "<s>", "eos_token": "</s>"}),
    "chatml": (CHATML, {"eos_token": "<|im_end|>"}),
    "qwen2": (QWEN2, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "qwen2.5": (QWEN25, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "llama2": (LLAMA2, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    "llama3": (LLAMA3, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    "llama3.1": (LLAMA31, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    "mistral-v0.1": (MISTRAL_V01, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    "mistral-v0.3": (MISTRAL_V03, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    "zephyr": (ZEPHYR, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    "gemma": (GEMMA, {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}),
}

SPECIAL = "Quotes ' \" back\\slash {{ not_a_var }} {% raw %} <b>&amp;</b>\n\tTabbed  \n  héllo 世界 🎉  "

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi_turn": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "system_multi_turn": [
        {"role": "system", "content": "  Be kind.  "},
        {"role": "user", "content": "One"},
        {"role": "assistant", "content": " Two "},
        {"role": "user", "content": "Three"},
        {"role": "assistant", "content": "Four"},
    ],
    "special_chars": [
        {"role": "user", "content": SPECIAL},
        {"role": "assistant", "content": "multi\nline\n\nanswer\n"},
        {"role": "user", "content": ""},
    ],
    "not_alternating": [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
    ],
    "starts_with_assistant": [
        {"role": "assistant", "content": "I speak first"},
        {"role": "user", "content": "ok"},
    ],
    "reasoning": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "add them"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "thinking": "own thinking", "content": "6", "reasoning": "alias"},
    ],
    "null_field": [
        {"role": "user", "content": "hi", "name": None},
    ],
}

# ---- helpers ---------------------------------------------------------------------------

_tokenizers = {}


def hf_tokenizer(name):
    if name not in _tokenizers:
        template, tokens = TEMPLATES[name]
        vocab = {tok: i for i, tok in enumerate(sorted(set(tokens.values()) | {"<unk>"}))}
        backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tok = PreTrainedTokenizerFast(tokenizer_object=backend, **tokens)
        tok.chat_template = template
        _tokenizers[name] = tok
    return _tokenizers[name]


def transformers_render(name, messages, add_generation_prompt, **kwargs):
    try:
        return True, hf_tokenizer(name).apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )
    except Exception as e:  # noqa: BLE001 - any raise is an expected outcome to compare
        return False, str(e)


def tessera_render(tmp_path, name, messages, add_generation_prompt, variables=None):
    template, tokens = TEMPLATES[name]
    config = {"chat_template": template, "tokenizer_class": "PreTrainedTokenizerFast"}
    # Special tokens as AddedToken dicts for one of them, as real files often have.
    for key, value in tokens.items():
        config[key] = {"content": value, "lstrip": False, "special": True} if key == "bos_token" else value
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "messages.json").write_text(json.dumps(messages, ensure_ascii=False), encoding="utf-8")
    args = [str(TOOL), str(tmp_path / "tokenizer_config.json"), str(tmp_path / "messages.json")]
    if add_generation_prompt:
        args.append("--add-generation-prompt")
    if variables is not None:
        (tmp_path / "vars.json").write_text(json.dumps(variables, ensure_ascii=False), encoding="utf-8")
        args += ["--vars", str(tmp_path / "vars.json")]
    proc = subprocess.run(args, capture_output=True)
    if proc.returncode == 0:
        return True, proc.stdout.decode("utf-8")
    assert proc.returncode == 2, proc.stderr.decode("utf-8", "replace")
    return False, proc.stderr.decode("utf-8")


def check_same(tmp_path, name, messages, add_generation_prompt, **kwargs):
    ok_hf, out_hf = transformers_render(name, messages, add_generation_prompt, **kwargs)
    ok_us, out_us = tessera_render(tmp_path, name, messages, add_generation_prompt, kwargs or None)
    if ok_hf:
        assert ok_us, f"transformers rendered, tessera failed: {out_us}"
        assert out_us == out_hf
    else:
        assert not ok_us, f"transformers raised {out_hf!r}, tessera rendered {out_us!r}"
        assert out_hf in out_us, f"tessera's error does not carry the template's message: {out_us}"
    return ok_hf


@pytest.fixture(scope="module", autouse=True)
def tool_exists():
    if not TOOL.exists():
        pytest.fail(f"{TOOL} is missing: build the tessera-chat-tool target first")


# ---- official templates against transformers ----------------------------------------------


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_official_template_matches_transformers(tmp_path, name, conversation, add_generation_prompt):
    check_same(tmp_path, name, CONVERSATIONS[conversation], add_generation_prompt)


def test_alternation_errors_raise_in_both(tmp_path):
    for name in ["llama2", "mistral-v0.1", "mistral-v0.3", "gemma"]:
        assert not check_same(tmp_path, name, CONVERSATIONS["not_alternating"], False), name


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

TOOL_CONVERSATION = [
    {"role": "system", "content": "Use tools when helpful."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "tool_calls": [
            {"id": "abcDEF123", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
        ],
    },
    {"role": "tool", "tool_call_id": "abcDEF123", "content": "22 degrees"},
    {"role": "assistant", "content": "It is 22 °C in Paris."},
    {"role": "user", "content": "Thanks"},
]


@pytest.mark.parametrize("name", ["qwen2.5", "llama3.1", "mistral-v0.3"])
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_tool_use_matches_transformers(tmp_path, name, add_generation_prompt):
    assert check_same(tmp_path, name, TOOL_CONVERSATION, add_generation_prompt, tools=[WEATHER_TOOL])


def test_llama31_date_and_builtin_tools(tmp_path):
    assert check_same(tmp_path, "llama3.1", CONVERSATIONS["system_user"], True, date_string="01 Jan 2026")
    assert check_same(
        tmp_path, "llama3.1", CONVERSATIONS["user"], True,
        builtin_tools=["code_interpreter", "brave_search"], tools_in_user_message=False, tools=[WEATHER_TOOL],
    )


# ---- other constructs against plain jinja2 ------------------------------------------------


def jinja2_render(template, context):
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(**context)


def tessera_raw(tmp_path, template, context):
    (tmp_path / "t.jinja").write_text(template, encoding="utf-8")
    (tmp_path / "ctx.json").write_text(json.dumps(context, ensure_ascii=False), encoding="utf-8")
    proc = subprocess.run([str(TOOL), "--raw", str(tmp_path / "t.jinja"), str(tmp_path / "ctx.json")], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")
    return proc.stdout.decode("utf-8")


CONTEXT = {
    "messages": CONVERSATIONS["system_multi_turn"] + CONVERSATIONS["special_chars"],
    "user": {"name": "Ada Lovelace", "tags": ["b", "A", "c", "a"], "score": 7, "ratio": 0.25},
    "numbers": [3, 1, 2, 10, -4],
    "words": ["pear", "Apple", "fig", "apple"],
    "nested": {"k1": {"inner": [1, {"x": None}]}, "k0": True},
}

EXTRA_TEMPLATES = {
    "loops": """{% for m in messages %}
  {{ loop.index }}/{{ loop.length }} {{ loop.index0 }} {{ loop.revindex }} {{ loop.revindex0 }} {{ loop.first }} {{ loop.last }}
  {%- if loop.previtem is defined %} prev={{ loop.previtem.role }}{% endif %}
  {%- if loop.nextitem is defined %} next={{ loop.nextitem.role }}{% endif %} {{ loop.cycle('odd', 'even') }}
{% endfor %}
{% for m in messages if m.role == 'user' %}{{ loop.index }}:{{ m.content[:5] | trim }};{% else %}none{% endfor %}
{% for k, v in nested.items() %}{{ k }}={{ v }}
{% endfor %}
{% for x in [] %}never{% else %}empty-else{% endfor %}
{% for i in range(10) %}{% if i is divisibleby 3 %}{% continue %}{% endif %}{% if i > 7 %}{% break %}{% endif %}{{ i }}{% endfor %}
{% for a, b in [[1, 2], [3, 4]] %}{{ a * b }},{% endfor %}""",
    "namespace_and_scoping": """{% set ns = namespace(found=false, count=0, last='') %}
{% set plain = 'outer' %}
{% for m in messages %}
    {% set plain = 'inner' %}
    {% if m.role == 'assistant' %}{% set ns.found = true %}{% set ns.count = ns.count + 1 %}{% set ns.last = m.content %}{% endif %}
{% endfor %}
found={{ ns.found }} count={{ ns.count }} last={{ ns.last | trim }} plain={{ plain }}
{% with a = 1, b = 'two' %}{{ a }}{{ b }}{% endwith %}{{ a is defined }}
{% set captured | upper %}block {{ user.name }}{% endset %}{{ captured }}
{% filter title %}a filtered block{% endfilter %}""",
    "filters": """{{ user.name | upper }} {{ user.name | lower }} {{ 'hello WORLD-wide (x)' | title }} {{ 'élan vital' | capitalize }}
{{ user.tags | sort | join('') }} {{ user.tags | sort(case_sensitive=true) | join('') }} {{ user.tags | unique | list }} {{ words | unique | list }}
{{ numbers | sort(reverse=true) }} {{ numbers | max }} {{ numbers | min }} {{ numbers | sum }} {{ numbers | first }} {{ numbers | last }} {{ numbers | length }} {{ numbers | reverse | list }}
{{ messages | map(attribute='role') | unique | join(',') }} {{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages | rejectattr('role', 'in', ['user', 'system']) | map(attribute='content') | list }}
{{ numbers | select('odd') | list }} {{ numbers | reject('odd') | list }} {{ [1, 0, '', 'x'] | select | list }} {{ ['1', '2'] | map('int') | sum }}
{{ missing | default('dflt') }} {{ '' | default('empty', true) }} {{ none | d('n') }} {{ user.score | string ~ '!' }} {{ '42' | int + 1 }} {{ 'x' | int(5) }} {{ '2.5' | float }} {{ 3 | float }}
{{ 2.5 | round }} {{ 3.14159 | round(2) }} {{ 2.7 | round(0, 'floor') }} {{ -3 | abs }} {{ 'a b  c' | wordcount }}
{{ user | tojson }} {{ nested | tojson(indent=2) }} {{ words | tojson(sort_keys=true) }} {{ {'é': 'ü'} | tojson }} {{ {'b': 1, 'a': [1.5, 1e20]} | tojson(separators=(',', ':'), sort_keys=true) }}
{{ user | items | list }} {{ 'a-b-c' | replace('-', '+') }} {{ 'a-b-c' | replace('-', '', 1) }} {{ 'line1\nline2' | indent(2) }} {{ '<&>' | e }} {{ 'x' | safe }} {{ 'abc' | list }}
{{ nested | dictsort }} {{ '  padded  ' | trim }}|{{ 'xxhixx' | trim('x') }}""",
    "expressions": """{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 8 }} {{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e-7 }} {{ 1e16 }} {{ 123456789.0 }}
{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ [1, 2] * 2 }}
{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ none == none }} {{ 'x' != 'y' }}
{{ 'ell' in 'hello' }} {{ 3 not in numbers }} {{ 'k0' in nested }} {{ not true }} {{ true and 'yes' }} {{ false or 'fallback' }} {{ none or 0 or '' }}
{{ 'yes' if user.score > 5 else 'no' }} {{ 'a' if false }}|{{ user['name'] }} {{ user.tags[1] }} {{ user.tags[-1] }} {{ user.tags[1:3] }} {{ user.tags[::-1] }} {{ user.tags[::2] }} {{ 'héllo wörld'[1:4] }} {{ 'abc'[-1] }}
{{ user.missing }}|{{ user['missing'] is undefined }} {{ user.tags[99] is defined }} {{ nested.k1.inner[1].x is none }} {{ {'a': 1}.get('a') }} {{ {'a': 1}.get('b', 'z') }} {{ {'a': 1}.keys() | list }} {{ {'a': 1}.values() | list }}
{{ 'x' is string }} {{ 1 is number }} {{ 1.5 is float }} {{ 2 is integer }} {{ {} is mapping }} {{ [] is sequence }} {{ 'x' is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ true is true }} {{ false is false }} {{ none is none }} {{ 5 is ge 5 }} {{ 'A' is upper }} {{ 1 is in [1] }} {{ 'x' is eq 'x' }} {{ 1 is sameas 1 }}
{{ '  Strip Me  '.strip() }}|{{ '--x--'.lstrip('-') }}|{{ '--x--'.rstrip('-') }}|{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'Hi'.upper() }}{{ 'Hi'.lower() }} {{ 'hello world'.title() }} {{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'aXbX'.replace('X', '-') }} {{ 'straße'.upper() }} {{ ', '.join(['a', 'b']) }}
{{ [1, 'two', 3.0, none, true, {'k': [1]}] }} {{ (1,) }} {{ {'a': 'b\\'c'} }} {{ "it's" }} {{ 'tab\\there' }} {{ '\\u00e9\\x41\\101' }} {{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ dict(a=1, b=2) }}""",
    "macros_and_whitespace": """{% macro render_message(m, prefix='>') -%}
    {{ prefix }} [{{ m.role | upper }}] {{ m.content | trim }}
{%- endmacro %}
{% macro box(title) %}<{{ title }}>{{ caller() }}</{{ title }}>{% endmacro %}
{% for m in messages[:3] %}
    {{ render_message(m) }}
    {{ render_message(m, prefix='*') }}
{% endfor %}
{% call box('b') %}inside {{ user.name }}{% endcall %}
  {#- comment that strips left -#}
  text   {{- ' tight ' -}}   more
    {% if true %}
        indented line
    {% endif %}
{%+ if true %}kept indent{% endif +%}
{% raw %}{{ raw stays }}{% if x %}{% endraw %}
line with trailing block {% if true %}x{% endif %}
end""",
    "unicode_and_escapes": """{{ 'ÀÉÎõü straße ǅ' | upper }} {{ 'ÀÉÎÕÜ İ' | lower }} {{ 'ñandú ÉCOLE' | title }} {{ 'ü' ~ 'é' | length }}
{{ 'héllo'[::-1] }} {{ '日本語テキスト' | length }} {{ '日本語'[1] }} {{ '  \u3000x\u3000 ' | trim }}|{{ 'a\tb\nc' | tojson }} {{ '\u2028 \x7f \x01' | tojson }} {{ '🎉' | tojson(ensure_ascii=true) }}
{{ messages[4].content | tojson }} {{ messages[4].content | tojson(ensure_ascii=true) }}""",
    "raise": """{% if messages | length > 100 %}{{ raise_exception('too many') }}{% endif %}ok""",
}


@pytest.mark.parametrize("name", sorted(EXTRA_TEMPLATES))
def test_extra_templates_match_jinja2(tmp_path, name):
    template = EXTRA_TEMPLATES[name]
    assert tessera_raw(tmp_path, template, CONTEXT) == jinja2_render(template, CONTEXT)


def test_template_trailing_newline_and_crlf(tmp_path):
    for template in ["a\n", "a\n\n", "x\r\ny\r\n{% if true %}\r\nz\r\n{% endif %}\r\n", "{{ 'q' }}\n"]:
        assert tessera_raw(tmp_path, template, {}) == jinja2_render(template, {})


def test_syntax_error_reports_line(tmp_path):
    (tmp_path / "t.jinja").write_text("ok\n{% for x in %}\n", encoding="utf-8")
    (tmp_path / "ctx.json").write_text("{}", encoding="utf-8")
    proc = subprocess.run([str(TOOL), "--raw", str(tmp_path / "t.jinja"), str(tmp_path / "ctx.json")], capture_output=True)
    assert proc.returncode == 2
    assert "t.jinja:2:" in proc.stderr.decode()


def test_names_of_known_templates(tmp_path):
    expected = {"chatml": "chatml", "qwen2": "chatml", "qwen2.5": "chatml", "llama2": "llama2", "llama3": "llama3",
                "llama3.1": "llama3", "mistral-v0.1": "mistral", "mistral-v0.3": "mistral", "zephyr": "zephyr",
                "gemma": "gemma", "strftime": "custom",
                "reasoning": "custom"}
    for name, (template, _) in TEMPLATES.items():
        (tmp_path / "t.jinja").write_text(template, encoding="utf-8")
        proc = subprocess.run([str(TOOL), "--name", str(tmp_path / "t.jinja")], capture_output=True, check=True)
        assert proc.stdout.decode().strip() == expected[name], name
