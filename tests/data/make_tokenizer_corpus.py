"""Writes tokenizer_corpus.json: the texts whose llama.cpp token ids are checked in
(see make_tokenizer_expected.py). Run once; the output is committed."""
import json
from pathlib import Path

PROSE = [
    "The capital of France is Paris. It has been the country's capital since the 10th century, "
    "apart from a few short interruptions, and today it is home to about 2.1 million people.",
    "In 1969, Neil Armstrong and Buzz Aldrin became the first humans to walk on the Moon; "
    "Michael Collins stayed in lunar orbit aboard the command module Columbia.",
    "Photosynthesis converts light energy into chemical energy: 6CO2 + 6H2O -> C6H12O6 + 6O2. "
    "Chlorophyll absorbs mostly blue (~450 nm) and red (~680 nm) light.",
    "\"Don't count your chickens before they're hatched,\" she said -- but he'd already ordered "
    "the champagne, and we'll never know what they'd have done otherwise!",
    "Prices rose 3.75% year-over-year; the index closed at 4,512.33 (up +0.8%) on 2024-03-15, "
    "while USD/EUR traded near 0.9213 and BTC hovered around $67,000.",
    "Visit https://example.com/path?query=a+b&lang=en#section-2 or email info@example.org.",
]
MULTILINGUAL = [
    "Der schnelle braune Fuchs springt über den faulen Hund. Größe, Maß, Straße – ÄÖÜ äöü ß.",
    "Le cœur a ses raisons que la raison ne connaît point. L'été à Noël? Ça dépend, garçon!",
    "El niño comió paella en la playa; ¿quién sabe por qué? ¡Olé!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "北京是中华人民共和国的首都，也是全国的政治、文化中心。今天天气很好，我们去公园散步吧。",
    "東京は日本の首都です。ひらがな、カタカナ、漢字を混ぜて書きます。ラーメンが大好き！",
    "서울은 대한민국의 수도입니다. 한국어는 한글로 씁니다.",
    "مرحبا بالعالم! اللغة العربية تكتب من اليمين إلى اليسار.",
    "नमस्ते दुनिया। हिंदी देवनागरी लिपि में लिखी जाती है।",
    "Ελληνικά: Γειά σου Κόσμε! Τὸ φῶς τοῦ ἡλίου.",
    "Tiếng Việt có dấu: Xin chào thế giới, người Việt Nam.",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ สวัสดีครับ",
]
EMOJI = [
    "I love pizza 🍕🍕 and cats 😺! Family: 👨‍👩‍👧‍👦, flags: 🇫🇷🇯🇵🇧🇷, skin tones: 👍🏽👋🏿.",
    "Rocket 🚀 to the moon 🌕 ... ✨✨✨ ❤️ ☕ ⚡️ 🫠 🧑🏻‍💻",
    "Rare scripts and symbols: 𓀀𓁐𓃰 𐌰𐌱𐌲 ∮ E⋅da = Q, n → ∞, ∑ f(i) = ∏ g(i), ℝ ⊂ ℂ, ☃ \ue000\U0010fffd",
]
CODE = [
    "def fibonacci(n: int) -> list[int]:\n    \"\"\"Return the first n Fibonacci numbers.\"\"\"\n"
    "    seq = [0, 1]\n    while len(seq) < n:\n        seq.append(seq[-1] + seq[-2])\n"
    "    return seq[:n]\n\n\nif __name__ == \"__main__\":\n    print(fibonacci(10))\n",
    "#include <stdio.h>\n\nint main(void) {\n\tfor (int i = 0; i < 10; i++) {\n\t\tprintf(\"%d\\n\", i * i);\n"
    "\t}\n\treturn 0;\n}\n",
    "{\"name\": \"gemma4cpu\", \"version\": \"0.1.0\", \"tags\": [\"llm\", \"cpu\"], \"nested\": {\"a\": null, \"b\": 1.5e-3}}",
    "<html>\n  <body>\n    <table><tr><td>cell</td><th>head</th></tr></table>\n    <b>bold</b> <i>it</i> "
    "<code>x = 1</code> <a href=\"#\">link</a>\n  </body>\n</html>\n",
    "SELECT u.id, COUNT(*) AS n\nFROM users u\n  JOIN orders o ON o.user_id = u.id\nWHERE o.created_at >= '2024-01-01'\n"
    "GROUP BY u.id\nHAVING COUNT(*) > 5\nORDER BY n DESC;",
    "fn main() {\n    let v: Vec<u32> = (1..=5).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "# Title\n\n## Subtitle\n\n- item one\n- item **two**\n  - nested `code`\n\n> quote\n\n| a | b |\n|---|---|\n| 1 | 2 |\n",
]
WHITESPACE = [
    "", " ", "  ", "   ", "a", " a", "a ", " a ", "\n", "\n\n", "\n\n\n\n\n", "\t", "\t\t\t",
    "word" + " " * 31 + "word", "word" + " " * 32 + "word", "word" + " " * 40 + "word", " " * 70,
    "x\n \n  \n   \ny", "tabs\tand  spaces \t mixed\t \t end", "trailing spaces   \n   leading spaces",
    "\r\nwindows\r\nline\r\nendings\r\n", "many\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\nnewlines",
    "\u00a0non-breaking\u00a0space and\u3000ideographic space", "zero\u200bwidth\u200djoiner",
    "combining: e\u0301 a\u0308 n\u0303 vs é ä ñ",
]
SPECIAL = [
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after a literal bos<eos>",
    "<|turn>user\nHello<turn|>\n<|turn>model\n",
    "look: </s> and <s> and <unk> and <pad> and <mask> and [multimodal] and <unused5>",
    "<start_of_image><end_of_image> <|channel>thought<channel|> <|tool_call>call<tool_call|> <|tool_response>",
    "half-tags: <start_of_turn <end_of_turn> >< <<bos>> <0x41> \u2581 \u2581\u2581 literal",
    "<b><b>nested</b></b><strong><em>x</em></strong><table><tbody></tbody></table>",
]


def main():
    texts = PROSE + MULTILINGUAL + EMOJI + CODE + WHITESPACE + SPECIAL
    texts.append("\n\n".join(PROSE + MULTILINGUAL + CODE[:3]))   # one long mixed document
    out = Path(__file__).with_name("tokenizer_corpus.json")
    out.write_text(json.dumps(texts, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"wrote {len(texts)} texts to {out}")


if __name__ == "__main__":
    main()
