"""Deterministic mixed text for the tokenizer parity tests and the benchmark: English prose,
Python and C++ source (tabs, indentation), CJK, emoji with ZWJ sequences, accented text in
composed and decomposed forms, whitespace runs, CRLF line ends and numbers."""
import random
import unicodedata

WORDS = ("the of and to in is was for on that with as by at from his her they this which or "
         "an be are not have had were but their one all we can there been has more if will "
         "would about into time only new some could these two may first then do any like my "
         "now over such our man me even most made after also did many before must through "
         "years where much your way well down should because each just those people how too "
         "little state good very make world still own see men work long get here between both "
         "life being under never day same another know while last might us great old year off "
         "come since against go came right used take three tokenizer gradient optimizer memory "
         "chunk tensor parallel pipeline checkpoint don't it's we're they've I'm you'll she'd "
         "HTTP JSON GPU CPU NVMe LoRA ZeRO").split()
CJK = ["中文分词测试", "机器学习模型", "東京都の天気は晴れです", "한국어 문장입니다", "大規模言語モデル",
       "我们今天去公园散步。", "日本語のテキスト、句読点も。"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "❤️", "🧑‍💻", "✨", "🤖"]
ACCENTED = ["café", "naïve", "résumé", "Ångström", "crème brûlée", "São Paulo", "Dvořák",
            "façade", "Zürich", "İstanbul", "ΣΟΦΙΑ σοφία", "Москва"]
PYTHON = [
    "def train(model, data, lr=3e-4):\n    for step, batch in enumerate(data):\n"
    "        loss = model(batch).mean()\n        loss.backward()\n"
    "        if step % 10 == 0:\n            print(f\"step {step}: {loss.item():.4f}\")\n",
    "class Config:\n    \"\"\"Settings.\"\"\"\n    hidden_size: int = 768\n    dropout = 0.1  # why\n",
    "x = [i ** 2 for i in range(10) if i != 3]\nassert x[-1] == 81, 'bad'\n",
]
CPP = [
    "template <typename T>\nT clamp(T v, T lo, T hi) {\n\tif (v < lo) return lo;\n"
    "\treturn v > hi ? hi : v;\n}\n",
    "int main(int argc, char** argv) {\r\n\tstd::vector<int> xs{1, 2, 3};\r\n"
    "\tfor (auto& x : xs) x *= 2;  // double\r\n\treturn 0;\r\n}\r\n",
    "namespace tessera {\n\t\tstruct Chunk { std::size_t bytes = 0; };\n}  // namespace tessera\n",
]
WHITESPACE = ["a  b   c    d", "\t\tindented\t", "line one\nline two\n\nline four", "   ",
              "trailing   ", "\r\n\r\n", " leading", "x \n y", "tabs\tand  spaces \t mixed"]


def sentence(rng):
    n = rng.randint(4, 18)
    words = [rng.choice(WORDS) for _ in range(n)]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), str(rng.randint(0, 100000)))
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words)), rng.choice(ACCENTED))
    if rng.random() < 0.1:
        words.insert(rng.randrange(len(words)), rng.choice(EMOJI))
    s = " ".join(words)
    return s[0].upper() + s[1:] + rng.choice([".", "!", "?", ",", ";", "..."])


def sample(rng):
    r = rng.random()
    if r < 0.45:
        return " ".join(sentence(rng) for _ in range(rng.randint(1, 3)))
    if r < 0.55:
        return rng.choice(PYTHON)
    if r < 0.65:
        return rng.choice(CPP)
    if r < 0.72:
        return rng.choice(CJK) + rng.choice(["", " ", "。"]) + rng.choice(CJK)
    if r < 0.78:
        return " ".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 5))) + " " + sentence(rng)
    if r < 0.86:
        word = rng.choice(ACCENTED)
        form = rng.choice(["NFC", "NFD"])
        return unicodedata.normalize(form, f"{word} {sentence(rng)} {word.upper()}")
    if r < 0.94:
        return rng.choice(WHITESPACE)
    return f"{rng.randint(0, 10**9)} + {rng.random():.6f} = ? 3.14159 1,000,000 2026-11-21"


def corpus(n, seed=1234):
    rng = random.Random(seed)
    return [sample(rng) for _ in range(n)]


def training_lines(seed=99):
    """Training text: the corpus plus every fixed fragment, so rare pieces exist in the vocab."""
    lines = corpus(4000, seed)
    lines += PYTHON + CPP + CJK + EMOJI + ACCENTED + WHITESPACE
    return lines


def edge_cases():
    return [
        "", " ", "Hello world", "Hello, world! How's it going? I'm fine; we'll see.",
        "  leading and trailing  ", "\n\n\n", "\r\n", "a\r\nb\r\n", "\t", "tab\tseparated\tvalues",
        "UPPER lower MiXeD", "don't won't can't shouldn't", "numbers 1234567890 12 3.5e-7",
        "café café", unicodedata.normalize("NFD", "café résumé naïve"), "İstanbul ΣΟΦΙΑ",
        "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 thumbs", "中文 and English 混合", "東京都",
        "x" * 300, "supercalifragilisticexpialidocious" * 4, "\u00a0non-breaking\u2003em space",
        "zero\u200bwidth", "control\u0007char", "snake_case_name camelCaseName",
        "    def f():\n        return 1\n", "\tint x = 0;\n\t\treturn x;\n",
        "a" + " " * 40 + "b", "punctuation!!! ??? ... ---- ____ ((()))",
        "vertical\x0btab form\x0cfeed next\x85line", "unassigned\u0378here private\ue000use",
        "soft\u00adhyphen bom\ufeffmark",
    ]
