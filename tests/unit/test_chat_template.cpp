// Chat templates: the Jinja interpreter's errors and semantics, and tokenizer_config.json.
#include <QTest>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "core/error.h"
#include "hf/chat/chat_template.h"
#include "hf/chat/tokenizer_config.h"

using tessera::hf::ChatTemplate;
using tessera::hf::TokenizerConfig;

namespace {

std::string render(const std::string& source,
                   const nlohmann::json& context = nlohmann::json::object()) {
  return ChatTemplate::parse(source, "t.jinja").render(context);
}

// Runs `fn`, expects a tessera::Error, and returns its message.
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const tessera::Error& e) {
    return e.what();
  }
  return "<no error>";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::filesystem::path temp_dir(const char* name) {
  auto dir = std::filesystem::path(TESSERA_TEST_TMP_DIR) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

}  // namespace

class TestChatTemplate : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void syntaxErrorNamesLineAndColumn() {
    std::string msg = error_of([] { ChatTemplate::parse("hello\n  {{ foo( }}", "tmpl.jinja"); });
    QVERIFY2(contains(msg, "tmpl.jinja:2:"), msg.c_str());
    msg = error_of([] { ChatTemplate::parse("{% if x %}\nno end", "tmpl.jinja"); });
    QVERIFY2(contains(msg, "tmpl.jinja:2:") && contains(msg, "endif"), msg.c_str());
    msg = error_of([] { ChatTemplate::parse("ab {{ 'unterminated }}", "tmpl.jinja"); });
    QVERIFY2(contains(msg, "tmpl.jinja:1:7") && contains(msg, "unterminated"), msg.c_str());
    msg = error_of([] { ChatTemplate::parse("{# never closed", "tmpl.jinja"); });
    QVERIFY2(contains(msg, "tmpl.jinja:1:1") && contains(msg, "comment"), msg.c_str());
  }

  void unknownFilterTestAndTagAreErrors() {
    std::string msg = error_of([] { ChatTemplate::parse("x\n{{ a | frobnicate }}", "t.jinja"); });
    QVERIFY2(contains(msg, "t.jinja:2:") && contains(msg, "frobnicate"), msg.c_str());
    msg = error_of([] { ChatTemplate::parse("{% if a is wobbly %}{% endif %}", "t.jinja"); });
    QVERIFY2(contains(msg, "wobbly"), msg.c_str());
    msg = error_of([] { ChatTemplate::parse("{% frob %}", "t.jinja"); });
    QVERIFY2(contains(msg, "frob") && contains(msg, "t.jinja:1:"), msg.c_str());
    msg = error_of([] { ChatTemplate::parse("{% include 'x.jinja' %}", "t.jinja"); });
    QVERIFY2(contains(msg, "include"), msg.c_str());
    // Unknown methods are an error when called, never a silent empty string.
    msg = error_of([] {
      render("{{ messages.append(1) }}", {{"messages", nlohmann::json::array()}});
    });
    QVERIFY2(contains(msg, "append"), msg.c_str());
  }

  void raiseExceptionMessagePropagates() {
    std::string msg = error_of([] {
      render("line one\n{% if true %}{{ raise_exception('Roles must alternate!') }}{% endif %}");
    });
    QVERIFY2(contains(msg, "Roles must alternate!") && contains(msg, "t.jinja:2"), msg.c_str());
  }

  void undefinedBehavesLikeJinja() {
    QCOMPARE(render("[{{ missing }}]{% if missing %}yes{% else %}no{% endif %}"),
             std::string("[]no"));
    QCOMPARE(
        render("{{ d.nothing }}|{{ d['nothing'] is defined }}", {{"d", nlohmann::json::object()}}),
        std::string("|False"));
    std::string msg = error_of([] { render("{{ missing.attr }}"); });
    QVERIFY2(contains(msg, "'missing' is undefined"), msg.c_str());
    msg = error_of([] { render("{{ missing + 1 }}"); });
    QVERIFY2(contains(msg, "undefined"), msg.c_str());
  }

  void scopingOfSetAndNamespace() {
    QCOMPARE(
        render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}"),
        std::string("231"));
    QCOMPARE(render("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}"
                    "{% endfor %}{{ ns.n }}"),
             std::string("6"));
    QCOMPARE(render("{% if true %}{% set y = 'leaks' %}{% endif %}{{ y }}"), std::string("leaks"));
  }

  void loopVariablesAndControls() {
    QCOMPARE(render("{% for x in 'abc' %}{{ loop.index }}{{ loop.revindex0 }}{{ loop.first }}"
                    "{{ loop.last }}{{ loop.length }};{% endfor %}"),
             std::string("12TrueFalse3;21FalseFalse3;30FalseTrue3;"));
    QCOMPARE(render("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.index }}{% else %}none"
                    "{% endfor %}"),
             std::string("2142"));
    QCOMPARE(render("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}"), std::string("empty"));
    QCOMPARE(render("{% for k, v in d | items %}{{ k }}={{ v }},{% endfor %}",
                    {{"d", {{"a", 1}, {"b", 2}}}}),
             std::string("a=1,b=2,"));
    QCOMPARE(render("{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}"
                    "{% if x is odd %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
             std::string("02"));
  }

  void whitespaceControlAsTransformers() {
    // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation
    // before it; `-` strips all whitespace on its side; a trailing newline is dropped.
    QCOMPARE(
        render("{% for x in [1, 2] %}\n    {% if x %}\n{{ x }}\n    {% endif %}\n{% endfor %}\n"),
        std::string("1\n2\n"));
    QCOMPARE(render("a  \n  {{- 'b' -}}  \n c"), std::string("abc"));
    QCOMPARE(render("{% raw %}{{ not parsed }}{% endraw %}"), std::string("{{ not parsed }}"));
    QCOMPARE(render("a{# comment #}b"), std::string("ab"));
  }

  void expressionsFollowPython() {
    QCOMPARE(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 3 / 2 }} {{ 2 ** 10 }} {{ 1.0 }} "
                    "{{ 'ab' * 2 }} {{ 1 ~ 'x' }} {{ none }} {{ [1, 'a'] }} {{ (1, 2) }}"),
             std::string("3 -4 2 1.5 1024 1.0 abab 1x None [1, 'a'] (1, 2)"));
    // Nothing repeated any number of times is nothing, at once (found by fuzz_tokenizer_config:
    // 2**63 - 1 empty appends hung the render).
    QCOMPARE(render("[{{ '' * 9223372036854775807 }}]{{ ([] * 9223372036854775807) | length }}"),
             std::string("[]0"));
    QCOMPARE(
        render("{{ 'hello'[1:] }} {{ [1,2,3][::-1] }} {{ 'héllo'[1] }} {{ 'a\\nb' | length }}"),
        std::string("ello [3, 2, 1] é 3"));
    QCOMPARE(render("{{ 'x' if false }}|{{ 'a' if 1 > 2 else 'b' }}|{{ 2 in [1, 2] }}|"
                    "{{ 'z' not in 'abc' }}"),
             std::string("|b|True|True"));
    QCOMPARE(
        render("{{ '  Hi There  '.strip().lower().split(' ') }} {{ 'ab'.startswith(('x', 'a')) }}"),
        std::string("['hi', 'there'] True"));
    QCOMPARE(render("{{ d | tojson }} {{ d | tojson(indent=2) }}", {{"d", {{"k", {1, "é"}}}}}),
             std::string("{\"k\": [1, \"é\"]} {\n  \"k\": [\n    1,\n    \"é\"\n  ]\n}"));
    QCOMPARE(
        render("{{ xs | selectattr('r', 'equalto', 'u') | map(attribute='c') | join(',') }}",
               {{"xs",
                 {{{"r", "u"}, {"c", "1"}}, {{"r", "a"}, {"c", "2"}}, {{"r", "u"}, {"c", "3"}}}}}),
        std::string("1,3"));
  }

  void macrosAndCallBlocks() {
    QCOMPARE(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                    "{{ greet('A') }} {{ greet('B', punct='?') }}"),
             std::string("Hi A! Hi B?"));
    QCOMPARE(
        render("{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}in{% endcall %}"),
        std::string("[in]"));
    std::string msg = error_of([] { render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"); });
    QVERIFY2(contains(msg, "recursed"), msg.c_str());
  }

  void rendersMessagesWithSpecialTokens() {
    TokenizerConfig config;
    config.bos_token = "<s>";
    config.eos_token = "</s>";
    auto tmpl = ChatTemplate::parse(
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}"
        "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}{{ tools is none }}",
        "t.jinja");
    nlohmann::json messages = {{{"role", "user"}, {"content", "hi"}}};
    QCOMPARE(tmpl.render(messages, true, config), std::string("<s>[user]hi</s>[assistant]True"));
    QCOMPARE(tmpl.render(messages, false, config), std::string("<s>[user]hi</s>True"));
  }

  void tokenizerConfigErrorsNameFileAndField() {
    auto dir = temp_dir("chat_template_config");
    write(dir / "bad.json", "{\"chat_template\": ");
    std::string msg = error_of([&] { tessera::hf::load_tokenizer_config(dir / "bad.json"); });
    QVERIFY2(contains(msg, "bad.json") && contains(msg, "JSON"), msg.c_str());

    write(dir / "type.json", "{\"chat_template\": 42}");
    msg = error_of([&] { tessera::hf::load_tokenizer_config(dir / "type.json"); });
    QVERIFY2(contains(msg, "type.json") && contains(msg, "chat_template"), msg.c_str());

    write(dir / "token.json", "{\"eos_token\": [1]}");
    msg = error_of([&] { tessera::hf::load_tokenizer_config(dir / "token.json"); });
    QVERIFY2(contains(msg, "token.json") && contains(msg, "eos_token"), msg.c_str());

    write(dir / "list.json", "{\"chat_template\": [{\"name\": \"default\"}]}");
    msg = error_of([&] { tessera::hf::load_tokenizer_config(dir / "list.json"); });
    QVERIFY2(contains(msg, "chat_template[0]") && contains(msg, "template"), msg.c_str());

    msg = error_of([&] { tessera::hf::load_tokenizer_config(dir / "absent.json"); });
    QVERIFY2(contains(msg, "absent.json"), msg.c_str());
  }

  void tokenizerConfigFields() {
    auto dir = temp_dir("chat_template_fields");
    write(dir / "tokenizer_config.json",
          R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
              "add_bos_token": true, "model_max_length": 1e30, "tokenizer_class": "LlamaTokenizer",
              "chat_template": [{"name": "tool_use", "template": "T"},
                                {"name": "default", "template": "D"}]})");
    TokenizerConfig config = tessera::hf::load_tokenizer_config(dir / "tokenizer_config.json");
    QCOMPARE(config.bos_token.value_or(""), std::string("<s>"));
    QCOMPARE(config.eos_token.value_or(""), std::string("</s>"));
    QVERIFY(!config.unk_token);
    QCOMPARE(config.add_bos_token.value_or(false), true);
    QVERIFY(!config.add_eos_token);
    QCOMPARE(config.model_max_length, std::int64_t{0});
    QCOMPARE(config.tokenizer_class, std::string("LlamaTokenizer"));
    QCOMPARE(config.chat_template.value_or(""), std::string("D"));

    // chat_template.jinja (newer transformers) wins over the field.
    write(dir / "chat_template.jinja", "{{ 'from jinja file' }}");
    config = tessera::hf::load_tokenizer_config_from_folder(dir);
    QCOMPARE(config.chat_template.value_or(""), std::string("{{ 'from jinja file' }}"));
    QCOMPARE(config.eos_token.value_or(""), std::string("</s>"));
  }

  void pathologicalInputIsAnErrorNotACrash() {
    std::string deep = std::string(5000, '(') + "1" + std::string(5000, ')');
    std::string msg = error_of([&] { ChatTemplate::parse("{{ " + deep + " }}", "t.jinja"); });
    QVERIFY2(contains(msg, "nested too deeply"), msg.c_str());
    std::string ifs;
    for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
    msg = error_of([&] { ChatTemplate::parse(ifs, "t.jinja"); });
    QVERIFY2(contains(msg, "nested too deeply"), msg.c_str());
    nlohmann::json nested = nlohmann::json::array();
    for (int i = 0; i < 1000; ++i) nested = nlohmann::json::array({nested});
    msg = error_of([&] { render("{{ x }}", {{"x", nested}}); });
    QVERIFY2(contains(msg, "nested"), msg.c_str());
    msg = error_of([] { render("{{ range(100000000) | length }}"); });
    QVERIFY2(contains(msg, "range"), msg.c_str());
    msg = error_of([] { render("{{ 9223372036854775807 + 1 }}"); });
    QVERIFY2(contains(msg, "overflow"), msg.c_str());
    msg = error_of([] { render("{{ 1 // 0 }}"); });
    QVERIFY2(contains(msg, "zero"), msg.c_str());
  }

  // Mutated real templates must parse and render or fail with tessera::Error; a crash or
  // any other exception fails the test.
  void fuzzedTemplatesNeverCrash() {
    const std::string seeds[] = {
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nhi<|im_end|>' }}{% endif %}{{ '<|im_start|>' + message['role'] "
        "+ '\\n' + message['content'] | trim + '<|im_end|>' }}{% endfor %}{% if "
        "add_generation_prompt %}{{ '<|im_start|>assistant' }}{% endif %}",
        "{%- set ns = namespace(n=0) -%}{% for m in messages if m.role != 'x' %}{% set ns.n = ns.n "
        "+ 1 %}{{ m | tojson(indent=2) }}{{ m.content[1:-1] ~ loop.index }}{% else %}e{% endfor "
        "%}{% macro f(a, b=2) %}{{ a * b }}{% endmacro %}{{ f(3) }}{# c #}{% raw %}r{% endraw %}",
    };
    const std::string pieces[] = {"{{",   "}}",     "{%",    "%}",     "{#",    "#}", "-",  "(",
                                  ")",    "[",      "]",     "'",      "\"",    ",",  ".",  "|",
                                  " if ", " else ", " for ", "endfor", "endif", "\\", "\n", "x",
                                  "1",    ":",      "=",     "~",      "*",     "/",  "%"};
    nlohmann::json context = {
        {"messages",
         {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "yo"}}}},
        {"add_generation_prompt", true}};
    std::uint64_t state = 0x9e3779b97f4a7c15ULL;
    auto next = [&state]() {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      return state;
    };
    int rendered = 0, rejected = 0;
    for (int iter = 0; iter < 3000; ++iter) {
      std::string t = seeds[iter % 2];
      int edits = 1 + static_cast<int>(next() % 4);
      for (int e = 0; e < edits; ++e) {
        std::size_t at = next() % (t.size() + 1);
        switch (next() % 3) {
          case 0:
            t.insert(at, pieces[next() % std::size(pieces)]);
            break;
          case 1:
            t.erase(at, 1 + next() % 6);
            break;
          default:
            if (at < t.size()) t[at] = static_cast<char>(next() % 128);
        }
      }
      try {
        ChatTemplate::parse(t, "fuzz.jinja").render(context);
        ++rendered;
      } catch (const tessera::Error&) {
        ++rejected;
      }
    }
    QVERIFY(rendered > 0);
    QVERIFY(rejected > 0);
  }

  void namesKnownTemplates() {
    using tessera::hf::chat_template_name;
    QCOMPARE(chat_template_name("{% for m in messages %}{{'<|im_start|>' + m.role}}{% endfor %}"),
             std::string("chatml"));
    QCOMPARE(chat_template_name("{{ '<|start_header_id|>' }}"), std::string("llama3"));
    QCOMPARE(chat_template_name("{{ '[INST] <<SYS>>' }}"), std::string("llama2"));
    QCOMPARE(chat_template_name("{{ '[INST]' }}"), std::string("mistral"));
    QCOMPARE(chat_template_name("{{ '<|user|>' + '<|assistant|>' }}"), std::string("zephyr"));
    QCOMPARE(chat_template_name("{{ messages }}"), std::string("custom"));
    QCOMPARE(chat_template_name("{{ messages "), std::string("invalid"));
  }
};

QTEST_APPLESS_MAIN(TestChatTemplate)
#include "test_chat_template.moc"
